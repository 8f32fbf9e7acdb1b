"""Tests only: makes every Python process started with this folder on PYTHONPATH see the TPU stand-in.

``TPU_STANDIN="<chips>,<name>,<HBM bytes>"`` installs the chip-detection part of tests/tpu_standin.py
(torch-tpu's PCI scan reports the chips; its loader makes ``torch.accelerator`` show the chips that
``TPU_VISIBLE_CHIPS`` leaves visible) at interpreter start, so a real ``python app.py --check`` and the
child processes it starts take their TPU branches. ``TPU_STANDIN_IGNORES_PINNING=1`` plays a libtpu
that ignores the pinning variables (every process sees every chip). Without ``TPU_STANDIN``: nothing.
"""

import os
import sys

if os.environ.get("TPU_STANDIN"):
    chips, name, hbm = os.environ["TPU_STANDIN"].split(",")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
    from _pytest.monkeypatch import MonkeyPatch

    from tpu_standin import TpuStandIn

    _standin = TpuStandIn(chips=int(chips), name=name, hbm_bytes=int(hbm))
    if os.environ.get("TPU_STANDIN_IGNORES_PINNING"):
        _standin.visible_chips = lambda: _standin.chips
    _standin._install_hardware(MonkeyPatch())
