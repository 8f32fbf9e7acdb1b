"""What each finished image reports: its timings, and the settings written into its PNG."""

from __future__ import annotations

from typing import Any

from tpu_demo.core.request import GenerationRequest
from tpu_demo.core.upsampling import DrawnPrompt


def image_timings(started: float, denoise_end: float | None, finished: float, steps: int,
                  compiles: int) -> dict[str, float]:
    """Seconds from the call's start to its last denoising step, and from there to the decoded image."""
    denoise_end = denoise_end or finished
    return {
        "total_seconds": round(finished - started, 4),
        "denoise_seconds": round(denoise_end - started, 4),
        "decode_seconds": round(finished - denoise_end, 4),
        "steps_per_second": round(steps / max(denoise_end - started, 1e-9), 2),
        "compiles": compiles,
    }


def image_parameters(request: GenerationRequest, seed: int, mode_description: str, device: str, scheduler: str,
                     timings: dict[str, float], warm: bool, drawn: DrawnPrompt | None = None) -> dict[str, Any]:
    """One image's settings (enough to make it again) plus how it was made: ``prompt`` is what was typed,
    ``drawn_prompt`` what the pipeline was given when the upsampler rewrote it (``drawn_marked``: the
    same with what the seed chose in [brackets])."""
    parameters = {**request.as_dict(), "seed": seed, "resolution": request.resolution, "num_images": 1,
                  "mode_description": mode_description, "device": device, "scheduler": scheduler,
                  "timings": timings, "warm": warm}
    parameters.pop("width"), parameters.pop("height")
    if drawn is not None:
        parameters.update(drawn_prompt=drawn.text, drawn_marked=drawn.marked, seed_chose=list(drawn.seed_chose))
    return parameters
