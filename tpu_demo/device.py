"""Everything that differs between TPU, CUDA and CPU lives here, and only here.

The rest of the package asks this module which device to use, how to run an execution mode
on it, which ``torch.compile`` backend and which ``torch.distributed`` backend to use. On a
machine without TPU chips (or without torch-tpu) every TPU branch is skipped and the
equivalent CPU/CUDA path runs: plain eager for the two eager modes, inductor/aot_eager for
compiled mode, gloo/nccl for collectives. Nothing here pretends to be a TPU.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from tpu_demo.core.modes import ExecutionMode

log = logging.getLogger("tpu_demo.device")


@dataclass(frozen=True)
class DeviceInfo:
    """What the app runs on: ``kind`` is "tpu", "cuda" or "cpu"."""

    kind: str
    count: int
    name: str
    memory_bytes_per_device: int | None

    @property
    def torch_device(self) -> str:
        return self.kind

    @property
    def badge(self) -> str:
        """Short label for the page header, e.g. "TPU v6e x 4" or "CPU"."""
        return self.name if self.count <= 1 else f"{self.name} x {self.count}"


def _torch_tpu_hardware():
    """torch-tpu's PCI scanner (reads /sys only, starts no runtime), or None without torch-tpu."""
    try:
        from torch_tpu._internal.utils import hardware  # internal module: guarded on purpose
    except Exception:  # noqa: BLE001 - torch-tpu absent or a different version
        return None
    return hardware


def _tpu_runtime_ready() -> tuple[bool, str]:
    """Whether torch-tpu has registered and initialised the "tpu" accelerator, and if not, why."""
    try:
        accelerator = torch.accelerator.current_accelerator()
        if accelerator is None or accelerator.type != "tpu":
            return False, f"the current accelerator is {getattr(accelerator, 'type', None)!r}, not 'tpu'"
        count = torch.accelerator.device_count()
        return count > 0, f"torch.accelerator.device_count() is {count}"
    except Exception as error:  # noqa: BLE001 - no accelerator API / runtime refused
        return False, f"{type(error).__name__}: {error}"


def _load_torch_tpu() -> str | None:
    """Load torch-tpu when autoload was disabled (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``); why it failed, or None."""
    try:
        import torch_tpu._loader

        torch_tpu._loader.load()
    except Exception as error:  # noqa: BLE001 - reported by the caller, which falls back to CUDA/CPU
        return f"torch_tpu._loader.load() raised {type(error).__name__}: {error}"
    return None


def detect_device(preferred: str | None = None) -> DeviceInfo:
    """Detect TPU (torch-tpu present and chips visible), else CUDA, else CPU; never raises.

    ``preferred`` ("tpu", "cuda", "cpu") restricts detection, e.g. to force CPU on a TPU host.
    """
    hardware = _torch_tpu_hardware()
    if preferred == "tpu" and hardware is None:
        log.warning("TPU requested but torch-tpu is not importable here; falling back to CUDA/CPU")
    if preferred in (None, "tpu") and hardware is not None:
        tpu = _detect_tpu(hardware)
        if tpu is not None:
            return tpu
    if preferred in (None, "cuda") and torch.cuda.is_available():
        return DeviceInfo(
            kind="cuda",
            count=torch.cuda.device_count(),
            name=torch.cuda.get_device_name(0),
            memory_bytes_per_device=torch.cuda.get_device_properties(0).total_memory,
        )
    return DeviceInfo(kind="cpu", count=1, name="CPU", memory_bytes_per_device=_system_memory_bytes())


def _detect_tpu(hardware) -> DeviceInfo | None:
    """The TPU when chips are visible and torch-tpu starts on them; a failure is logged with its reason
    (a TPU host that silently served on CPU would look like a slow TPU)."""
    try:
        chips = hardware.get_tpu_device_count()
    except Exception as error:  # noqa: BLE001 - a scanner failure must not stop the app
        log.warning("TPU detection failed (torch-tpu hardware scan raised %s: %s); serving on CUDA/CPU",
                    type(error).__name__, error)
        return None
    if chips <= 0:
        return None  # no chips: the normal case off TPU hosts, nothing to report
    ready, why = _tpu_runtime_ready()
    if not ready:
        load_error = _load_torch_tpu()
        ready, why = _tpu_runtime_ready()
        why = load_error or why
    if not ready:
        log.warning("%d TPU chip(s) visible but torch-tpu did not start (%s); serving on CUDA/CPU", chips, why)
        return None
    try:
        return DeviceInfo(kind="tpu", count=torch.accelerator.device_count(), name=hardware.get_tpu_device_name(),
                          memory_bytes_per_device=hardware.get_hbm_bytes_per_device())
    except Exception as error:  # noqa: BLE001
        log.warning("TPU detection failed reading the chips (%s: %s); serving on CUDA/CPU", type(error).__name__, error)
        return None


