"""One pipeline call for a batch of images from one or several requests (on the device thread).

Each image has its own ``torch.Generator("cpu").manual_seed(seed + i)``, so it is the same alone or in a
batch. A stopped request is dropped at the next step and its stream ends; the others go on. The pipeline
stops, skipping the VAE decode, only when no image of the call is wanted. ``BatchRunner`` gets the
collaborators it uses, never the Engine.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any, Callable

from tpu_demo.core import pngmeta
from tpu_demo.core.catalog import ModelSpec
from tpu_demo.core.errors import EngineError
from tpu_demo.core.events import Compiling, ImageResult, Loading, Stopped
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.recent import RecentRuns, TimedRun
from tpu_demo.core.styles import styled_prompt
from tpu_demo.engine.batching import Member, PendingRequest
from tpu_demo.engine.bucket_book import BucketBook
from tpu_demo.engine.errors import user_message
from tpu_demo.engine.image_record import image_parameters, image_timings
from tpu_demo.engine.model_pool import ModelPool
from tpu_demo.engine.pipeline_calls import PipelineCalls
from tpu_demo.engine.step_observer import DecodeGuard, DecodeSkipped, StepObserver
from tpu_demo.engine.warmup import shape_key
from tpu_demo.models.styles import style_refusal

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


class BatchRunner:
    """Makes one pipeline call for a batch of waiting images and hands each image to its request."""

    def __init__(self, spec: Callable[[str], ModelSpec], pool: ModelPool, book: BucketBook, calls: PipelineCalls,
                 decode_guard: DecodeGuard, recent: RecentRuns, describe_mode: Callable[[ExecutionMode], str],
                 preview_every: int):
        self.spec, self.pool, self.book, self.calls = spec, pool, book, calls
        self.decode_guard, self.recent, self.describe_mode = decode_guard, recent, describe_mode
        #: emit a latent preview every this many steps (0: never)
        self.preview_every = preview_every

    def run(self, members: list[Member]) -> None:
        """Make one pipeline call for ``members`` (same CallShape) and hand each image to its request."""
        first = members[0].pending.request
        try:
            spec = self.spec(first.model)
            if self.pool.get(spec.id) is None:  # a switch to a model not loaded: say so while it loads
                for member in members:
                    member.pending.emit(Loading(spec.id, self.pool.loading_text(spec)))
            loaded = self.pool.load(spec)
            if loaded.styles is not None:  # between calls, on the device thread: a hot swap, never a recompile
                loaded.styles.apply(*first.style_key)
            elif first.style:
                refusal = style_refusal(spec, self.pool.placement_for(spec))
                raise EngineError(refusal or f"{spec.id} has no styles loaded")
        except Exception as error:  # noqa: BLE001 - every request of the call hears why
            _fail(members, error)
            return
        bucket, mode = first.bucket, first.mode
        key = shape_key(loaded.spec, mode, bucket, first.guidance_scale, images=len(members))
        warm = self.book.is_warm(key)
        every = self.preview_every
        # each image its own preview stream (throttle, copies in flight) over its own latents row
        observers = [StepObserver(m.pending.emit, m.index, first.num_inference_steps, m.pending.stop, bucket,
                                  self.calls.previews(loaded, bucket, every if m.pending.request.previews else 0))
                     for m in members]
        observer = BatchObserver(observers, members, self.decode_guard)
        # each image's own prompt: the upsampler draws what the typed prompt leaves out from the image's seed
        seeds = [m.pending.request.seed + m.index for m in members]
        try:
            drawn = [self.calls.draw_prompt(loaded, m.pending.request, seed) for m, seed in zip(members, seeds)]
        except Exception as error:  # noqa: BLE001 - every request of the call hears why
            _fail(members, error)
            return
        prompts = [styled_prompt(loaded.spec.styles, first.style, d.text if d else m.pending.request.prompt)
                   for m, d in zip(members, drawn)]
        negatives = [m.pending.request.negative_prompt for m in members]
        call: Callable[[], Any] = lambda: self.calls.call(  # noqa: E731
            loaded, mode, prompts, bucket, first.num_inference_steps, first.guidance_scale, seeds, observer, negatives)
        started = time.perf_counter()
        compiles_before = self.calls.counter.count
        try:
            self.decode_guard.active = False
            if warm:
                output = call()
            else:
                for member in members:
                    member.pending.emit(Compiling(resolution=str(bucket), mode=mode.value))
                output = self.book.compile_phase(key, call)
        except DecodeSkipped:
            output = None
        except Exception as error:  # noqa: BLE001 - reported to every request of the call
            _fail(members, error)
            self.calls.release_after_failure()
            return
        finally:
            self.decode_guard.active = False
        ended = time.perf_counter()
        mode_text = self.describe_mode(mode)
        scheduler = type(loaded.pipeline.scheduler).__name__
        for row, (member, image_observer) in enumerate(zip(members, observers)):
            pending = member.pending
            pending.in_flight -= 1
            if image_observer.interrupted or output is None:
                pending.finish(stop_event(pending, f"stopped at step {image_observer.steps_done} "
                                                   f"of image {member.index + 1}"))
                continue
            timings = image_timings(started, image_observer.last_step_at, ended, first.num_inference_steps,
                                    self.calls.counter.count - compiles_before)
            timings["batch"] = len(members)
            if warm:  # the speed chart: a first call's time includes compiling; a batch's time is shared by its images
                self.recent.add(TimedRun(loaded.spec.id, mode.value, str(bucket), first.num_inference_steps,
                                         timings["denoise_seconds"] / len(members),
                                         timings["steps_per_second"] * len(members)))
            seed = pending.request.seed + member.index
            parameters = image_parameters(pending.request, seed, mode_text, self.calls.device.badge, scheduler,
                                          timings, warm, drawn[row])
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
