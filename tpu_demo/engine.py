"""The engine: loads each model once, keeps a warm compiled graph per bucket, runs requests.

All device work runs on one worker thread, one job at a time, so two pipelines never run at
once on the device and background warmup interleaves with requests between buckets. A
request is a generator of events (compiling, step progress, image done, stopped) fed by that
thread through a queue, so callers see each image the moment it exists.

This module knows nothing of Gradio; device specifics come from device.py, model knowledge
from catalog.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from . import pngmeta
from .buckets import Bucket
from .catalog import CATALOG, ModelSpec, Placement, get_spec
from .compile_cache import cache_counters, compile_source
from .compile_counter import CompileCounter
from .device import (DeviceInfo, compile_backend_name, describe_mode, execution_mode, release_cached_memory,
                     synchronize)
from .events import BucketState, BucketStatus, Compiling, EngineStatus, ImageResult, StepProgress, Stopped
from .loading import ModelUnavailable, ensure_available, load_pipeline, parameter_bytes
from .lockstep import LoadModel, Lockstep, PipelineCall, TensorParallelFailure
from .modes import ExecutionMode
from .previews import LatentPreviewer
from .placement import (PlacementError, apply_placement, choose_placement, compile_for_placement,
                        describe_placement)
from .request import GenerationRequest

log = logging.getLogger("tpu_demo.engine")


class EngineError(RuntimeError):
    """A request failed; the message is safe to show to users."""


#: How often a waiting request checks whether the tensor-parallel group has failed.
_FAILURE_POLL_SECONDS = 0.5


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


@dataclass
class _LoadedModel:
    spec: ModelSpec
    pipeline: Any
    placement: Placement
    weight_bytes: int
    compiled: bool = False
    last_used: float = 0.0
    previewer: LatentPreviewer = field(default_factory=LatentPreviewer)


_ShapeKey = tuple[str, str, str, bool]  # (model, mode, resolution, classifier-free guidance on)


class _StepObserver:
    """``callback_on_step_end``: reports steps and previews, keeps the final latents for the
    preview fit, and on stop sets the pipeline's interrupt flag (diffusers then skips the
    remaining steps)."""

    def __init__(self, emit: Callable[[Any], None], index: int, total: int, stop: threading.Event,
                 bucket: Bucket, previewer: LatentPreviewer, preview_every: int):
        self.emit, self.index, self.total, self.stop = emit, index, total, stop
        self.bucket, self.previewer, self.preview_every = bucket, previewer, preview_every
        self.started = time.perf_counter()
        self.last_step_at: float | None = None
        self.steps_done = 0
        self.interrupted = False
        self.final_latents: torch.Tensor | None = None

    def __call__(self, pipeline: Any, step: int, timestep: Any, callback_kwargs: dict) -> dict:
        self.steps_done = step + 1
        if self.stop.is_set():
            pipeline._interrupt = True
            self.interrupted = True
            return {}
        latents = callback_kwargs.get("latents")
        last = self.steps_done >= self.total
        if last and latents is not None and self.previewer.wants_observation():
            self.final_latents = latents.detach().to("cpu", copy=True)
        preview = None
        if self.preview_every and not last and self.steps_done % self.preview_every == 0 and latents is not None:
            preview = self.previewer.capture(latents, self.bucket)
        self.last_step_at = time.perf_counter()
        self.emit(StepProgress(self.index, self.steps_done, self.total, self.last_step_at - self.started, preview))
        return {}


class _DecodeSkipped(Exception):
    """Raised by the VAE decoder hook when the image was stopped: no decode for aborted images."""


class Engine:
    """Holds loaded pipelines and bucket states; runs every device job on one worker thread."""

    def __init__(self, config: EngineConfig, device: DeviceInfo, lockstep: Lockstep | None = None):
        self.config = config
        self.device = device
        #: tensor-parallel runs (torchrun): keeps every rank on the same loads and pipeline calls
        self.lockstep = lockstep
        self.world_size = lockstep.world.world_size if lockstep is not None else 1
        self.counter = CompileCounter(compile_backend_name(device, config.cpu_compile_backend))
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="device")
        self._models: dict[str, _LoadedModel] = {}
        self._buckets: dict[_ShapeKey, BucketStatus] = {}
        self._state_lock = threading.Lock()
        self._busy = threading.Event()
        self._closing = threading.Event()
        self._skip_decode = threading.local()
        offered = config.offered_models or tuple(CATALOG)
        self.specs: dict[str, ModelSpec] = {
            model_id: get_spec(model_id).with_buckets(config.bucket_overrides[model_id])
            if model_id in config.bucket_overrides else get_spec(model_id)
            for model_id in offered
        }
        bucket_count = sum(len(spec.buckets) for spec in self.specs.values())
        # fullgraph=True turns dynamo's recompile limit into a hard failure: cover every shape
        # (each bucket, with and without classifier-free guidance) with room to spare.
        limit = max(torch._dynamo.config.recompile_limit, 2 * bucket_count + 8)
        self._recompile_limits = {"recompile_limit": limit, "accumulated_recompile_limit": max(
            torch._dynamo.config.accumulated_recompile_limit, 4 * limit)}
        self._apply_recompile_limits()

    def _apply_recompile_limits(self) -> None:
        """Dynamo's config is per thread (ContextVars): set here and on the device thread, which compiles."""
        for name, value in self._recompile_limits.items():
            setattr(torch._dynamo.config, name, value)

    # ---- read-only views -------------------------------------------------------------------
    def spec(self, model_id: str) -> ModelSpec:
        if model_id not in self.specs:
            raise EngineError(f"model {model_id!r} is not offered here; choose one of: {', '.join(self.specs)}")
        return self.specs[model_id]

    def mode_description(self, mode: ExecutionMode) -> str:
        return describe_mode(mode, self.device, self.config.cpu_compile_backend)

    def placement_for(self, model_id: str) -> Placement:
        loaded = self._models.get(model_id)
        if loaded is not None:
            return loaded.placement
        return choose_placement(self.spec(model_id), self.device, self.config.placement_override, self.world_size)

    def placement_description(self, model_id: str) -> str:
        try:
            return describe_placement(self.placement_for(model_id), self.device, self.world_size)
        except Exception as error:  # noqa: BLE001 - shown in the UI instead
            return str(error)

    def status(self) -> EngineStatus:
        with self._state_lock:
            buckets = [replace(status) for status in self._buckets.values()]
            models = {model_id: {"placement": loaded.placement.value, "weights_mb": round(loaded.weight_bytes / 1e6, 1),
                                 "compiled": loaded.compiled} for model_id, loaded in self._models.items()}
        return EngineStatus(device=self.device.badge, device_kind=self.device.kind, device_count=self.device.count,
                            models=models, buckets=buckets, compiles_total=self.counter.count, busy=self._busy.is_set())

    def bucket_status(self, model_id: str, mode: ExecutionMode, resolution: str, cfg: bool) -> BucketStatus:
        return replace(self._bucket((model_id, mode.value, resolution, cfg)))

    def buckets_for(self, model_id: str, mode: ExecutionMode) -> list[BucketStatus]:
        """Every configured bucket of ``model_id`` in ``mode`` (cold ones too), plus any other shape used."""
        spec = self.spec(model_id)
        cfg = self.uses_cfg(spec, spec.default_guidance)
        configured = [self.bucket_status(model_id, mode, str(bucket), cfg) for bucket in spec.buckets]
        with self._state_lock:
            others = [replace(status) for key, status in self._buckets.items()
                      if key[0] == model_id and key[1] == mode.value and key[3] != cfg]
        return configured + others

    def uses_cfg(self, spec: ModelSpec, guidance_scale: float) -> bool:
        """Classifier-free guidance doubles the batch: another static shape."""
        return spec.uses_cfg and guidance_scale > 1.0

    # ---- device jobs ----------------------------------------------------------------------
    def submit(self, job: Callable[[], Any]) -> Future:
        """Run ``job`` on the device thread (one at a time)."""

        def run() -> Any:
            self._busy.set()
            try:
                self._apply_recompile_limits()
                return job()
            finally:
                self._busy.clear()

        return self._worker.submit(run)

    def load(self, model_id: str) -> Any:
        """Load ``model_id`` now (blocking) and return its diffusers pipeline; EngineError if it cannot."""
        return self.submit(lambda: self._load(model_id).pipeline).result()

    def warmup(self, model_id: str, mode: ExecutionMode, buckets: tuple[Bucket, ...] | None = None,
               stop: threading.Event | None = None) -> list[BucketStatus]:
        """Warm each bucket of ``model_id`` in ``mode``, one device job per bucket (blocking).

        A bucket whose warmup fails is marked failed; the others still warm.
        """
        spec = self.spec(model_id)
        cfg = self.uses_cfg(spec, spec.default_guidance)
        results = []
        for bucket in buckets or spec.buckets:
            if (stop is not None and stop.is_set()) or self._closing.is_set():
                break
            results.append(self.submit(lambda b=bucket: self._warm_bucket(spec, mode, b, cfg)).result())
        return results

    def warmup_in_background(self, model_id: str, mode: ExecutionMode,
                             buckets: tuple[Bucket, ...] | None = None) -> threading.Thread:
        def run() -> None:
            try:
                self.warmup(model_id, mode, buckets)
            except Exception:  # noqa: BLE001 - bucket states already say what failed
                log.exception("background warmup of %s failed", model_id)

        thread = threading.Thread(target=run, name=f"warmup-{model_id}", daemon=True)
        thread.start()
        return thread

    def generate(self, request: GenerationRequest, stop: threading.Event | None = None) -> Iterator[Any]:
        """Run a validated request; yields Compiling, StepProgress, ImageResult and Stopped events.

        Raises EngineError if the request fails. Closing the generator early (a client went
        away) stops the job at its next denoising step.
        """
        stop = stop or threading.Event()
        if self.lockstep is not None and self.lockstep.failure:
            raise EngineError(self.lockstep.failure)
        events: queue.Queue = queue.Queue()
        done = object()

        def job() -> None:
            try:
                self._run_request(request, events.put, stop)
            except Exception as error:  # noqa: BLE001 - reported to the caller below
                log.warning("request failed: %s", _user_message(error))
                release_cached_memory(self.device)  # the next request starts clean
                events.put(error)
            finally:
                events.put(done)

        self.submit(job)
        try:
            while True:
                try:
                    event = events.get(timeout=_FAILURE_POLL_SECONDS)
                except queue.Empty:
                    if self.lockstep is not None and self.lockstep.failure:
                        raise EngineError(self.lockstep.failure) from None  # the device thread may be stuck
                    continue
                if event is done:
                    return
                if isinstance(event, Exception):
                    raise event if isinstance(event, EngineError) else EngineError(_user_message(event)) from event
                yield event
        finally:
            stop.set()  # a consumer that stops listening stops the job

    def close(self) -> None:
        """Drop queued jobs, wait for the running one, and free every loaded model."""
        self._closing.set()
        self._worker.shutdown(wait=True, cancel_futures=True)
        for model_id in list(self._models):  # the device thread has finished: safe from here
            self._unload(model_id)

    # ---- on the device thread -------------------------------------------------------------
    def _bucket(self, key: _ShapeKey) -> BucketStatus:
        with self._state_lock:
            if key not in self._buckets:
                self._buckets[key] = BucketStatus(model=key[0], mode=key[1], resolution=key[2], cfg=key[3])
            return self._buckets[key]

    def _load(self, model_id: str) -> _LoadedModel:
        loaded = self._models.get(model_id)
        if loaded is not None:
            loaded.last_used = time.monotonic()
            return loaded
        spec = self.spec(model_id)
        try:
            placement = choose_placement(spec, self.device, self.config.placement_override, self.world_size)
        except PlacementError as error:
            raise EngineError(str(error)) from None
        if placement is Placement.TENSOR_PARALLEL and self.lockstep is None:
            raise EngineError(
                f"{spec.id} needs tensor parallelism ({spec.total_gb:.0f} GB of weights, more than one "
                f"{self.device.name} holds): start the app over several chips with scripts/serve_tp.sh N")
        with self._in_lockstep(LoadModel(model_id)):
            try:
                ensure_available(spec)  # before freeing anything: a missing model must not evict the others
                self._make_room_for(spec)
                started = time.perf_counter()
                if placement is Placement.TENSOR_PARALLEL:
                    pipeline = self.lockstep.load_pipeline(spec, self.config.models_dir)
                else:
                    pipeline = load_pipeline(spec, self.device, self.config.models_dir)
            except ModelUnavailable as error:
                raise EngineError(str(error)) from None
            if placement is not Placement.TENSOR_PARALLEL:
                apply_placement(pipeline, placement, self.device)
        self._install_decode_guard(pipeline)
        loaded = _LoadedModel(spec, pipeline, placement, parameter_bytes(pipeline), last_used=time.monotonic())
        with self._state_lock:
            self._models[model_id] = loaded
        log.info("loaded %s (%s, %.1f MB) in %.2fs", model_id, placement.value, loaded.weight_bytes / 1e6,
                 time.perf_counter() - started)
        return loaded

    def _make_room_for(self, spec: ModelSpec) -> None:
        """Free loaded models (least recently used first) until ``spec`` fits the memory budget."""
        budget = self.config.memory_budget_gb
        while self._models:
            held_gb = sum(m.weight_bytes for m in self._models.values()) / 1e9
            if budget is not None and held_gb + spec.total_gb <= budget:
                return
            victim = min(self._models.values(), key=lambda m: m.last_used)
            self._unload(victim.spec.id)

    def _unload(self, model_id: str) -> None:
        with self._state_lock:
            loaded = self._models.pop(model_id)
            for key, status in self._buckets.items():
                if key[0] == model_id:
                    self._buckets[key] = BucketStatus(model=status.model, mode=status.mode,
                                                      resolution=status.resolution, cfg=status.cfg)
        if loaded.compiled:
            torch._dynamo.reset()  # compiled graphs hold the model's weights alive
            for other in self._models.values():
                other.compiled = False
            with self._state_lock:
                for key in list(self._buckets):
                    if key[1] == ExecutionMode.COMPILED.value:
                        self._buckets[key] = BucketStatus(model=key[0], mode=key[1], resolution=key[2], cfg=key[3])
        del loaded
        gc.collect()
        _release_freed_memory()
        log.info("unloaded %s", model_id)

    def _install_decode_guard(self, pipeline: Any) -> None:
        """Skip the VAE decode of a stopped image: a pre-hook on the decoder raises instead."""
        decoder = getattr(getattr(pipeline, "vae", None), "decoder", None)
        if decoder is None:
            return

        def guard(module: Any, args: Any) -> None:
            if getattr(self._skip_decode, "active", False):
                raise _DecodeSkipped()

        decoder.register_forward_pre_hook(guard)

    def _ensure_compiled(self, loaded: _LoadedModel) -> None:
        if not loaded.compiled:
            compile_for_placement(loaded.pipeline, loaded.placement, self.counter, loaded.spec)
            loaded.compiled = True

    def _call_pipeline(self, loaded: _LoadedModel, mode: ExecutionMode, prompt: str, bucket: Bucket,
                       steps: int, guidance: float, seed: int, observer: _StepObserver) -> Any:
        if mode is ExecutionMode.COMPILED:
            self._ensure_compiled(loaded)
        callback = observer if self.lockstep is None else self.lockstep.step_callback(observer)
        call = PipelineCall(loaded.spec.id, mode.value, prompt, bucket.width, bucket.height, steps, guidance, seed)
        with self._in_lockstep(call), execution_mode(mode, self.device), torch.inference_mode():
            output = loaded.pipeline(
                prompt=prompt, height=bucket.height, width=bucket.width, num_inference_steps=steps,
                generator=torch.Generator("cpu").manual_seed(seed),
                callback_on_step_end=callback, callback_on_step_end_tensor_inputs=["latents"],
                **loaded.spec.pipeline_kwargs(guidance))
            synchronize(self.device)
        if observer.final_latents is not None and not observer.interrupted:
            loaded.previewer.observe(observer.final_latents, output.images[0], bucket)
        return output

    def run_followed_call(self, call: PipelineCall) -> None:
        """Tensor parallel, follower ranks: make rank 0's pipeline call the same way (output unused)."""
        loaded = self._load(call.model_id)
        bucket = Bucket(call.width, call.height)
        observer = _StepObserver(lambda event: None, 0, call.num_inference_steps, threading.Event(), bucket,
                                 loaded.previewer, 0)
        self._call_pipeline(loaded, ExecutionMode(call.mode), call.prompt, bucket, call.num_inference_steps,
                            call.guidance_scale, call.seed, observer)

    def _in_lockstep(self, message: LoadModel | PipelineCall) -> Any:
        """Tensor parallel: rank 0 announces ``message`` so every rank makes the same call."""
        if self.lockstep is None:
            return contextlib.nullcontext()
        return self.lockstep.leading(message, passthrough=(_DecodeSkipped, EngineError))

    def _warm_bucket(self, spec: ModelSpec, mode: ExecutionMode, bucket: Bucket, cfg: bool) -> BucketStatus:
        status = self._bucket((spec.id, mode.value, str(bucket), cfg))
        if status.state is BucketState.WARM:
            return replace(status)
        try:
            loaded = self._load(spec.id)
            guidance = spec.default_guidance if cfg == self.uses_cfg(spec, spec.default_guidance) else (
                2.0 if cfg else 1.0)
            steps = max(spec.min_steps, min(self.config.warmup_steps, spec.max_steps))
            observer = _StepObserver(lambda event: None, 0, steps, threading.Event(), bucket, loaded.previewer, 0)
            self._compile_phase(loaded, mode, bucket, cfg, lambda: self._call_pipeline(
                loaded, mode, "warmup", bucket, steps, guidance, 0, observer))
        except Exception as error:  # noqa: BLE001 - a failed bucket must not stop the others
            with self._state_lock:
                status.state, status.error = BucketState.FAILED, _user_message(error)
            log.warning("warmup of %s %s %s failed: %s", spec.id, mode.value, bucket, status.error)
        return replace(status)

    def _compile_phase(self, loaded: _LoadedModel, mode: ExecutionMode, bucket: Bucket, cfg: bool,
                       call: Callable[[], Any]) -> Any:
        """Run the first call of a cold bucket, recording compile time and graph count."""
        status = self._bucket((loaded.spec.id, mode.value, str(bucket), cfg))
        with self._state_lock:
            status.state, status.error = BucketState.COMPILING, None
        before, cache_before, started = self.counter.count, cache_counters(), time.perf_counter()
        try:
            result = call()
        except BaseException:
            with self._state_lock:
                status.state = BucketState.COLD
            raise
        with self._state_lock:
            status.compile_seconds = round(time.perf_counter() - started, 3)
            status.compiles = self.counter.count - before
            status.from_cache = compile_source(cache_before, cache_counters()) if status.compiles else None
            status.state = BucketState.WARM
        return result

    def _run_request(self, request: GenerationRequest, emit: Callable[[Any], None], stop: threading.Event) -> None:
        loaded = self._load(request.model)
        spec = loaded.spec
        bucket = request.bucket
        cfg = self.uses_cfg(spec, request.guidance_scale)
        mode_text = self.mode_description(request.mode)
        for index in range(request.num_images):
            if stop.is_set():
                emit(Stopped(completed=index, reason="stopped"))
                return
            seed = request.seed + index
            status = self._bucket((spec.id, request.mode.value, str(bucket), cfg))
            warm = status.state is BucketState.WARM
            observer = _StepObserver(emit, index, request.num_inference_steps, stop, bucket, loaded.previewer,
                                     self.config.preview_every if request.previews else 0)
            call = lambda: self._call_pipeline(loaded, request.mode, request.prompt, bucket,  # noqa: E731
                                               request.num_inference_steps, request.guidance_scale, seed, observer)
            started = time.perf_counter()
            compiles_before = self.counter.count
            try:
                self._skip_decode.active = False
                if warm:
                    output = call()
                else:
                    emit(Compiling(resolution=str(bucket), mode=request.mode.value))
                    output = self._compile_phase(loaded, request.mode, bucket, cfg, call)
            except _DecodeSkipped:
                output = None
            finally:
                self._skip_decode.active = False
            finished = time.perf_counter()
            if observer.interrupted or output is None:
                emit(Stopped(completed=index, reason=f"stopped at step {observer.steps_done} of image {index + 1}"))
                return
            image = output.images[0]
            denoise_end = observer.last_step_at or finished
            timings = {
                "total_seconds": round(finished - started, 4),
                "denoise_seconds": round(denoise_end - started, 4),
                "decode_seconds": round(finished - denoise_end, 4),
                "steps_per_second": round(request.num_inference_steps / max(denoise_end - started, 1e-9), 2),
                "compiles": self.counter.count - compiles_before,
            }
            parameters = {**request.as_dict(), "seed": seed, "resolution": str(bucket), "num_images": 1,
                          "mode_description": mode_text, "device": self.device.badge,
                          "scheduler": type(loaded.pipeline.scheduler).__name__, "timings": timings, "warm": warm}
            parameters.pop("width"), parameters.pop("height")
            pngmeta.attach(image, parameters)
            emit(ImageResult(index=index, image=image, seed=seed, parameters=parameters, timings=timings, warm=warm))


def _user_message(error: BaseException) -> str:
    """One line for users: the error's own message, never a stack trace."""
    if isinstance(error, (EngineError, ModelUnavailable, TensorParallelFailure)):
        return str(error)
    if isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower():
        return "The device ran out of memory for this request; try a smaller resolution or fewer images."
    text = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
    return f"Generation failed: {text}"


def _release_freed_memory() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them otherwise), so RSS shows the release."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