def _system_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@contextlib.contextmanager
def execution_mode(mode: ExecutionMode, device: DeviceInfo) -> Iterator[None]:
    """Run the body in ``mode``.

    The transformer may already be compiled; the eager modes then run it eagerly through
    ``torch.compiler.set_stance("force_eager")`` so one loaded pipeline serves every mode.
    On TPU the eager modes also select torch-tpu's dispatch mode around the call.
    """
    if mode is ExecutionMode.COMPILED:
        yield
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.compiler.set_stance("force_eager"))
        if device.kind == "tpu":
            eager_mode = torch.tpu.EagerMode.DEFER_AND_FUSE if mode is ExecutionMode.EAGER_FUSED else torch.tpu.EagerMode.DEFER_NEVER
            stack.enter_context(torch.tpu.set_eager_mode(eager_mode))
        yield


def compile_backend_name(device: DeviceInfo, cpu_backend: str) -> str:
    """``torch.compile`` backend: torch-tpu's "tpu" on TPU, else the configured one (inductor...)."""
    return "tpu" if device.kind == "tpu" else cpu_backend


def describe_mode(mode: ExecutionMode, device: DeviceInfo, cpu_backend: str) -> str:
    """What actually runs, for the UI: e.g. "compiled (inductor on cpu)"."""
    if mode is ExecutionMode.COMPILED:
        return f"compiled ({compile_backend_name(device, cpu_backend)} on {device.kind})"
    if device.kind == "tpu":
        constant = "DEFER_AND_FUSE" if mode is ExecutionMode.EAGER_FUSED else "DEFER_NEVER"
        return f"{mode.title} (EagerMode.{constant} on tpu)"
    return f"{mode.title} (plain eager on {device.kind})"


def modes_running_same_code(device: DeviceInfo) -> tuple[tuple[ExecutionMode, ...], ...]:
    """Groups of modes that run the very same code here: off TPU both eager modes are plain eager
    (``DEFER_AND_FUSE`` is torch-tpu's), so a comparison must say their difference is noise."""
    if device.kind == "tpu":
        return ()
    return ((ExecutionMode.EAGER, ExecutionMode.EAGER_FUSED),)


def distributed_backend(device: DeviceInfo) -> str:
    """``torch.distributed`` backend: "tpu_dist" on TPU, "nccl" on CUDA, "gloo" on CPU."""
    return {"tpu": "tpu_dist", "cuda": "nccl"}.get(device.kind, "gloo")


def device_mesh(device: DeviceInfo, ranks: list[int]):
    """The tensor-parallel mesh over ``ranks``: ``DeviceMesh("tpu", ranks)`` on TPU, as the source
    document builds it; ``DeviceMesh(<device kind>, ranks)`` elsewhere."""
    from torch.distributed.device_mesh import DeviceMesh  # looked up per call: the tests' TPU stand-in records it

    return DeviceMesh(device.kind, ranks)


def synchronize(device: DeviceInfo) -> None:
    """Wait for queued device work, so timings measure compute and not dispatch."""
    if device.kind != "cpu":
        with contextlib.suppress(Exception):
            torch.accelerator.synchronize()


def offload_device(device: DeviceInfo) -> str | None:
    """The ``device=`` to pass to ``enable_model_cpu_offload``: diffusers needs it when there is no accelerator."""
    return device.kind if device.kind == "cpu" else None


def release_cached_memory(device: DeviceInfo) -> None:
    """After a failed call (out of memory above all): free the allocator's cached blocks, so the
    next request starts from the memory the loaded weights need and not from the failed peak."""
    gc.collect()
    if device.kind != "cpu":
        with contextlib.suppress(Exception):
            torch.accelerator.empty_cache()


class HostCopy:
    """A device -> host copy that was started and may still be in flight.

    ``ready()`` asks without blocking; ``tensor`` may only be read once ``ready()`` said True
    (or after ``wait()``, which blocks).
    """

    def __init__(self, tensor: torch.Tensor, event: Any = None):
        self._tensor, self._event = tensor, event

    def ready(self) -> bool:
        return self._event is None or bool(self._event.query())

    def wait(self) -> torch.Tensor:
        if self._event is not None:
            self._event.synchronize()
        return self._tensor

    @property
    def tensor(self) -> torch.Tensor:
        return self._tensor


def start_host_copy(tensor: torch.Tensor, device: DeviceInfo) -> HostCopy:
    """Start copying a (small) device tensor to host memory without waiting for the device.

    TPU: torch-tpu makes ``copy_(..., non_blocking=True)`` asynchronous only into a pinned host
    tensor (otherwise it "will block until all pending d2h copies on the device complete"), and
    ``torch.tpu.Event().record()`` snapshots the pending device-to-host copies so that
    ``query()`` can ask, without blocking, whether they landed. CUDA: the same with a CUDA event
    on the current stream. CPU: the tensor already is in host memory.
    """
    if tensor.device.type == "cpu":
        return HostCopy(tensor)
    try:
        host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
    except RuntimeError:  # no pinned host memory here: a blocking copy, counted as such in docs/generation.md
        return HostCopy(tensor.to("cpu"))
    host.copy_(tensor, non_blocking=True)
    event = torch.tpu.Event() if device.kind == "tpu" else torch.cuda.Event()
    event.record()
    return HostCopy(host, event)
