"""Everything that differs between TPU, CUDA and CPU lives here, and only here.

The rest of the package asks this module for the device, how to run an execution mode on it, and which
compile and collective backends to use. Without TPU chips (or torch-tpu) every TPU branch is skipped and
the CPU/CUDA equivalent runs; nothing here pretends to be a TPU.
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
from tpu_demo.host import host_may_have_tpu

log = logging.getLogger("tpu_demo.device")


@dataclass(frozen=True)
class DeviceInfo:
    """What the app runs on: ``kind`` is "tpu", "cuda" or "cpu"."""

    kind: str
    count: int
    name: str
    memory_bytes_per_device: int | None
    #: chips on the host (torch-tpu's PCI scan), of which this process may see only ``count``
    host_chips: int = 0
    #: the chip this process is pinned to (``TPU_VISIBLE_CHIPS``, one engine per chip), if any
    chip_index: int | None = None
    #: ranks of the tensor-parallel group this process belongs to (0: none)
    tensor_parallel_ranks: int = 0

    @property
    def torch_device(self) -> str:
        return self.kind

    @property
    def badge(self) -> str:
        """What this process really computes on, for the page header: "TPU v6e · chip 2 of 4",
        "TPU v6e x 4, tensor parallel", "CPU". A process uses one device unless it is a rank of
        a tensor-parallel group, so a 4-chip host never reads "x 4" for one engine."""
        if self.tensor_parallel_ranks > 1:
            return f"{self.name} x {self.tensor_parallel_ranks}, tensor parallel"
        chips = max(self.host_chips, self.count)
        if chips > 1:
            unit = "chip" if self.kind == "tpu" else "device"
            return f"{self.name} \u00b7 {unit} {(self.chip_index or 0) + 1} of {chips}"
        return self.name


#: libtpu's variables that pin a process to some of the host's chips (read by libtpu and named by
#: torch-tpu's glue library; see docs/scaling.md#every-chip-of-one-host). TPU_VISIBLE_DEVICE_PATHS wins
#: over TPU_VISIBLE_CHIPS when both are set.
LIBTPU_PIN_VARIABLES = ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS",
                        "TPU_PROCESS_ADDRESSES", "TPU_PROCESS_PORT")
#: first of the per-process ports libtpu's processes on one host talk on (one per chip from here)
LIBTPU_FIRST_PROCESS_PORT = 8476


def one_chip_environment(chip: int) -> dict[str, str]:
    """The environment that gives a process chip ``chip`` alone (the usual single-host recipe:
    one chip, a 1x1x1 process grid, its own port; not yet run on a chip with torch-tpu)."""
    port = LIBTPU_FIRST_PROCESS_PORT + chip
    return {"TPU_VISIBLE_CHIPS": str(chip), "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_BOUNDS": "1,1,1",
            "TPU_PROCESS_ADDRESSES": f"localhost:{port}", "TPU_PROCESS_PORT": str(port)}


def pinned_chip() -> int | None:
    """The chip ``TPU_VISIBLE_CHIPS`` pins this process to, when it names exactly one."""
    value = os.environ.get("TPU_VISIBLE_CHIPS", "").strip()
    return int(value) if value.isdigit() else None


def scan_tpu_chips() -> tuple[int, str, int | None]:
    """(chips, name, HBM bytes per chip) of this host from torch-tpu's PCI scan, without starting
    its runtime (a launcher must not hold the chips its engines will use); (0, "", None) without."""
    hardware = _torch_tpu_hardware() if host_may_have_tpu() else None
    if hardware is None:
        return 0, "", None
    try:
        chips = hardware.get_tpu_device_count()
        if chips <= 0:
            return 0, "", None
        return chips, hardware.get_tpu_device_name(), hardware.get_hbm_bytes_per_device()
    except Exception as error:  # noqa: BLE001 - a scanner failure means: no chips to plan for
        log.warning("TPU scan failed (%s: %s)", type(error).__name__, error)
        return 0, "", None


def devices_per_chip() -> int:
    """Devices one chip exposes to a process (torch-tpu's scan: 2 on v7, else 1); 1 without torch-tpu."""
    hardware = _torch_tpu_hardware()
    try:
        return int(getattr(hardware, "get_devices_per_chip", lambda: 1)() or 1)
    except Exception:  # noqa: BLE001 - an unknown generation counts as one device per chip
        return 1


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


class DeviceUnavailable(RuntimeError):
    """``--device tpu`` / ``--device cuda`` asked for a device this host cannot start; the message says why."""


def detect_device(preferred: str | None = None) -> DeviceInfo:
    """Detect TPU (torch-tpu present and chips visible), else CUDA, else CPU.

    ``preferred`` ("tpu", "cuda", "cpu") restricts detection to that device: "cpu" forces CPU on
    any host; "tpu" or "cuda" raises DeviceUnavailable (naming the reason) when that device does
    not start, instead of serving on another one. Without ``preferred`` it never raises.
    """
    # "tpu" asked for: torch-tpu itself says why it cannot start (not importable, no chips, no runtime);
    # "cuda" or "cpu" asked for: torch-tpu is never imported
    hardware = (_torch_tpu_hardware() if preferred == "tpu" or (preferred is None and host_may_have_tpu())
                else None)
    if preferred == "tpu":
        if hardware is None:
            raise DeviceUnavailable("--device tpu: torch-tpu is not importable here (pip install torch-tpu on "
                                    "a TPU VM; docs/tpu-host.md)")
        reasons: list[str] = []
        tpu = _detect_tpu(hardware, reasons)
        if tpu is None:
            raise DeviceUnavailable(f"--device tpu: no TPU started ({'; '.join(reasons) or 'unknown reason'})")
        return tpu
    if preferred is None and hardware is not None:
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
    if preferred == "cuda":
        raise DeviceUnavailable("--device cuda: torch.cuda.is_available() is False on this host")
    return DeviceInfo(kind="cpu", count=1, name="CPU", memory_bytes_per_device=_system_memory_bytes())


def _detect_tpu(hardware, reasons: list[str] | None = None) -> DeviceInfo | None:
    """The TPU when chips are visible and torch-tpu starts on them; a failure is logged with its reason
    (a TPU host that silently served on CPU would look like a slow TPU) and appended to ``reasons``."""
    reasons = [] if reasons is None else reasons
    try:
        chips = hardware.get_tpu_device_count()
    except Exception as error:  # noqa: BLE001 - a scanner failure must not stop the app
        reasons.append(f"torch-tpu's hardware scan raised {type(error).__name__}: {error}")
        log.warning("TPU detection failed (torch-tpu hardware scan raised %s: %s); serving on CUDA/CPU",
                    type(error).__name__, error)
        return None
    if chips <= 0:
        reasons.append("torch-tpu's PCI scan found no TPU chips on this host")
        return None  # no chips: the normal case off TPU hosts, nothing to report
    ready, why = _tpu_runtime_ready()
    if not ready:
        load_error = _load_torch_tpu()
        ready, why = _tpu_runtime_ready()
        why = load_error or why
    if not ready:
        reasons.append(f"{chips} TPU chip(s) visible but torch-tpu did not start: {why}")
        log.warning("%d TPU chip(s) visible but torch-tpu did not start (%s); serving on CUDA/CPU", chips, why)
        return None
    try:
        return DeviceInfo(kind="tpu", count=torch.accelerator.device_count(), name=hardware.get_tpu_device_name(),
                          memory_bytes_per_device=hardware.get_hbm_bytes_per_device(), host_chips=chips,
                          chip_index=pinned_chip())
    except Exception as error:  # noqa: BLE001
        reasons.append(f"reading the chips raised {type(error).__name__}: {error}")
        log.warning("TPU detection failed reading the chips (%s: %s); serving on CUDA/CPU", type(error).__name__, error)
        return None


def _system_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@contextlib.contextmanager
def execution_mode(mode: ExecutionMode, device: DeviceInfo) -> Iterator[None]:
    """Run the body in ``mode`` (its row of ``core.modes.MODES``).

    The transformer may already be compiled; the eager modes then run it eagerly through
    ``torch.compiler.set_stance("force_eager")`` so one loaded pipeline serves every mode.
    On TPU the eager modes also select their ``torch.tpu.EagerMode`` around the call.
    """
    if mode.traits.compiled:
        yield
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.compiler.set_stance("force_eager"))
        if device.kind == "tpu":
            stack.enter_context(torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, mode.traits.tpu_eager_mode)))
        yield


def compile_backend_name(device: DeviceInfo, cpu_backend: str) -> str:
    """``torch.compile`` backend: torch-tpu's "tpu" on TPU, else the configured one (inductor...)."""
    return "tpu" if device.kind == "tpu" else cpu_backend


def describe_mode(mode: ExecutionMode, device: DeviceInfo, cpu_backend: str) -> str:
    """What actually runs, for the UI: e.g. "compiled (inductor on cpu)"."""
    if mode.traits.compiled:
        return f"compiled ({compile_backend_name(device, cpu_backend)} on {device.kind})"
    if device.kind == "tpu":
        return f"{mode.title} (EagerMode.{mode.traits.tpu_eager_mode} on tpu)"
    return f"{mode.title} (plain eager on {device.kind})"


def modes_running_same_code(device: DeviceInfo) -> tuple[tuple[ExecutionMode, ...], ...]:
    """Groups of modes that run the very same code here: off TPU every eager mode is plain eager
    (``torch.tpu.EagerMode`` is torch-tpu's), so a comparison must say their difference is noise."""
    if device.kind == "tpu":
        return ()
    return (tuple(mode for mode in ExecutionMode if not mode.traits.compiled),)


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
