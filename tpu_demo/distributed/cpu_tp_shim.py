"""Let diffusers' tensor parallelism load on CPU ranks (gloo): used ONLY when the device is cpu.

Why this exists: the tensor-parallel path must be testable on machines without chips (CI,
laptops), with one process per rank on the gloo backend. diffusers 0.42.1 blocks that in
exactly two places, neither of which is about the math:

1. ``diffusers.hooks.tensor_parallel._SUPPORTED_TP_DEVICES`` lists "cuda", "neuron", "tpu" and
   "xpu", so a ``DeviceMesh("cpu", ...)`` is refused before anything is sharded;
2. ``ModelMixin._resolve_parallel_config`` picks each rank's device as
   ``rank % torch.accelerator.device_count()``, which is a division by zero without an
   accelerator.

Everything else (``parallelize_module``, DTensor collectives over gloo, reading each rank's
slice off the safetensors file) runs unchanged on CPU. The shim adds "cpu" to that tuple and
makes ``torch.accelerator.device_count()`` report one device, only while a tensor-parallel
model is loaded, and restores both afterwards. TPU and CUDA never enter it (see
``tensor_parallel.load_tensor_parallel_pipeline``).
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
