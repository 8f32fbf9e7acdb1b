"""One pipeline call for a batch of images from one or several requests (on the device thread).

The call gets one prompt and one ``torch.Generator("cpu").manual_seed(seed + i)`` per image
(``prompt=[...]``, ``generator=[...]``): diffusers draws each image's initial noise from its
own generator, so an image is the same (within float rounding) alone or in a batch.

Inside the denoising loop ``BatchObserver`` gives each image its own ``StepObserver`` over its
slice of the latents (its own step events and previews). A request whose Stop flag is set is
dropped at the next step and its stream ends at once; the others go on. Only when every image
of the call is unwanted does the pipeline stop, and then the VAE decode is skipped too.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable

from tpu_demo.core import pngmeta
from tpu_demo.core.errors import EngineError
from tpu_demo.core.events import Compiling, ImageResult, Loading, Stopped
from tpu_demo.core.recent import TimedRun
from tpu_demo.core.styles import styled_prompt
from tpu_demo.engine.batching import Member, PendingRequest
from tpu_demo.engine.errors import user_message
from tpu_demo.engine.image_record import image_parameters, image_timings
from tpu_demo.engine.step_observer import DecodeGuard, DecodeSkipped, StepObserver

if TYPE_CHECKING:
    from tpu_demo.engine.engine import Engine

log = logging.getLogger("tpu_demo.engine")


def stop_event(pending: PendingRequest, reason: str) -> Stopped:
    return Stopped(completed=pending.completed, reason=reason)


class BatchObserver:
    """``callback_on_step_end`` of a batched call: one StepObserver per image, on its latents slice."""

    def __init__(self, observers: list[StepObserver], members: list[Member], guard: DecodeGuard):
        self.observers, self.members, self.guard = observers, members, guard
        self.interrupted = False
        self.steps_done = 0

    @property
    def final_latents(self) -> Any:
        return self.observers[0].final_latents

    def __call__(self, pipeline: Any, step: int, timestep: Any, callback_kwargs: dict) -> dict:
        self.steps_done = step + 1
        latents = callback_kwargs.get("latents")
        newly_stopped = []
        for row, (observer, member) in enumerate(zip(self.observers, self.members)):
            if observer.interrupted:
                continue
            # latents are (batch, ...) for every pipeline here (Flux's packed ones too): row i is image i
            own = {"latents": latents[row:row + 1]} if latents is not None else {}
            observer(SimpleNamespace(), step, timestep, own)  # a stand-in: one image never interrupts the call
            if observer.interrupted:
                newly_stopped.append(member)
        if all(observer.interrupted for observer in self.observers):
            # nobody wants this call: it ends at this step, and run_batch ends the streams once it has
            # returned (execution mode left, device free), as an unbatched call would
            pipeline._interrupt = True
            self.interrupted = True
            self.guard.active = True  # diffusers decodes after an interrupted loop: nobody wants these images
            return {}
        for member in newly_stopped:  # the others go on: end these streams now, not when the call ends
            member.pending.finish(stop_event(member.pending, f"stopped at step {self.steps_done} "
                                                             f"of image {member.index + 1}"))
        return {}


def run_batch(engine: "Engine", members: list[Member]) -> None:
    """Make one pipeline call for ``members`` (same CallShape) and hand each image to its request."""
    first = members[0].pending.request
    try:
        spec = engine.spec(first.model)
        if engine.pool.get(spec.id) is None:  # a switch to a model not loaded: say so while it loads
            for member in members:
                member.pending.emit(Loading(spec.id, engine.pool.loading_text(spec)))
        loaded = engine.pool.load(spec)
        if loaded.styles is not None:  # between calls, on the device thread: a hot swap, never a recompile
            loaded.styles.apply(*first.style_key)
        elif first.style:
            raise EngineError(engine.style_refusal(spec.id) or f"{spec.id} has no styles loaded")
    except Exception as error:  # noqa: BLE001 - every request of the call hears why
        _fail(members, error)
        return
    bucket, mode = first.bucket, first.mode
    key = engine.shape_key(loaded.spec, mode, bucket, first.guidance_scale, images=len(members))
    warm = engine.book.is_warm(key)
    every = engine.config.preview_every
    # each image its own preview stream (throttle, copies in flight) over its own latents row
    observers = [StepObserver(m.pending.emit, m.index, first.num_inference_steps, m.pending.stop, bucket,
                              engine.previews(loaded, bucket, every if m.pending.request.previews else 0))
                 for m in members]
    observer = BatchObserver(observers, members, engine.decode_guard)
    # each image's own prompt: the upsampler draws what the typed prompt leaves out from the image's seed
    seeds = [m.pending.request.seed + m.index for m in members]
    try:
        drawn = [engine.draw_prompt(loaded, m.pending.request, seed) for m, seed in zip(members, seeds)]
    except Exception as error:  # noqa: BLE001 - every request of the call hears why
        _fail(members, error)
        return
    prompts = [styled_prompt(loaded.spec.styles, first.style, d.text if d else m.pending.request.prompt)
               for m, d in zip(members, drawn)]
    negatives = [m.pending.request.negative_prompt for m in members]
    call: Callable[[], Any] = lambda: engine.call_pipeline(  # noqa: E731
        loaded, mode, prompts, bucket, first.num_inference_steps, first.guidance_scale, seeds, observer, negatives)
    started = time.perf_counter()
    compiles_before = engine.counter.count
    try:
        engine.decode_guard.active = False
        if warm:
            output = call()
        else:
            for member in members:
                member.pending.emit(Compiling(resolution=str(bucket), mode=mode.value))
            output = engine.book.compile_phase(key, call)
    except DecodeSkipped:
        output = None
    except Exception as error:  # noqa: BLE001 - reported to every request of the call
        _fail(members, error)
        engine.release_after_failure()
        return
    finally:
        engine.decode_guard.active = False
    ended = time.perf_counter()
    mode_text = engine.mode_description(mode)
    scheduler = type(loaded.pipeline.scheduler).__name__
    for row, (member, image_observer) in enumerate(zip(members, observers)):
        pending = member.pending
        pending.in_flight -= 1
        if image_observer.interrupted or output is None:
            pending.finish(stop_event(pending, f"stopped at step {image_observer.steps_done} of image {member.index + 1}"))
            continue
        timings = image_timings(started, image_observer.last_step_at, ended, first.num_inference_steps,
                                engine.counter.count - compiles_before)
        timings["batch"] = len(members)
        if warm:  # the speed chart: a first call's time includes compiling; a batch's time is shared by its images
            engine.recent.add(TimedRun(loaded.spec.id, mode.value, str(bucket), first.num_inference_steps,
                                       timings["denoise_seconds"] / len(members),
                                       timings["steps_per_second"] * len(members)))
        seed = pending.request.seed + member.index
        parameters = image_parameters(pending.request, seed, mode_text, engine.device.badge, scheduler, timings, warm,
                                      drawn[row])
        image = output.images[row]
        pngmeta.attach(image, parameters)
        pending.completed += 1
        pending.emit(ImageResult(index=member.index, image=image, seed=seed, parameters=parameters, timings=timings,
                                 warm=warm))
        if pending.completed >= pending.request.num_images:
            pending.finish()


def _fail(members: list[Member], error: Exception) -> None:
    log.warning("request failed: %s", user_message(error))
    for member in members:
        member.pending.in_flight -= 1
        member.pending.finish(error)
