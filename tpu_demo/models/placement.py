"""Placement strategies: how a pipeline's components go onto the device(s), and what compiles.

Whole (``pipe.to(device)``) and resident (transformer and VAE on the device, text encoders on the host)
move no weights per request and compile the full transformer; model CPU offload moves each model to the
device only while it runs and compiles the repeated blocks; tensor parallel shards over chips
(``distributed/group.py``).
"""

from __future__ import annotations

from typing import Any

from tpu_demo.core.catalog import ModelSpec, Placement
from tpu_demo.device import DeviceInfo, offload_device
from tpu_demo.models.placement_plan import plan_placement
from tpu_demo.models.prompt_cache import PromptEncoder, split_text_encoders


class PlacementError(RuntimeError):
    """The model cannot be placed on this machine the requested way."""


def choose_placement(spec: ModelSpec, device: DeviceInfo, override: Placement | None = None,
                     world_size: int = 1) -> Placement:
    """The placement for ``spec`` on ``device``: the operator's override, else by size.

    Started over several chips (``world_size`` > 1), tensor parallel where supported. On one
    chip, the first that fits (see ``placement_plan``): whole, resident (text encoders on the
    host), CPU offload; else tensor parallel, whose load then says to start over several chips.
    """
    if override is not None:
        if override not in spec.placements:
            allowed = ", ".join(p.value for p in spec.placements)
            raise PlacementError(f"{spec.id} does not support placement {override.value!r}; it supports: {allowed}")
        return override
    if world_size > 1 and Placement.TENSOR_PARALLEL in spec.placements:
        return Placement.TENSOR_PARALLEL
    if device.kind == "cpu":  # host memory is the only memory: offloading to it changes nothing
        return Placement.WHOLE if Placement.WHOLE in spec.placements else spec.placements[0]
    chip_gb = (device.memory_bytes_per_device or 0) / 1e9
    if not spec.component_gb or chip_gb <= 0:  # sizes unknown (tiny stand-ins): the catalog's first choice
        return spec.placements[0]
    planned = plan_placement(spec, chip_gb)
    if planned is not None:
        return planned
    return Placement.TENSOR_PARALLEL if Placement.TENSOR_PARALLEL in spec.placements else spec.placements[0]


def describe_placement(placement: Placement, device: DeviceInfo, world_size: int = 1) -> str:
    """One line for the UI, e.g. "offload: transformer on tpu only while it runs"."""
    if placement is Placement.OFFLOAD:
        return f"offload: text encoders, transformer and VAE each on {device.kind} only while it runs"
    if placement is Placement.RESIDENT:
        return (f"resident: transformer and VAE stay on {device.kind}, text encoders run on the host; "
                "a repeated prompt reuses its cached embeddings")
    if placement is Placement.TENSOR_PARALLEL:
        return f"tensor parallel: transformer and text encoder sharded over {world_size} {device.kind} ranks"
    return f"whole on device: every component stays on {device.kind}"


def apply_placement(pipeline: Any, placement: Placement, device: DeviceInfo,
                    spec: ModelSpec | None = None) -> PromptEncoder | None:
    """Move ``pipeline`` (single process) onto the device the ``placement`` way.

    Returns the host-side prompt encoder of the resident placement (None for the others).
    """
    if placement is Placement.WHOLE:
        pipeline.to(device.torch_device)
    elif placement is Placement.RESIDENT:
        if spec is None:
            raise PlacementError("the resident placement needs the model's catalog entry")
        encoder = split_text_encoders(pipeline, spec)  # text encoders stay on the host
        pipeline.to(device.torch_device)  # transformer and VAE
        return encoder
    elif placement is Placement.OFFLOAD:
        kwargs = {}
        if offload_device(device) is not None:
            kwargs["device"] = offload_device(device)
        pipeline.enable_model_cpu_offload(**kwargs)
    else:
        raise PlacementError(
            "tensor-parallel placement needs one process per chip: start the app with "
            "scripts/serve_tp.sh N (torchrun) on a host with several chips")
    return None


def compile_for_placement(pipeline: Any, placement: Placement, backend: Any, spec: ModelSpec) -> None:
    """Compile the transformer for static shapes (one graph per bucket), as the source document does.

    Under offload the hooks cannot be traced, so only the repeated blocks compile (diffusers'
    ``compile_repeated_blocks``; the catalog names the block classes where the model does not).
    """
    options = dict(backend=backend, fullgraph=True, dynamic=False)
    if placement is Placement.OFFLOAD:
        if spec.repeated_blocks:
            pipeline.transformer._repeated_blocks = list(spec.repeated_blocks)
        pipeline.transformer.compile_repeated_blocks(**options)
    else:
        pipeline.transformer.compile(**options)
