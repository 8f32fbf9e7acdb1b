"""Parameter counts and bytes of the real architectures, measured on the ``meta`` device.

Building a component under ``torch.device("meta")`` allocates no memory and reads no weights,
so a 24B-parameter text encoder is counted in a second on any laptop. The counts back the
catalog's ``component_gb`` (the placement decisions) with the published configurations.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

import torch

from tpu_demo.core.architectures import ARCHITECTURES, ComponentArchitecture


def _with_depth(config: Mapping[str, object], keys: tuple[str, ...], depth: int) -> dict:
    """A copy of ``config`` with every repeated-block count in ``keys`` set to ``depth``."""
    config = copy.deepcopy(dict(config))
    for key in keys:
        *parents, leaf = key.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[leaf] = depth
    return config


def build_component(component: ComponentArchitecture, depth: int | None = None, device: str = "meta",
                    dtype: torch.dtype | None = None) -> Any:
    """The component's real class from its configuration; ``depth`` reduces its repeated blocks."""
    config = component.config if depth is None else _with_depth(component.config, component.depth_keys, depth)
    previous_dtype = torch.get_default_dtype()
    if dtype is not None:  # create the weights in ``dtype``: no float32 copy of a multi-GB model
        torch.set_default_dtype(dtype)
    try:
        module = _construct(component, config, device)
    finally:
        torch.set_default_dtype(previous_dtype)
    return module.to(dtype) if dtype is not None else module


def _construct(component: ComponentArchitecture, config: Mapping[str, object], device: str) -> Any:
    if component.library == "diffusers":
        import diffusers

        with torch.device(device):
            module = getattr(diffusers, component.class_name)(**config)
    else:
        import transformers

        config_class = getattr(transformers, component.config_class or component.class_name.replace(
            "EncoderModel", "Config").replace("ForConditionalGeneration", "Config"))
        with torch.device(device):
            module = getattr(transformers, component.class_name)(config_class(**config))
    return module


def parameter_count(module: torch.nn.Module) -> int:
    """Elements of everything the checkpoint stores: parameters and persistent buffers (SD3's
    384x384 positional table is 0.23B of them), tied weights counted once."""
    tensors = {id(t): t for t in module.state_dict(keep_vars=True).values()}
    return sum(t.numel() for t in tensors.values())


def component_sizes(model_id: str, bytes_per_parameter: int = 2) -> dict[str, dict[str, float]]:
    """``{component: {"parameters": count, "gb": gigabytes}}`` of a real model, in bf16 by default."""
    sizes = {}
    for name, component in ARCHITECTURES[model_id].components.items():
        count = parameter_count(build_component(component))
        sizes[name] = {"parameters": count, "gb": count * bytes_per_parameter / 1e9}
    return sizes
