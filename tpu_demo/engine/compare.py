"""Run one request in strict eager, optimized eager and compiled mode, warm against warm.

A cold shape is warmed first and its compile time reported apart, never as a run. The modes are timed in
interleaved rounds with the same prompt, seed, bucket, steps and guidance; the fastest run of each
counts. Each run is an ordinary engine request (tensor parallelism, Stop, the request log), made through
``EngineCalls``, never the Engine.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import numpy as np

from tpu_demo.core.buckets import Bucket
from tpu_demo.core.catalog import ModelSpec
from tpu_demo.core.comparison import ComparePhase, Comparison, ModeRun
from tpu_demo.core.errors import EngineError
from tpu_demo.core.events import BucketState, BucketStatus, ImageResult, ShapeKey, Stopped
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.request import GenerationRequest
from tpu_demo.engine.warmup import shape_key

#: strict eager first: it is the reference for speedups and pixel differences
COMPARED_MODES = tuple(ExecutionMode)
#: each mode is timed this many times, interleaved (strict, optimized, compiled, strict, ...), and its
#: fastest run counts: a hiccup of the host in one run does not decide the speedup
TIMED_ROUNDS = 2


class _ModeStop:
    """Stop flag of one mode's request: set by the outer flag (Stop, time limit, disconnect) or by the
    engine when that request ends, which must not stop the modes after it."""

    def __init__(self, outer: threading.Event):
        self.outer, self.own = outer, threading.Event()

    def is_set(self) -> bool:
        return self.own.is_set() or self.outer.is_set()

    def set(self) -> None:
        self.own.set()


def max_pixel_difference(image, reference) -> int:
    """Largest absolute difference of any 8-bit channel (0: identical pixels)."""
    return int(np.abs(np.asarray(image, dtype=np.int16) - np.asarray(reference, dtype=np.int16)).max())


@dataclass(frozen=True)
class EngineCalls:
    """What a comparison asks of the engine: its public calls, and which modes run the same code here."""

    spec: Callable[[str], ModelSpec]
    bucket_status: Callable[[ShapeKey], BucketStatus]
    warm_shape: Callable[[str, ExecutionMode, Bucket, float], BucketStatus]
    generate: Callable[[GenerationRequest, Any], Iterator[Any]]
    describe_mode: Callable[[ExecutionMode], str]
    #: groups of modes that run the very same code on this device (``device.modes_running_same_code``)
    same_code: tuple[tuple[ExecutionMode, ...], ...]


def compare_modes(calls: EngineCalls, request: GenerationRequest,
                  stop: threading.Event | None = None) -> Iterator[ComparePhase | ImageResult | Stopped | Comparison]:
    """Yield phases, each mode's ImageResult as it is made, then the Comparison (or Stopped)."""
    stop = stop or threading.Event()
    spec = calls.spec(request.model)
    warmups: dict[ExecutionMode, tuple[bool, float | None, int]] = {}
    for mode in COMPARED_MODES:
        if stop.is_set():
            yield Stopped(completed=0, reason="stopped while warming")
            return
        key = shape_key(spec, mode, request.bucket, request.guidance_scale)
        warm_before = calls.bucket_status(key).state is BucketState.WARM
        if not warm_before:
            yield ComparePhase(mode.value, f"warming the {request.resolution} bucket in {mode.title} "
                                           f"({'compiling: ' if mode.traits.compiled else ''}first call, not timed)")
        status = calls.warm_shape(request.model, mode, request.bucket, request.guidance_scale)
        if status.state is not BucketState.WARM:
            raise EngineError(f"{mode.title}: the {request.resolution} bucket could not be warmed: {status.error}")
        warmups[mode] = (warm_before, None if warm_before else status.compile_seconds,
                         0 if warm_before else status.compiles)
    results: dict[ExecutionMode, ImageResult] = {}
    fastest: dict[ExecutionMode, dict[str, float]] = {}
    for round_index in range(TIMED_ROUNDS):
        for index, mode in enumerate(COMPARED_MODES):
            yield ComparePhase(mode.value, f"timing {mode.title} (warm, round {round_index + 1} of {TIMED_ROUNDS})")
            single = replace(request, mode=mode, num_images=1, previews=False)
            for event in calls.generate(single, _ModeStop(stop)):
                if isinstance(event, Stopped):
                    yield replace(event, completed=len(results))
                    return
                if not isinstance(event, ImageResult):
                    continue
                if mode not in results:  # the image is shown once; later rounds only time
                    results[mode] = replace(event, index=index)
                    yield results[mode]
                if mode not in fastest or event.timings["denoise_seconds"] < fastest[mode]["denoise_seconds"]:
                    fastest[mode] = event.timings
    reference = fastest[ExecutionMode.EAGER]
    runs = []
    for mode in COMPARED_MODES:
        result, timings = results[mode], fastest[mode]
        warm_before, warmup_seconds, graphs = warmups[mode]
        denoise = timings["denoise_seconds"]
        runs.append(ModeRun(
            mode=mode.value, description=calls.describe_mode(mode), image=result.image,
            parameters=result.parameters, denoise_seconds=denoise, steps_per_second=timings["steps_per_second"],
            speedup=round(reference["denoise_seconds"] / max(denoise, 1e-9), 2), warm_before=warm_before,
            warmup_seconds=warmup_seconds, graphs_compiled=graphs,
            max_pixel_difference=max_pixel_difference(result.image, results[ExecutionMode.EAGER].image)))
    same = tuple(tuple(mode.value for mode in group) for group in calls.same_code)
    yield Comparison(runs=tuple(runs), same_code=same, timed_rounds=TIMED_ROUNDS)
