"""The model pool: each model loaded once, placed on the device, freed least-recently-used first."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager

import torch

from tpu_demo.core.catalog import ModelSpec, Placement
from tpu_demo.core.errors import EngineError
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.device import DeviceInfo
from tpu_demo.distributed.lockstep import LoadModel, Lockstep
from tpu_demo.engine.bucket_book import BucketBook
from tpu_demo.engine.previews import LatentPreviewer
from tpu_demo.engine.step_observer import DecodeGuard, apply_decode_guard
from tpu_demo.models.loading import ModelUnavailable, ensure_available, load_pipeline, loading_text, parameter_bytes
from tpu_demo.models.placement import PlacementError, apply_placement, choose_placement
from tpu_demo.models.prompt_cache import PromptEncoder
from tpu_demo.models.styles import StyleAdapters, style_refusal
from tpu_demo.models.upsampling import PromptUpsampler, build_upsampler

log = logging.getLogger("tpu_demo.engine")


@dataclass
class LoadedModel:
    spec: ModelSpec
    pipeline: Any
    placement: Placement
    weight_bytes: int
    compiled: bool = False
    last_used: float = 0.0
    previewer: LatentPreviewer = field(default_factory=LatentPreviewer)
    #: resident placement: the host-side text encoders and their embedding cache
    prompt_encoder: PromptEncoder | None = None
    #: the hot-swappable style adapter slot (models/styles.py); None: the model offers no styles here
    styles: StyleAdapters | None = None
    #: rewrites a typed prompt per image (models/upsampling.py); None: the model declares no upsampler
    upsampler: PromptUpsampler | None = None

    def slot_bypass(self, mode: ExecutionMode) -> contextlib.AbstractContextManager:
        """Around a call in ``mode``: an eager call with no style skips the style slot (models/styles.py)."""
        return self.styles.bypassed_when_unstyled(mode) if self.styles else contextlib.nullcontext()

    def call_inputs(self, prompt: str, guidance: float, negative_prompt: str = "") -> dict[str, Any]:
        """The pipeline call's prompt arguments: ``prompt=`` or, resident, the (cached) embeddings."""
        if self.prompt_encoder is None:
            return {"prompt": prompt, **self.spec.pipeline_kwargs(guidance, negative_prompt)}
        return self.prompt_encoder.call_inputs(prompt, guidance, self.pipeline.transformer.device, negative_prompt)

    def batch_call_inputs(self, prompts: list[str], guidance: float, negatives: list[str]) -> dict[str, Any]:
        """The prompt arguments of a call of ``len(prompts)`` images: one image's are exactly
        ``call_inputs``; for several, prompts become lists and (resident placement) each image's
        cached embeddings are stacked along the batch dimension."""
        per_image = [self.call_inputs(prompt, guidance, negative) for prompt, negative in zip(prompts, negatives)]
        if len(per_image) == 1:
            return per_image[0]
        merged: dict[str, Any] = {}
        for name, value in per_image[0].items():
            values = [inputs[name] for inputs in per_image]
            if isinstance(value, torch.Tensor):
                merged[name] = torch.cat(values, dim=0)
            elif name in ("prompt", "negative_prompt"):
                merged[name] = values
            else:
                merged[name] = value  # guidance, sequence length: the same for the whole call
        return merged


@dataclass(frozen=True)
class PoolSettings:
    models_dir: Path
    placement_override: Placement | None = None
    #: GB of weights that may stay loaded together; None keeps one model at a time
    memory_budget_gb: float | None = None


