"""``python app.py --check``: what this host is and what the app would do on it, without loading weights.

Prints the host, chips, versions, each offered model's placement and weight files against the free disk,
a pinning probe per chip, and the processes and ports the command would start; exits 0 when nothing
stands in the way, else 1 naming every problem. It never holds a chip (chips are read with the PCI scan),
so each probe child can start the runtime on its own chip.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tpu_demo.core.catalog import CATALOG, Placement
from tpu_demo.device import DeviceInfo, DeviceUnavailable, detect_device, devices_per_chip, one_chip_environment, scan_tpu_chips
from tpu_demo.launch.chips import ChipsError, Host, plan_chips
from tpu_demo.launch.config import AppConfig
from tpu_demo.launch.fleet import NGINX_CONF, REPO, SYNC, engine_ports, nginx_binary
from tpu_demo.launch.offer import offered_models
from tpu_demo.models.placement import PlacementError, choose_placement
from tpu_demo.models.placement_plan import plan_serving
from tpu_demo.models.weights import weights_report

#: distributions whose versions the check prints (the first three decide the TPU path)
VERSIONS = ("torch", "torch-tpu", "libtpu", "diffusers", "transformers", "gradio")
#: seconds the pinning probes may take (each starts torch-tpu's runtime on its chip; they run at once)
PROBE_TIMEOUT = 180


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def say(self, text: str) -> None:
        self.lines.append(text)
        print(text, flush=True)

    def problem(self, text: str) -> None:
        self.problems.append(text)
        self.say(f"  PROBLEM: {text}")


def gb(size: float) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 1e8 else f"{size / 1e6:.2f} MB"


def version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(config: AppConfig) -> int:
    """Run every check, print the report; 0 when nothing stands in the way, else 1."""
    report = Report()
    chips, name, hbm = scan_tpu_chips()
    check_host(report)
    device = check_device(report, config, chips, name, hbm)
    models = offered_models(config)
    host = Host("tpu", chips, name, (hbm or 0) / 1e9) if chips else Host("cpu", 0, "CPU")
    check_models(report, config, models, device, host)
    check_pinning(report, chips, name)
    check_processes(report, config, models, host)
    if report.problems:
        report.say(f"check: {len(report.problems)} problem(s):")
        for problem in report.problems:
            report.say(f"- {problem}")
        return 1
    report.say(f"check: OK ({device.name}, {len(models)} model(s) offered)")
    return 0


def check_host(report: Report) -> None:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    report.say(f"host: {socket.gethostname()}, {platform.machine()}, {os.cpu_count()} CPU cores, "
               f"{gb(memory)} memory, Python {platform.python_version()}")
    if sys.version_info < (3, 11):
        report.problem(f"Python {platform.python_version()}: torch-tpu's wheels need CPython 3.11 or newer "
                       "(docs/tpu-host.md#2-python-311)")
    found = {dist: version(dist) for dist in VERSIONS}
    report.say("versions: " + ", ".join(f"{dist} {found[dist] or 'not installed'}" for dist in VERSIONS))


def check_device(report: Report, config: AppConfig, chips: int, name: str, hbm: int | None) -> DeviceInfo:
    """The device this command would serve on, read without starting the TPU runtime."""
    if chips:
        per_chip = devices_per_chip()
        report.say(f"device: {name}, {chips} chip(s) on this host, {gb(hbm or 0)} HBM per "
                   f"{'device' if per_chip > 1 else 'chip'} (torch-tpu's PCI scan; runtime not started here)")
        if version("torch-tpu") is None:
            report.problem("TPU chips found but torch-tpu is not installed (pip install torch-tpu)")
        if config.device in ("cpu", "cuda"):
            report.say(f"  --device {config.device}: the chips stay unused")
        return DeviceInfo("tpu", 1, name, hbm, host_chips=chips) if config.device in (None, "tpu") else \
            detect_device("cpu")
    accelerators = [str(p) for p in Path("/dev").glob("accel*")] + [str(p) for p in Path("/dev/vfio").glob("[0-9]*")]
    if accelerators and version("torch-tpu") is None:
        report.problem(f"{', '.join(accelerators[:4])} present but torch-tpu is not installed: its PCI scan cannot "
                       "read the chips (pip install torch-tpu)")
    if config.device == "tpu":
        report.problem("--device tpu: no TPU chips on this host (torch-tpu's PCI scan found none); "
                       "the app would exit at start")
    try:
        device = detect_device(None if config.device == "tpu" else config.device)
    except DeviceUnavailable as error:  # --device cuda without CUDA
        report.problem(str(error))
        device = detect_device("cpu")
    memory = device.memory_bytes_per_device or 0
    report.say(f"device: {device.name} ({device.kind}), {gb(memory)} memory; no TPU chips on this host "
               f"(torch-tpu's PCI scan found none), so this is the {device.kind.upper()} plan")
    return device


def check_models(report: Report, config: AppConfig, models: tuple[str, ...], device: DeviceInfo, host: Host) -> None:
    override = Placement(config.placement) if config.placement else None
    report.say(f"models offered: {', '.join(models)}")
    missing_total = 0.0
    for model in models:
        spec = CATALOG[model]
        if device.kind == "tpu" and spec.component_gb and override is None:
            count = 1 if not config.chips else host.chips if config.chips == "all" else min(int(config.chips), host.chips)
            serving = plan_serving(spec, host.chip_gb, count)
            where = "does not fit here" if serving is None else (
                f"{serving.describe()} ({serving.chips_per_engine} chip(s) per engine)")
            if serving is None:
                report.say(f"- {model}: {where}")
                report.problem(f"{model} fits no placement on {host.name} (docs/placements.md)")
        else:
            try:
                where = f"{choose_placement(spec, device, override).value} on {device.kind}, 1 {'chip' if device.kind == 'tpu' else 'device'}"
            except PlacementError as error:
                where = "no placement"
                report.problem(str(error))
        if spec.hub_repo is None:
            report.say(f"- {model}: {where}; weights {_builtin_weights(spec, config)}")
            continue
        weights = weights_report(spec)
        state = "complete" if weights.complete else f"INCOMPLETE, {len(weights.missing)} file(s) missing"
        report.say(f"- {model}: {where}; weights {state}: {len(weights.present)} file(s), {gb(weights.present_bytes)}"
                    f" in {weights.snapshot or 'the Hugging Face cache (not there)'}")
        for path, size in weights.present:
            report.say(f"    {path}  {gb(size)}")
        for path in weights.missing:
            report.say(f"    {path}  MISSING")
        if not weights.complete:
            missing_total += weights.missing_bytes
            report.problem(f"{model}: weights incomplete, missing {', '.join(weights.missing)} (about "
                           f"{gb(weights.missing_bytes)} to download: `{spec.download_command}`)")
    check_disk(report, missing_total)


def _builtin_weights(spec, config: AppConfig) -> str:
    kind, _, name = spec.source.partition(":")
    if kind == "assets":
        from tpu_demo.core.catalog import ASSETS_DIR

        folder = ASSETS_DIR / name
        files = sorted(folder.rglob("*.safetensors"))
        return f"committed ({len(files)} safetensors file(s), {gb(sum(f.stat().st_size for f in files))})"
    return f"built offline at first use into {config.resolved_cache_dir / 'models' / name} (no download)"


def check_disk(report: Report, missing_bytes: float) -> None:
    import huggingface_hub.constants

    cache = Path(huggingface_hub.constants.HF_HUB_CACHE)
    existing = next(p for p in (cache, *cache.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    report.say(f"disk: {gb(free)} free at {existing} (Hugging Face cache {cache}); {gb(missing_bytes)} of weights "
               "still to download")
    if missing_bytes > free:
        report.problem(f"not enough disk for the missing weights: {gb(missing_bytes)} needed, {gb(free)} free")


def check_pinning(report: Report, chips: int, name: str) -> None:
    """One child per chip with that chip's libtpu variables, all at once (as the engines will run): each must
    start the runtime and see one chip."""
    if not chips:
        report.say("pinning probe: skipped (no TPU chips on this host; one engine per chip needs chips to pin)")
        return
    expected = devices_per_chip()
    code = ("import json; from tpu_demo.device import detect_device; d = detect_device('tpu'); "
            "print('PROBE ' + json.dumps({'count': d.count, 'chip': d.chip_index}))")
    probes = {chip: subprocess.Popen([sys.executable, "-c", code], cwd=REPO, text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE,
                                     env={**os.environ, **one_chip_environment(chip), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
              for chip in range(chips)}
    deadline = time.monotonic() + PROBE_TIMEOUT
    for chip, probe in probes.items():
        try:
            stdout, stderr = probe.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            probe.kill()
            probe.communicate()
            report.problem(f"pinning probe chip {chip}: no answer in {PROBE_TIMEOUT} s")
            continue
        line = next((l for l in stdout.splitlines() if l.startswith("PROBE ")), None)
        if probe.returncode != 0 or line is None:
            why = (stderr.strip().splitlines() or ["no output"])[-1]
            report.problem(f"pinning probe chip {chip} (TPU_VISIBLE_CHIPS={chip}): {why}")
            continue
        seen = json.loads(line.removeprefix("PROBE "))
        verdict = "ok" if seen["count"] == expected else "WRONG"
        report.say(f"pinning probe chip {chip}: TPU_VISIBLE_CHIPS={chip} -> the process sees {seen['count']} "
                   f"device(s), chip {seen['chip']} ({verdict})")
        if seen["count"] != expected:
            report.problem(f"pinning probe chip {chip}: a process pinned to chip {chip} sees {seen['count']} "
                           f"{name} device(s), not {expected}: one engine per chip would share chips")


def check_processes(report: Report, config: AppConfig, models: tuple[str, ...], host: Host) -> None:
    """The processes and ports this command starts, and whether those ports are free."""
    if not config.chips:
        report.say(f"processes: one app process serving http://{config.host}:{config.port}/"
                   + (f" on chip 0 of {host.chips} (--chips all puts every chip to work)" if host.chips > 1 else ""))
        _check_port(report, config.host, config.port)
        return
    try:
        plan = plan_chips(config.chips, host, models)
    except ChipsError as error:
        report.say(f"--chips {config.chips}: refused")
        report.problem(str(error))
        return
    report.say(f"--chips {config.chips}: {plan.describe()}")
    if plan.layout != "one engine per chip":
        report.say(f"processes: scripts/serve_tp.sh {plan.count}: {plan.count} torchrun ranks, rank 0 serves "
                   f"http://{config.host}:{config.port}/")
        _check_port(report, config.host, config.port)
        return
    workdir = config.resolved_cache_dir / f"chips-{config.port}"
    for index, port in enumerate(engine_ports(config.port, plan.count)):
        pinned = f", chip {index} ({' '.join(f'{k}={v}' for k, v in plan.engine_environment(index).items())})" \
            if host.kind == "tpu" else ""
        report.say(f"  engine {index}: python app.py on 127.0.0.1:{port}{pinned}, log {workdir}/engine-{index}.log")
        _check_port(report, "127.0.0.1", port)
    nginx = nginx_binary()
    report.say(f"  nginx ({nginx or 'NOT INSTALLED'}): {NGINX_CONF.name} listening on {config.host}:{config.port}")
    if nginx is None:
        report.problem("--chips puts the engines behind nginx: install it (apt install nginx)")
    _check_port(report, config.host, config.port)
    report.say(f"  readiness sync: {SYNC.relative_to(REPO)} (nginx lists only engines whose /ready says 200)")
    report.say(f"  warm-up: engine 0 first, each next engine once the one before is ready (it reads the compile "
               f"cache under {config.resolved_cache_dir / 'compile'})")


def _check_port(report: Report, host: str, port: int) -> None:
    if not port:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            report.problem(f"port {host}:{port} cannot be bound ({error.strerror or error})")
