"""A model's style adapters on its loaded pipeline, swapped in place so a compiled graph stays valid.

One adapter slot, present from the load on (``enable_lora_hotswap`` before anything compiles). Every
switch, to no style or to another strength included, is a hot swap into the same tensors, so nothing
recompiles and the eager modes take the same path. A strength is folded into ``lora_B``, never set
through ``set_adapters``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from tpu_demo.core.catalog import ASSETS_DIR, ModelSpec, Placement
from tpu_demo.core.errors import EngineError
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.styles import StyleSpec

log = logging.getLogger("tpu_demo.engine")

#: the one adapter name the transformer carries
ADAPTER = "style"
#: placements whose pipeline takes the hot swap; tensor parallel shards the transformer over ranks
#: that would all have to swap in lockstep, which is not built
#: (docs/models.md#styles-lora-adapters-that-swap-without-recompiling)
STYLE_PLACEMENTS = (Placement.WHOLE, Placement.RESIDENT, Placement.OFFLOAD)


def style_refusal(spec: ModelSpec, placement: Placement) -> str | None:
    """Why ``spec`` cannot take a style under ``placement`` (None: it can)."""
    if not spec.styles:
        return f"{spec.id} offers no styles"
    if placement not in STYLE_PLACEMENTS:
        return (f"styles are not available for {spec.id} under the {placement.value} placement "
                "(each rank would have to swap the adapter in lockstep); choose the style None")
    return None


def style_path(style: StyleSpec) -> Path:
    """Where the adapter's file is on this machine (a hub file only from the local cache)."""
    if style.source.startswith("assets:"):
        return ASSETS_DIR / style.source.removeprefix("assets:")
    if style.source.startswith("hub:"):
        from huggingface_hub import hf_hub_download

        org, repo, filename = style.source.removeprefix("hub:").split("/", 2)
        return Path(hf_hub_download(f"{org}/{repo}", filename, local_files_only=True))
    return Path(style.source)


def _is_up(key: str) -> bool:
    return ".lora_B." in key or ".lora_up." in key


def _module_keys(state_dict: dict[str, torch.Tensor]) -> set[str]:
    return {key.split(".lora_")[0] for key in state_dict if ".lora_" in key}


class StyleAdapters:
    """The adapter slot of one loaded pipeline and the styles that go into it (device thread only)."""

    def __init__(self, pipeline: Any, spec: ModelSpec):
        self.pipeline, self.spec = pipeline, spec
        self.state_dicts: dict[str, dict[str, torch.Tensor]] = {}
        for style in spec.styles:
            path = style_path(style)
            if not path.is_file():
                raise EngineError(f"style {style.name!r} of {spec.id}: no adapter file at {path}")
            state_dict, alphas = type(pipeline).lora_state_dict(str(path), return_alphas=True)
            # a file may be stored narrower (float16 halves it) than the transformer computes
            dtype = pipeline.transformer.dtype
            self.state_dicts[style.name] = {**{key: value.to(dtype) for key, value in state_dict.items()},
                                            **(alphas or {})}
        # the slot is shaped by the adapter touching the most layers; the others must touch a subset
        self.widest = max(self.state_dicts, key=lambda name: len(_module_keys(self.state_dicts[name])))
        modules = _module_keys(self.state_dicts[self.widest])
        for name, state_dict in self.state_dicts.items():
            if not _module_keys(state_dict) <= modules:
                raise EngineError(f"style {name!r} of {spec.id} adapts layers that style {self.widest!r} does not; "
                                  "styles swapped on one graph must adapt the same layers")
        self.rank = max(value.shape[0] for sd in self.state_dicts.values() for key, value in sd.items()
                        if ".lora_A." in key or ".lora_down." in key)
        pipeline.enable_lora_hotswap(target_rank=self.rank)
        pipeline.load_lora_weights(self._weights("", 0.0), adapter_name=ADAPTER)
        self.current: tuple[str, float] = ("", 0.0)
        #: seconds the last swap took, and how many swaps were made (the benchmark reads them)
        self.last_swap_seconds = 0.0
        self.swaps = 0

    def _weights(self, style: str, scale: float) -> dict[str, torch.Tensor]:
        """A fresh state dict of ``style`` at ``scale`` (no style: the widest adapter at 0)."""
        source = self.state_dicts[style or self.widest]
        return {key: value * scale if _is_up(key) else value.clone() for key, value in source.items()}

    def apply(self, style: str, scale: float) -> bool:
        """Make the slot hold ``style`` at ``scale`` ("" for none); False when it already does."""
        wanted = (style, float(scale)) if style else ("", 0.0)
        if wanted == self.current:
            return False
        started = time.perf_counter()
        # inference mode: under offload the hooks moved the weights inside the pipeline's own inference
        # mode, and an inference tensor may only be updated in place there
        with torch.inference_mode():
            self.pipeline.load_lora_weights(self._weights(*wanted), adapter_name=ADAPTER, hotswap=True)
        self.current = wanted
        self.last_swap_seconds = time.perf_counter() - started
        self.swaps += 1
        log.info("style %s at %.2f on %s in %.1f ms", wanted[0] or "None", wanted[1], self.spec.id,
                 1000 * self.last_swap_seconds)
        return True

    @contextlib.contextmanager
    def bypassed_when_unstyled(self, mode: ExecutionMode) -> Iterator[None]:
        """Run an eager call with no style without the slot's layers: its output adds exactly 0, so
        the pixels are the same, and on a small model its work is a third of the call (1.34x on
        tiny-shapes). A compiled call keeps the layers on: its graph guards on the flag, and turning
        it off would compile a second graph per bucket. The eager modes never run that graph."""
        if mode.traits.compiled or self.current[0]:
            yield
            return
        self.pipeline.transformer.disable_lora()
        try:
            yield
        finally:
            self.pipeline.transformer.enable_lora()
