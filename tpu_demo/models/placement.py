"""Placement strategies: how a pipeline's components go onto the device(s), and what compiles.

- whole on device: ``pipe.to(device)``; compiled mode compiles the full transformer.
- model CPU offload: ``enable_model_cpu_offload()``; each model moves to the device only while
  it runs. Offload hooks cannot be traced, so compiled mode compiles the repeated blocks.
- tensor parallel: transformer and text encoder sharded over chips; see tensor_parallel.py.
"""

from __future__ import annotations

from typing import Any

from tpu_demo.core.catalog import ModelSpec, Placement
from tpu_demo.device import DeviceInfo, offload_device

#: Keep this share of device memory free for activations, the VAE decode and the compiler.
_MEMORY_HEADROOM = 0.85


class PlacementError(RuntimeError):
    """The model cannot be placed on this machine the requested way."""


def choose_placement(spec: ModelSpec, device: DeviceInfo, override: Placement | None = None,
                     world_size: int = 1) -> Placement:
    """The placement for ``spec`` on ``device``: the operator's override, else by size.

    Whole if everything fits on one device, else offload if the largest component fits, else
    tensor parallel over the chips.
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
    usable_gb = (device.memory_bytes_per_device or 0) / 1e9 * _MEMORY_HEADROOM
    if not spec.component_gb or usable_gb <= 0:
        return spec.placements[0]
    if spec.total_gb <= usable_gb and Placement.WHOLE in spec.placements:
        return Placement.WHOLE
    if spec.largest_component[1] <= usable_gb and Placement.OFFLOAD in spec.placements:
        return Placement.OFFLOAD
    if Placement.TENSOR_PARALLEL in spec.placements:
        return Placement.TENSOR_PARALLEL
    return spec.placements[0]


def describe_placement(placement: Placement, device: DeviceInfo, world_size: int = 1) -> str:
    """One line for the UI, e.g. "offload: transformer on tpu only while it runs"."""
    if placement is Placement.OFFLOAD:
        return f"offload: text encoders, transformer and VAE each on {device.kind} only while it runs"
    if placement is Placement.TENSOR_PARALLEL:
        return f"tensor parallel: transformer and text encoder sharded over {world_size} {device.kind} ranks"
    return f"whole on device: every component stays on {device.kind}"


def apply_placement(pipeline: Any, placement: Placement, device: DeviceInfo) -> None:
    """Move ``pipeline`` (single process) onto the device the ``placement`` way."""
    if placement is Placement.WHOLE:
        pipeline.to(device.torch_device)
    elif placement is Placement.OFFLOAD:
        kwargs = {}
        if offload_device(device) is not None:
            kwargs["device"] = offload_device(device)
        pipeline.enable_model_cpu_offload(**kwargs)
    else:
        raise PlacementError(
            "tensor-parallel placement needs one process per chip: start the app with "
            "scripts/serve_tp.sh N (torchrun) on a host with several chips")


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
