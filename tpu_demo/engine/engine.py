"""The engine: loads each model once, keeps a warm compiled graph per bucket, runs requests.

All device work runs on one thread, one job at a time: two pipelines never run at once, and background
warmup interleaves with requests between buckets. A request is a generator of events fed by that thread;
each job makes one pipeline call from waiting images of one shape. No Gradio: device specifics come
only from ``tpu_demo.device``, model knowledge only from the catalog.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from tpu_demo.core.buckets import Bucket
from tpu_demo.core.catalog import CATALOG, ModelSpec, Placement, get_spec
from tpu_demo.core.errors import EngineError
from tpu_demo.core.events import BucketStatus, EngineStatus, ShapeKey, Stopped
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.recent import RecentRuns
from tpu_demo.core.request import GenerationRequest
from tpu_demo.core.styles import StyleSpec
from tpu_demo.device import DeviceInfo, compile_backend_name, describe_mode, modes_running_same_code
from tpu_demo.distributed.lockstep import Lockstep, PipelineCall, UpsamplePrompt
from tpu_demo.engine.about import server_facts
from tpu_demo.engine.batch_run import BatchRunner
from tpu_demo.engine.batching import END, ImageQueue, PendingRequest, batch_sizes
from tpu_demo.engine.bucket_book import BucketBook
from tpu_demo.engine.compare import EngineCalls, compare_modes
from tpu_demo.engine.compile_counter import CompileCounter, apply_recompile_limits, recompile_limits
from tpu_demo.engine.errors import user_message
from tpu_demo.engine.model_pool import ModelPool, PoolSettings
from tpu_demo.engine.pipeline_calls import PipelineCalls
from tpu_demo.engine.step_observer import DecodeGuard, StepObserver
from tpu_demo.engine.warmup import Warmer, shape_key
from tpu_demo.models.placement import describe_placement
from tpu_demo.models.styles import style_refusal

__all__ = ["Engine", "EngineConfig", "EngineError"]

#: How often a waiting request checks its Stop flag and whether the tensor-parallel group has failed.
_POLL_SECONDS = 0.1


@dataclass(frozen=True)
class EngineConfig:
    models_dir: Path
    cpu_compile_backend: str = "inductor"
    offered_models: tuple[str, ...] = ()
    bucket_overrides: dict[str, tuple[Bucket, ...]] = field(default_factory=dict)
    placement_override: Placement | None = None
    #: GB of weights that may stay loaded together; None keeps one model at a time
    memory_budget_gb: float | None = None
    warmup_steps: int = 2
    #: emit a latent preview every this many denoising steps (0: never)
    preview_every: int = 1
    #: most images per pipeline call (static sizes 1, 2, 4 up to it); tensor parallel runs batch 1
    #: largest images per call (1, 2, 4); 0: each model's ``ModelSpec.max_batch``
    max_batch: int = 0
    #: and at most one preview per this many seconds of wall time, counted from the image's start
    preview_seconds: float = 0.25
    #: style adapters served instead of the catalog's, per model id (tests, operators' own files)
    style_overrides: dict[str, tuple[StyleSpec, ...]] = field(default_factory=dict)


class Engine:
    """Holds loaded pipelines and bucket states; runs every device job on one worker thread."""

    def __init__(self, config: EngineConfig, device: DeviceInfo, lockstep: Lockstep | None = None):
        self.config = config
        self.device = device
        #: tensor-parallel runs (torchrun): keeps every rank on the same loads and pipeline calls
        self.lockstep = lockstep
        self.counter = CompileCounter(compile_backend_name(device, config.cpu_compile_backend))
        self.book = BucketBook(self.counter)
        self.decode_guard = DecodeGuard()
        #: the one way to call a pipeline (compiling on first use, announced to every rank under TP)
        self.calls = PipelineCalls(device, self.counter, lockstep, config.preview_seconds)
        self.pool = ModelPool(PoolSettings(config.models_dir, config.placement_override, config.memory_budget_gb),
                              device, self.book, self.decode_guard, lockstep, self.calls.in_lockstep)
        #: images waiting for the device; a lockstep call carries one prompt and seed, so TP runs batch 1
        self._images = ImageQueue()
        #: --max-batch: 0 is each model's own (``ModelSpec.max_batch``); set_max_batch changes it at run time
        self._max_batch = config.max_batch
        #: pipeline calls made for requests, by images per call
        self.calls_by_batch: Counter[int] = Counter()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="device")
        self._busy = threading.Event()
        self._closing = threading.Event()
        #: models a running or queued request needs (model id -> count): warmups never evict them
        self._in_use: Counter[str] = Counter()
        self._in_use_lock = threading.Lock()
        #: warm images of recent requests and comparisons: the page's speed chart
        self.recent = RecentRuns()
        self._warmer = Warmer(self.book, self.pool, self.submit, self.calls.call, self.calls.previews,
                              self.models_in_use, self._closing, config.warmup_steps)
        self._batches = BatchRunner(self.spec, self.pool, self.book, self.calls, self.decode_guard, self.recent,
                                    self.mode_description, config.preview_every)
        offered = config.offered_models or tuple(CATALOG)
        self.specs: dict[str, ModelSpec] = {model_id: replace(
            get_spec(model_id), buckets=config.bucket_overrides.get(model_id, get_spec(model_id).buckets),
            styles=config.style_overrides.get(model_id, get_spec(model_id).styles)) for model_id in offered}
        bucket_count = sum(len(spec.buckets) for spec in self.specs.values())
        # set here and on the device thread, which compiles (dynamo's config is per thread)
        self._recompile_limits = recompile_limits(bucket_count * len(batch_sizes(4)))
        apply_recompile_limits(self._recompile_limits)

    # ---- read-only views -------------------------------------------------------------------
    def spec(self, model_id: str) -> ModelSpec:
        if model_id not in self.specs:
            raise EngineError(f"model {model_id!r} is not offered here; choose one of: {', '.join(self.specs)}")
        return self.specs[model_id]

    def mode_description(self, mode: ExecutionMode) -> str:
        return describe_mode(mode, self.device, self.config.cpu_compile_backend)

    def placement_for(self, model_id: str) -> Placement:
        return self.pool.placement_for(self.spec(model_id))

    def placement_description(self, model_id: str) -> str:
        try:
            return describe_placement(self.placement_for(model_id), self.device, self.pool.world_size)
        except Exception as error:  # noqa: BLE001 - shown in the UI instead
            return str(error)

    def style_refusal(self, model_id: str) -> str | None:
        """Why ``model_id`` takes no style here (its placement, or none offered); None when it does."""
        return style_refusal(self.spec(model_id), self.placement_for(model_id))

    def status(self) -> EngineStatus:
        models = {model_id: {"placement": loaded.placement.value, "weights_mb": round(loaded.weight_bytes / 1e6, 1),
                             "compiled": loaded.compiled} for model_id, loaded in self.pool.items()}
        return EngineStatus(device=self.device.badge, device_kind=self.device.kind, device_count=self.device.count,
                            models=models, buckets=self.book.all(), compiles_total=self.counter.count,
                            busy=self._busy.is_set(), loading=self.pool.loading)

    def batch_sizes_for(self, model_id: str) -> tuple[int, ...]:
        """The static batch sizes ``model_id`` warms and calls at: up to ``--max-batch``, or its catalog
        ``max_batch`` (auto); batch 1 only under tensor parallelism (a lockstep call carries one prompt)."""
        if self.lockstep is not None:
            return (1,)
        return batch_sizes(self._max_batch or self.spec(model_id).max_batch)

    @property
    def max_batch(self) -> int:
        """The largest batch any offered model calls at."""
        return max(self.batch_sizes_for(model_id)[-1] for model_id in self.specs)

    def set_max_batch(self, max_batch: int) -> None:
        """Change the largest batch size at run time (the benchmark compares batching on and off; 0: each
        model's own); sizes used must still be warm (``warmup``) before a request batches at them."""
        self._max_batch = max_batch

    @staticmethod
    def shape_key(spec: ModelSpec, mode: ExecutionMode, bucket: Bucket | str, guidance_scale: float,
                  images: int = 1) -> ShapeKey:
        return shape_key(spec, mode, bucket, guidance_scale, images)

    def bucket_status(self, key: ShapeKey) -> BucketStatus:
        return self.book.snapshot(key)

    def configured_shapes(self, model_id: str, mode: ExecutionMode) -> list[ShapeKey]:
        """What warmup warms: every bucket at every batch size, at the model's default guidance."""
        spec = self.spec(model_id)
        return [self.shape_key(spec, mode, bucket, spec.default_guidance, images)
                for images in self.batch_sizes_for(model_id) for bucket in spec.buckets]

    def buckets_for(self, model_id: str, mode: ExecutionMode) -> list[BucketStatus]:
        """Every configured shape of ``model_id`` in ``mode`` (cold ones too) first, then any other shape used."""
        configured = self.configured_shapes(model_id, mode)
        return [self.book.snapshot(key) for key in configured] + self.book.matching(
            lambda key: key.model == model_id and key.mode == mode.value and key not in configured)

    # ---- device jobs ----------------------------------------------------------------------
    def submit(self, job: Callable[[], Any]) -> Future:
        """Run ``job`` on the device thread (one at a time)."""

        def run() -> Any:
            self._busy.set()
            try:
                apply_recompile_limits(self._recompile_limits)
                return job()
            finally:
                self._busy.clear()

        return self._worker.submit(run)

    def load(self, model_id: str) -> Any:
        """Load ``model_id`` now (blocking) and return its diffusers pipeline; EngineError if it cannot."""
        spec = self.spec(model_id)
        return self.submit(lambda: self.pool.load(spec).pipeline).result()

    def warmup(self, model_id: str, mode: ExecutionMode, buckets: tuple[Bucket, ...] | None = None,
               stop: threading.Event | None = None, may_evict: bool = True) -> list[BucketStatus]:
        """Warm each bucket of ``model_id`` in ``mode`` at every batch size, one device job per shape (blocking).

        A bucket whose warmup fails is marked failed; the others still warm. With
        ``may_evict=False`` (warmups a visitor triggers) nothing loaded is freed for it: if the
        model does not fit next to the loaded ones, the warmup is skipped and the first
        generation that asks for the model loads it.
        """
        spec = self.spec(model_id)
        # every bucket at batch 1 first: a bucket is usable at all before its larger batches warm
        shapes = [(bucket, images) for images in self.batch_sizes_for(model_id) for bucket in buckets or spec.buckets]
        return self._warmer.warm(spec, mode, shapes, stop, may_evict)

    def warm_shape(self, model_id: str, mode: ExecutionMode, bucket: Bucket, guidance_scale: float) -> BucketStatus:
        """Warm the one shape a request with this guidance runs at (blocking); its status after.

        Part of a generation (compare modes), so it may load the model like a request does."""
        spec = self.spec(model_id)
        key = self.shape_key(spec, mode, bucket, guidance_scale)
        return self.submit(lambda: self._warmer.warm_bucket(spec, mode, bucket, key, True)).result()

    def warmup_in_background(self, model_id: str, mode: ExecutionMode, buckets: tuple[Bucket, ...] | None = None,
                             may_evict: bool = True) -> threading.Thread:
        """Warm in a background thread; coalesced: while a warmup of (model, mode) is pending or
        running, asking again returns that one. Background warmups run one at a time, and each
        bucket is its own device job, so a request waits for at most one bucket's warmup."""
        self.spec(model_id)  # unknown model: EngineError here, not in the thread
        return self._warmer.in_background(model_id, mode,
                                          lambda: self.warmup(model_id, mode, buckets, may_evict=may_evict))

    def pending_warmups(self) -> list[tuple[str, str]]:
        """(model, mode) of every background warmup pending or running."""
        return self._warmer.pending()

    def generate(self, request: GenerationRequest, stop: threading.Event | None = None) -> Iterator[Any]:
        """Run a validated request; yields Compiling, StepProgress, ImageResult and Stopped events.

        Its images wait for the device with every other request's and may share a pipeline call
        with them (``batching``). Raises EngineError if the request fails. Setting ``stop`` ends
        the stream at once (while waiting, or at the next denoising step); closing the
        generator early (a client went away) does the same.
        """
        stop = stop or threading.Event()
        if self.lockstep is not None and self.lockstep.failure:
            raise EngineError(self.lockstep.failure)
        if request.style and (refusal := self.style_refusal(request.model)):
            raise EngineError(refusal)
        events: queue.Queue = queue.Queue()
        pending = PendingRequest(request, events.put, stop)
        with self._in_use_lock:
            self._in_use[request.model] += 1  # from now until the request ends: no warmup evicts it
        self._images.add(pending)
        for _ in range(request.num_images):  # at most one call per image; a job that finds nothing waiting returns
            self.submit(self._run_next_call)
        try:
            while True:
                try:
                    event = events.get(timeout=_POLL_SECONDS)
                except queue.Empty:
                    if self.lockstep is not None and self.lockstep.failure:
                        raise EngineError(self.lockstep.failure) from None  # the device thread may be stuck
                    if stop.is_set() and pending.in_flight == 0:  # stopped while waiting: end now
                        pending.finish(Stopped(completed=pending.completed, reason="stopped"))
                    elif self._closing.is_set() and pending.in_flight == 0:  # its device jobs were dropped
                        pending.finish(EngineError("the server is shutting down; try again in a minute"))
                    continue
                if event is END:
                    return
                if isinstance(event, Exception):
                    raise event if isinstance(event, EngineError) else EngineError(user_message(event)) from event
                yield event
        finally:
            stop.set()  # a consumer that stops listening stops the job
            pending.finish()
            self._images.remove(pending)
            with self._in_use_lock:
                self._in_use[request.model] -= 1
                if self._in_use[request.model] <= 0:
                    del self._in_use[request.model]

    def requests_waiting(self) -> int:  # requests none of whose images has reached the device yet
        return self._images.waiting_requests()

    def about(self) -> dict[str, Any]:
        """Device, versions, compile backend and cache state, models offered (engine/about.py)."""
        return server_facts(self.device, compile_backend_name(self.device, self.config.cpu_compile_backend),
                            self.config.models_dir.parent / "compile", self.specs, self.placement_description)

    def compare_modes(self, request: GenerationRequest, stop: threading.Event | None = None) -> Iterator[Any]:
        """The request in every execution mode, warm against warm (see engine/compare.py)."""
        calls = EngineCalls(self.spec, self.bucket_status, self.warm_shape, self.generate, self.mode_description,
                            modes_running_same_code(self.device))
        return compare_modes(calls, request, stop)

    def close(self) -> None:
        """Drop queued jobs, wait for the running one, and free every loaded model."""
        self._closing.set()
        self._worker.shutdown(wait=True, cancel_futures=True)
        self.pool.unload_all()  # the device thread has finished: safe from here

    # ---- on the device thread -------------------------------------------------------------
    def run_followed_upsample(self, call: UpsamplePrompt) -> None:
        """Tensor parallel, follower ranks: take part in rank 0's prompt rewrite (output unused)."""
        upsampler = self.pool.load(self.spec(call.model_id)).upsampler
        if upsampler is not None:
            upsampler.rewrite(call.prompt, call.seed)

    def run_followed_call(self, call: PipelineCall) -> None:
        """Tensor parallel, follower ranks: make rank 0's pipeline call the same way (output unused)."""
        loaded = self.pool.load(self.spec(call.model_id))
        bucket = Bucket(call.width, call.height)
        observer = StepObserver.silent(call.num_inference_steps, bucket, self.calls.previews(loaded, bucket, 0))
        self.calls.call(loaded, ExecutionMode(call.mode), [call.prompt], bucket, call.num_inference_steps,
                           call.guidance_scale, [call.seed], observer, [call.negative_prompt])

    def models_in_use(self) -> set[str]:
        with self._in_use_lock:  # models a running or queued request needs
            return set(self._in_use)

    def _run_next_call(self) -> None:
        """One device job: one pipeline call from the waiting images (nothing if none wait)."""
        members = self._images.take(
            self.max_batch,
            usable=lambda shape, size: size in self.batch_sizes_for(shape.model) and self.book.is_warm(self.shape_key(
                self.spec(shape.model), ExecutionMode(shape.mode), shape.resolution, shape.guidance_scale, size)),
            stopped=lambda pending: pending.finish(Stopped(completed=pending.completed, reason="stopped")))
        if members:
            self.calls_by_batch[len(members)] += 1
            self._batches.run(members)
