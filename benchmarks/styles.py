"""The style switch figure: hot-swapping LoRA styles on the warm compiled graph, every bucket.

An engine of its own serves the style model (default tiny-shapes, whose committed adapters the
catalog lists) in compiled mode: every bucket is warmed with no style, then each bucket gets
a request per step of a cycle through every style, None and two scales. Measured: the swap
itself on the device thread (``StyleAdapters.last_swap_seconds``), the first image after a
switch against the next one with the same style (no switch), and the graphs compiled in the
cycle, counted two ways (dynamo's own count and the engine's counting backend).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.measure import CompileWatch, median

PROMPT = "a large red square in the center on a white background"


def _cycle(style_names: list[str]) -> list[tuple[str, float]]:
    """Every style at its strength 1, no style between, then the first at half and one and a half."""
    steps: list[tuple[str, float]] = []
    for name in style_names:
        steps += [(name, 1.0), ("None", 1.0)]
    return steps + [(style_names[0], 0.5), (style_names[0], 1.5)]


def measure_style_switch(models_dir: Path, model: str, compile_backend: str, steps: int,
                         smoke: bool = False) -> dict[str, Any]:
    """Warm every bucket (``smoke``: the first only), then switch styles on each; seconds and compiles."""
    from tpu_demo.core.events import ImageResult
    from tpu_demo.core.modes import ExecutionMode
    from tpu_demo.core.request import validate_request
    from tpu_demo.device import detect_device
    from tpu_demo.engine.engine import Engine, EngineConfig

    from tpu_demo.core.catalog import get_spec

    buckets = {model: get_spec(model).buckets[:1]} if smoke else {}
    engine = Engine(EngineConfig(models_dir=models_dir, cpu_compile_backend=compile_backend, offered_models=(model,),
                                 bucket_overrides=buckets), detect_device())
    try:
        spec = engine.spec(model)
        if not spec.styles:
            return {"skipped": f"{model} offers no styles"}
        engine.warmup(model, ExecutionMode.COMPILED)
        slot = engine.pool.get(model).styles

        def image_seconds(bucket: str, style: str, scale: float, seed: int) -> float:
            request = validate_request(dict(prompt=PROMPT, model=model, mode="compiled", resolution=bucket,
                                            num_inference_steps=steps, guidance_scale=spec.default_guidance,
                                            seed=seed, style=style, style_scale=scale))
            started = time.perf_counter()
            results = [e for e in engine.generate(request) if isinstance(e, ImageResult)]
            if len(results) != 1 or not results[0].warm:
                raise RuntimeError(f"style {style} on {bucket}: no warm image")
            return time.perf_counter() - started

        swaps_ms, after_switch_s, same_style_s = [], [], []
        cycle = _cycle([style.name for style in spec.styles])
        with CompileWatch(engine.counter) as watch:
            for bucket in spec.buckets:
                for index, (style, scale) in enumerate(cycle):
                    swaps_before = slot.swaps
                    after_switch_s.append(image_seconds(str(bucket), style, scale, index))
                    if slot.swaps > swaps_before:
                        swaps_ms.append(1000 * slot.last_swap_seconds)
                    same_style_s.append(image_seconds(str(bucket), style, scale, index + 100))
        return {"model": model, "buckets": [str(b) for b in spec.buckets], "styles": [s.name for s in spec.styles],
                "cycle": [f"{style}@{scale:g}" for style, scale in cycle], "switches": len(swaps_ms),
                "images": len(after_switch_s) + len(same_style_s), "swap_ms_median": round(median(swaps_ms), 2),
                "swap_ms_max": round(max(swaps_ms), 2),
                "first_image_after_switch_s": round(median(after_switch_s), 4),
                "next_image_same_style_s": round(median(same_style_s), 4),
                "ratio": round(median(after_switch_s) / median(same_style_s), 3),
                "compiles": watch.backend_calls, "dynamo_graphs": watch.graphs}
    finally:
        engine.close()


def table_row(figure: dict[str, Any]) -> tuple[str, str, str, str]:
    """The benchmark table's "style switch" row."""
    if "skipped" in figure:
        return ("style switch (LoRA hot swap, compiled)", figure["skipped"], "0 compiles", "\u2013")
    value = (f"{figure['swap_ms_median']:.1f} ms to switch (max {figure['swap_ms_max']:.1f}); first image after a "
             f"switch / next image of the same style {figure['ratio']:.3f}x ({figure['first_image_after_switch_s']:.3f} s "
             f"/ {figure['next_image_same_style_s']:.3f} s); {figure['switches']} switches, {figure['images']} images "
             f"after them on {', '.join(figure['buckets'])}; compiles **{figure['compiles']}** (dynamo graphs "
             f"{figure['dynamo_graphs']})")
    met = "yes" if figure["compiles"] == 0 and figure["dynamo_graphs"] == 0 else "**no**"
    return (f"style switch ({figure['model']}: {', '.join(figure['styles'])}, None, scales; compiled)", value,
            "0 compiles", met)
