"""Warming shapes: one device job per shape, and background warmups coalesced per (model, mode).

A repeated ask returns the warmup already pending, and warmups wait for each other, so visitors cannot
queue warmups faster than the device compiles them and a request waits for at most one bucket's warmup
job. ``Warmer`` gets only the collaborators it uses, never the Engine or the request queue.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Any, Callable, Protocol

from tpu_demo.core.buckets import Bucket
from tpu_demo.core.catalog import ModelSpec
from tpu_demo.core.events import BucketStatus, ShapeKey
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.engine.bucket_book import BucketBook
from tpu_demo.engine.errors import user_message
from tpu_demo.engine.model_pool import LoadedModel, ModelPool
from tpu_demo.engine.preview_stream import PreviewStream
from tpu_demo.engine.step_observer import StepObserver

log = logging.getLogger("tpu_demo.engine")


def shape_key(spec: ModelSpec, mode: ExecutionMode, bucket: Bucket | str, guidance_scale: float,
              images: int = 1) -> ShapeKey:
    """The static shape a call runs at: the transformer's batch, ``images`` per call, doubled
    where the model's classifier-free guidance doubles the batch (another graph)."""
    batch = images * (2 if spec.cfg_doubles_batch and guidance_scale > 1.0 else 1)
    return ShapeKey(spec.id, mode.value, str(bucket), batch)


class PipelineCaller(Protocol):
    """The engine's one way to call a pipeline (``PipelineCalls.call``)."""

    def __call__(self, loaded: LoadedModel, mode: ExecutionMode, prompts: list[str], bucket: Bucket, steps: int,
                 guidance: float, seeds: list[int], observer: Any) -> Any: ...


class Warmer:
    """Warms shapes on the device thread; runs background warmups one at a time."""

    def __init__(self, book: BucketBook, pool: ModelPool, submit: Callable[[Callable[[], Any]], Future],
                 call_pipeline: PipelineCaller, previews: Callable[[LoadedModel, Bucket, int], PreviewStream],
                 models_in_use: Callable[[], set[str]], closing: threading.Event, steps: int):
        self.book, self.pool, self.submit = book, pool, submit
        self.call_pipeline, self.previews, self.models_in_use = call_pipeline, previews, models_in_use
        self.closing = closing
        #: denoising steps of a warmup call (clamped to each model's range)
        self.steps = steps
        self._pending: dict[tuple[str, ExecutionMode], threading.Thread] = {}
        self._lock = threading.Lock()
        self._lane = threading.Lock()

    def warm(self, spec: ModelSpec, mode: ExecutionMode, shapes: list[tuple[Bucket, int]],
             stop: threading.Event | None = None, may_evict: bool = True) -> list[BucketStatus]:
        """Warm each (bucket, images) in order, one device job each (blocking); see ``Engine.warmup``."""
        results = []
        for bucket, images in shapes:
            if (stop is not None and stop.is_set()) or self.closing.is_set():
                break
            key = shape_key(spec, mode, bucket, spec.default_guidance, images)
            status = self.submit(lambda b=bucket, k=key, n=images: self.warm_bucket(
                spec, mode, b, k, may_evict, n)).result()
            if status is None:
                log.info("warmup of %s %s skipped: it would free a loaded model", spec.id, mode.value)
                break
            results.append(status)
        return results

    def warm_bucket(self, spec: ModelSpec, mode: ExecutionMode, bucket: Bucket, key: ShapeKey,
                    may_evict: bool = True, images: int = 1) -> BucketStatus | None:
        """Warm one shape (device thread); None when that would free a model it may not free."""
        if self.book.is_warm(key):
            return self.book.snapshot(key)
        keep = frozenset(self.pool.loaded_ids() if not may_evict else self.models_in_use())
        if not self.pool.fits_keeping(spec, keep):
            return None
        try:
            loaded = self.pool.load(spec, keep)
            # a guidance that runs at the key's batch size: the model's default, else one that (does not) double it
            default_key = shape_key(spec, mode, bucket, spec.default_guidance, images)
            guidance = spec.default_guidance if default_key == key else (2.0 if key.batch == 2 * images else 1.0)
            steps = max(spec.min_steps, min(self.steps, spec.max_steps))
            observer = StepObserver.silent(steps, bucket, self.previews(loaded, bucket, 0))
            self.book.compile_phase(key, lambda: self.call_pipeline(
                loaded, mode, ["warmup"] * images, bucket, steps, guidance, list(range(images)), observer))
        except Exception as error:  # noqa: BLE001 - a failed bucket must not stop the others
            status = self.book.mark_failed(key, user_message(error))
            log.warning("warmup of %s %s %s failed: %s", spec.id, mode.value, bucket, status.error)
        return self.book.snapshot(key)

    def in_background(self, model_id: str, mode: ExecutionMode, warm: Callable[[], object]) -> threading.Thread:
        """Run ``warm`` in a background thread, unless a warmup of (model, mode) is already pending."""
        key = (model_id, mode)
        with self._lock:
            pending = self._pending.get(key)
            if pending is not None and pending.is_alive():
                return pending

            def run() -> None:
                try:
                    with self._lane:
                        warm()
                except Exception:  # noqa: BLE001 - bucket states already say what failed
                    log.exception("background warmup of %s failed", model_id)
                finally:
                    with self._lock:
                        if self._pending.get(key) is threading.current_thread():
                            del self._pending[key]

            thread = threading.Thread(target=run, name=f"warmup-{model_id}-{mode.value}", daemon=True)
            self._pending[key] = thread
            thread.start()
        return thread

    def pending(self) -> list[tuple[str, str]]:
        """(model, mode) of every warmup pending or running."""
        with self._lock:
            return [(model, mode.value) for (model, mode), thread in self._pending.items() if thread.is_alive()]
