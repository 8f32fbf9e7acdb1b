"""Let diffusers' tensor parallelism load on CPU ranks (gloo): used only when the device is cpu.

Only while a tensor-parallel model loads, diffusers' ``_SUPPORTED_TP_DEVICES`` also lists "cpu" and
``torch.accelerator.device_count()`` reports at least one device (a rank's device is ``rank % count``);
both are restored afterwards. Sharding, collectives and slice reads are not touched; TPU and CUDA never
enter it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def cpu_tensor_parallel_allowed() -> Iterator[None]:
    """While the body runs, diffusers accepts a "cpu" mesh and sees one (CPU) device per rank."""
    from diffusers.hooks import tensor_parallel as tp_hooks

    saved_devices = tp_hooks._SUPPORTED_TP_DEVICES
    saved_device_count = torch.accelerator.device_count
    tp_hooks._SUPPORTED_TP_DEVICES = tuple(saved_devices) + ("cpu",)
    torch.accelerator.device_count = lambda: max(1, saved_device_count())
    try:
        yield
    finally:
        tp_hooks._SUPPORTED_TP_DEVICES = saved_devices
        torch.accelerator.device_count = saved_device_count
