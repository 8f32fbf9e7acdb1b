"""Operator logs: one JSON line per request on the ``tpu_demo.requests`` logger.

Fields: id (Gradio's event id), model, mode, bucket, steps, images asked and finished, queue
wait, compile / denoise / decode seconds, outcome (ok, stopped, disconnected, timeout, shutdown,
failed, invalid; the admission middleware logs "busy") and, for failures, the user-facing error.
Prompts are left out unless the operator passes ``--log-prompts``: they are the users' words.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from tpu_demo.core.events import Compiling, ImageResult, StepProgress
from tpu_demo.core.request import GenerationRequest

log = logging.getLogger("tpu_demo.requests")


@dataclass
class RequestRecord:
    """What one request did, filled from engine events as they pass; ``emit`` writes the line."""

    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    request: GenerationRequest | None = None
    queue_wait_seconds: float | None = None
    images_done: int = 0
    compile_seconds: float = 0.0
    denoise_seconds: float = 0.0
    decode_seconds: float = 0.0
    outcome: str = "ok"
    error: str | None = None
    #: when the handler began (perf_counter), and the stages before and after it (seconds)
    started: float = field(default_factory=time.perf_counter)
    admission_seconds: float = 0.0
    encode_seconds: float = 0.0
    last_image_at: float | None = None
    _compiling_image: int | None = None
    _compile_by_image: dict[int, float] = field(default_factory=dict)

    def observe(self, event: Any) -> None:
        if isinstance(event, Compiling):
            self._compiling_image = self.images_done
        elif isinstance(event, StepProgress) and event.step == 1 and self._compiling_image == event.index:
            # a cold bucket's first step includes its compile: count it as compile time
            self._compile_by_image[event.index] = event.elapsed_seconds
            self.compile_seconds += event.elapsed_seconds
            self._compiling_image = None
        elif isinstance(event, ImageResult):
            self.images_done += 1
            self.last_image_at = time.perf_counter()
            compile_part = self._compile_by_image.get(event.index, 0.0)
            self.denoise_seconds += max(event.timings["denoise_seconds"] - compile_part, 0.0)
            self.decode_seconds += event.timings["decode_seconds"]

    def as_dict(self, log_prompt: bool = False) -> dict[str, Any]:
        request = self.request
        line: dict[str, Any] = {"event": "request", "id": self.request_id}
        if request is not None:
            line.update(model=request.model, mode=request.mode.value, bucket=request.resolution,
                        steps=request.num_inference_steps, guidance_scale=request.guidance_scale,
                        seed=request.seed, num_images=request.num_images)
        line.update(images_done=self.images_done, queue_wait_s=self.queue_wait_seconds,
                    compile_s=round(self.compile_seconds, 4), denoise_s=round(self.denoise_seconds, 4),
                    decode_s=round(self.decode_seconds, 4), total_s=round(time.perf_counter() - self.started, 4),
                    outcome=self.outcome, stages_ms=self.stages_ms())
        if self.error:
            line["error"] = self.error
        if log_prompt and request is not None:
            line["prompt"] = request.prompt
        return line

    def stages_ms(self) -> dict[str, float]:
        """Where the request's time went, from the timestamps the app keeps: the guard, Gradio's queue,
        the engine's hand-off (waiting for the device thread, forming the call) and the device's
        denoise + decode, PNG encode and write, and the handler after its last image (the final yield)."""
        now = time.perf_counter()
        device = self.compile_seconds + self.denoise_seconds + self.decode_seconds
        engine = (self.last_image_at - self.started) if self.last_image_at is not None else now - self.started
        stages = {"admission": self.admission_seconds, "queue": self.queue_wait_seconds or 0.0,
                  "engine_handoff": max(engine - device - self.encode_seconds, 0.0), "device": device,
                  "png_encode_write": self.encode_seconds,
                  "after_last_image": max(now - self.started - engine, 0.0)}
        return {name: round(1000 * seconds, 2) for name, seconds in stages.items()}

    def emit(self, log_prompt: bool = False) -> None:
        log.info(json.dumps(self.as_dict(log_prompt), ensure_ascii=False))