class ModelPool:
    """Loaded pipelines by model id. Only the device thread loads and unloads."""

    def __init__(self, settings: PoolSettings, device: DeviceInfo, book: BucketBook, decode_guard: DecodeGuard,
                 lockstep: Lockstep | None = None,
                 in_lockstep: Callable[[LoadModel], ContextManager] = lambda message: contextlib.nullcontext()):
        self.settings, self.device, self.book, self.decode_guard = settings, device, book, decode_guard
        self.lockstep, self.in_lockstep = lockstep, in_lockstep
        self.world_size = lockstep.world.world_size if lockstep is not None else 1
        self._models: dict[str, LoadedModel] = {}
        #: "loading <model>, <size> ..." while a load runs (the page and /ready show it), else None
        self.loading: str | None = None

    def get(self, model_id: str) -> LoadedModel | None:
        return self._models.get(model_id)

    def items(self) -> list[tuple[str, LoadedModel]]:
        return list(self._models.items())

    def loaded_ids(self) -> list[str]:
        return list(self._models)

    def fits_keeping(self, spec: ModelSpec, keep: set[str]) -> bool:
        """Whether ``spec`` can be loaded (or is loaded) without freeing any model in ``keep``."""
        if spec.id in self._models:
            return True
        kept = [m for m in self._models.values() if m.spec.id in keep]
        if not kept:
            return True
        budget = self.settings.memory_budget_gb
        return budget is not None and sum(m.weight_bytes for m in kept) / 1e9 + spec.total_gb <= budget

    def placement_for(self, spec: ModelSpec) -> Placement:
        loaded = self._models.get(spec.id)
        if loaded is not None:
            return loaded.placement
        return choose_placement(spec, self.device, self.settings.placement_override, self.world_size)

    def loading_text(self, spec: ModelSpec) -> str:
        return loading_text(spec, self.settings.models_dir)

    def load(self, spec: ModelSpec, keep: frozenset[str] = frozenset()) -> LoadedModel:
        """The loaded model for ``spec``, loading (and evicting others, never those in ``keep``) first if needed."""
        loaded = self._models.get(spec.id)
        if loaded is not None:
            loaded.last_used = time.monotonic()
            return loaded
        self.loading = self.loading_text(spec)
        try:
            return self._load(spec, keep)
        finally:
            self.loading = None

    def _load(self, spec: ModelSpec, keep: frozenset[str]) -> LoadedModel:
        try:
            placement = choose_placement(spec, self.device, self.settings.placement_override, self.world_size)
        except PlacementError as error:
            raise EngineError(str(error)) from None
        if placement is Placement.TENSOR_PARALLEL and self.lockstep is None:
            raise EngineError(
                f"{spec.id} needs tensor parallelism ({spec.total_gb:.0f} GB of weights, more than one "
                f"{self.device.name} holds): start the app over several chips with scripts/serve_tp.sh N")
        with self.in_lockstep(LoadModel(spec.id)):
            try:
                ensure_available(spec)  # before freeing anything: a missing model must not evict the others
                self._make_room_for(spec, keep)
                started = time.perf_counter()
                if placement is Placement.TENSOR_PARALLEL:
                    pipeline = self.lockstep.load_pipeline(spec, self.settings.models_dir)
                else:
                    pipeline = load_pipeline(spec, self.device, self.settings.models_dir)
            except ModelUnavailable as error:
                raise EngineError(str(error)) from None
            prompt_encoder = None
            if placement is not Placement.TENSOR_PARALLEL:
                prompt_encoder = apply_placement(pipeline, placement, self.device, spec)
        apply_decode_guard(pipeline, self.decode_guard)
        # before any compile: the hotswap slot must be in the graph from its first trace
        styles = StyleAdapters(pipeline, spec) if style_refusal(spec, placement) is None else None
        weight_bytes = parameter_bytes(pipeline)
        if prompt_encoder is not None:  # resident: the host-side text encoders count too
            weight_bytes += parameter_bytes(prompt_encoder.encoder_pipeline)
        # the text encoder's pipeline: resident placement keeps it on the host
        upsampler = build_upsampler(spec, prompt_encoder.encoder_pipeline if prompt_encoder else pipeline)
        loaded = LoadedModel(spec, pipeline, placement, weight_bytes, last_used=time.monotonic(),
                             prompt_encoder=prompt_encoder, styles=styles, upsampler=upsampler)
        self._models[spec.id] = loaded
        log.info("loaded %s (%s, %.1f MB) in %.2fs", spec.id, placement.value, loaded.weight_bytes / 1e6,
                 time.perf_counter() - started)
        return loaded

    def _make_room_for(self, spec: ModelSpec, keep: frozenset[str] = frozenset()) -> None:
        """Free loaded models (least recently used first, none in ``keep``) until ``spec`` fits the memory budget."""
        budget = self.settings.memory_budget_gb
        while victims := [m for m in self._models.values() if m.spec.id not in keep]:
            held_gb = sum(m.weight_bytes for m in self._models.values()) / 1e9
            if budget is not None and held_gb + spec.total_gb <= budget:
                return
            victim = min(victims, key=lambda m: m.last_used)
            self.unload(victim.spec.id)

    def unload(self, model_id: str) -> None:
        loaded = self._models.pop(model_id)
        self.book.reset(lambda key: key.model == model_id)
        if loaded.compiled:
            torch._dynamo.reset()  # compiled graphs hold the model's weights alive; every model's graphs go
            for other in self._models.values():
                other.compiled = False
            self.book.reset(lambda key: ExecutionMode(key.mode).traits.compiled)
        del loaded
        gc.collect()
        _release_freed_memory()
        log.info("unloaded %s", model_id)

    def unload_all(self) -> None:
        for model_id in list(self._models):
            self.unload(model_id)


def _release_freed_memory() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them otherwise), so RSS shows the release."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
