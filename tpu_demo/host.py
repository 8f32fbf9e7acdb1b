"""What this host has, read from ``/sys`` without importing torch: importable before torch.

``host_may_have_tpu`` is False only where torch-tpu could find no chip; ``skip_torch_tpu_autoload_without_tpu``
then keeps ``import torch`` from loading torch-tpu (about 4 s) only to hear that. On a host that may have
a chip nothing changes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: where torch-tpu's scan looks for chips: PCI devices of Google's vendor id
PCI_DEVICES = Path("/sys/bus/pci/devices")
GOOGLE_PCI_VENDOR = "0x1ae0"
#: PyTorch's switch for loading device backends (torch-tpu among them) at ``import torch``
AUTOLOAD_VARIABLE = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def host_may_have_tpu() -> bool:
    """Whether torch-tpu's scan could find a chip here: torch-tpu is loaded already, or a PCI device of
    Google's vendor id exists (or the bus cannot be read)."""
    if "torch_tpu" in sys.modules:
        return True
    try:
        devices = list(PCI_DEVICES.iterdir())
    except OSError:
        return True
    for device in devices:
        try:
            if (device / "vendor").read_text().strip() == GOOGLE_PCI_VENDOR:
                return True
        except OSError:
            continue
    return False


def skip_torch_tpu_autoload_without_tpu() -> None:
    """Before torch is imported: where no chip can be, turn PyTorch's backend autoload off (an operator's
    own setting wins); ``--device tpu`` still imports torch-tpu, so its error says why."""
    if "torch" not in sys.modules and not host_may_have_tpu():
        os.environ.setdefault(AUTOLOAD_VARIABLE, "0")
