"""The device layer on this machine (no TPU chips, no GPU): detection never crashes, CPU paths run."""

import os
import subprocess
import sys

import torch

from tpu_demo.device import (describe_mode, detect_device, distributed_backend, execution_mode,
                             compile_backend_name)
from tpu_demo.core.modes import ExecutionMode


def test_detects_cpu_here():
    device = detect_device()
    assert device.kind == "cpu"
    assert device.count == 1
    assert device.badge == "CPU"
    assert device.memory_bytes_per_device and device.memory_bytes_per_device > 1e9


def test_detection_with_torch_tpu_autoloaded_does_not_crash():
    """The default `import torch` autoloads torch-tpu; with no chips detection must still say cpu."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    out = subprocess.run([sys.executable, "-c", "from tpu_demo.device import detect_device; print(detect_device().kind)"],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "cpu"


def test_a_host_without_a_google_pci_device_detects_cpu_without_importing_torch_tpu(monkeypatch):
    """This host's PCI bus has no device of Google's vendor id: a process with autoload off learns it has
    no chips without importing torch-tpu (its import costs seconds), and the launcher's scan says 0 chips."""
    from tpu_demo import host

    monkeypatch.delitem(sys.modules, "torch_tpu", raising=False)  # an earlier test in this worker may load it
    assert not host.host_may_have_tpu(), "this test machine has a Google PCI device"
    code = ("import sys; from tpu_demo.device import detect_device, scan_tpu_chips; "
            "print(detect_device().kind, scan_tpu_chips(), 'torch_tpu' in sys.modules)")
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "cpu (0, '', None) False"


def test_a_google_pci_device_or_a_loaded_torch_tpu_sends_detection_to_torch_tpu(tmp_path, monkeypatch):
    """PCI devices as /sys lists them: one of Google's vendor id (0x1ae0, what torch-tpu's scan counts),
    or a bus that cannot be read, means torch-tpu is asked; other vendors alone do not."""
    from tpu_demo import host

    def bus(*vendors: str):
        root = tmp_path / f"bus-{len(list(tmp_path.iterdir()))}"
        for index, vendor in enumerate(vendors):
            (root / f"0000:00:0{index}.0").mkdir(parents=True)
            (root / f"0000:00:0{index}.0" / "vendor").write_text(vendor + "\n")
        return root

    monkeypatch.delitem(sys.modules, "torch_tpu", raising=False)
    for root, expected in ((bus("0x8086", "0x1af4"), False), (bus("0x8086", "0x1ae0"), True),
                           (tmp_path / "no-bus-here", True)):
        monkeypatch.setattr(host, "PCI_DEVICES", root)
        assert host.host_may_have_tpu() is expected, root
    monkeypatch.setattr(host, "PCI_DEVICES", bus("0x10de"))
    monkeypatch.setitem(sys.modules, "torch_tpu", object())  # loaded already (autoload, the stand-in)
    assert host.host_may_have_tpu()


def test_device_cpu_or_cuda_never_imports_torch_tpu_even_on_a_host_with_a_google_device(tmp_path):
    """``--device cpu`` (or cuda) on a host whose bus lists a Google device: torch-tpu stays unimported;
    detection without ``--device`` on the same bus does import it (it may find chips there)."""
    card = tmp_path / "0000:00:04.0"
    card.mkdir()
    (card / "vendor").write_text("0x1ae0\n")
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    for preferred, imports in (("'cpu'", False), ("None", True)):
        code = (f"import sys, pathlib; from tpu_demo import device, host; host.PCI_DEVICES = pathlib.Path({str(tmp_path)!r}); "
                f"print(device.detect_device({preferred}).kind, 'torch_tpu' in sys.modules)")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip().splitlines()[-1] == f"cpu {imports}", preferred


def test_cpu_mode_descriptions_say_what_runs():
    device = detect_device()
    assert describe_mode(ExecutionMode.COMPILED, device, "inductor") == "compiled (inductor on cpu)"
    assert describe_mode(ExecutionMode.EAGER_FUSED, device, "inductor") == "optimized eager (plain eager on cpu)"
    assert compile_backend_name(device, "aot_eager") == "aot_eager"
    assert distributed_backend(device) == "gloo"


def test_eager_modes_run_compiled_functions_eagerly():
    calls = []

    def backend(gm, example_inputs):
        calls.append(1)
        return gm.forward

    fn = torch.compile(lambda x: x * 2 + 1, backend=backend, fullgraph=True, dynamic=False)
    device = detect_device()
    with execution_mode(ExecutionMode.EAGER, device):
        assert fn(torch.ones(3)).tolist() == [3.0, 3.0, 3.0]
    assert calls == []
    with execution_mode(ExecutionMode.COMPILED, device):
        fn(torch.ones(3))
    assert calls == [1]


def test_a_tpu_host_where_torch_tpu_does_not_start_says_why_in_the_log():
    """The real torch-tpu loader and accelerator checks, with chips reported by a scanner stand-in
    (this machine has none): detection falls back to CPU and logs the reason, never silently."""
    code = """
import logging
logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
from tpu_demo import device
class ChipsVisible:  # torch-tpu's PCI scanner, as on a TPU host (reads /sys; none here)
    get_tpu_device_count = staticmethod(lambda: 4)
class ScanFails:
    @staticmethod
    def get_tpu_device_count():
        raise OSError("permission denied: /sys/bus/pci")
print("result", device._detect_tpu(ChipsVisible()), device._detect_tpu(ScanFails()))
"""
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "result None None" in out.stdout
    log = out.stderr
    assert "tpu_demo.device WARNING 4 TPU chip(s) visible but torch-tpu did not start (" in log, log[-2000:]
    assert "serving on CUDA/CPU" in log
    assert "TPU detection failed (torch-tpu hardware scan raised OSError: permission denied: /sys/bus/pci)" in log


def test_device_tpu_fails_hard_where_no_tpu_starts():
    """``python app.py --device tpu`` on this host (no chips): exit status 2 and one line saying why,
    before any port is opened; never a CPU server that looks like a slow TPU."""
    from conftest import free_port

    port = free_port()
    out = subprocess.run([sys.executable, "app.py", "--device", "tpu", "--port", str(port), "--no-warmup"],
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert ("app.py: error: --device tpu: no TPU started (torch-tpu's PCI scan found no TPU chips on this host)"
            in out.stderr), out.stderr[-2000:]
    assert "Running on" not in out.stdout + out.stderr
    assert detect_device("cpu").kind == "cpu"


def test_without_a_google_pci_device_import_torch_leaves_torch_tpu_out():
    """What app.py does before torch: here (no Google device on the bus) PyTorch's autoload, which would
    load torch-tpu at ``import torch``, is turned off; an operator's own setting of it wins."""
    code = ("import os, sys; from tpu_demo.host import skip_torch_tpu_autoload_without_tpu as skip; {skip}"
            "import torch; print('torch_tpu' in sys.modules, os.environ.get('TORCH_DEVICE_BACKEND_AUTOLOAD'))")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    for skip, operator, expected in (("skip(); ", None, "False 0"), ("", None, "True"), ("skip(); ", "1", "True 1")):
        run_env = env if operator is None else {**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": operator}
        out = subprocess.run([sys.executable, "-c", code.format(skip=skip)], env=run_env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip().splitlines()[-1].startswith(expected), (skip, operator, out.stdout)
