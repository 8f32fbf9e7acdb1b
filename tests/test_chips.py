"""``--chips``: every chip of one host serving, one command (tpu_demo/launch/chips.py, fleet.py).

The plan: one engine per chip when every offered model fits one chip, one tensor-parallel group
when one does not. Under the TPU stand-in, each engine's process is pinned to its own chip
through libtpu's variables, which the stand-in records at the moment torch-tpu loads, and the
header says that chip. End to end on CPU: ``python app.py --chips 2`` as an operator types it,
two engines behind the real nginx of deploy/nginx, two offered models warmed with ``--warm all``
in compiled mode (inductor, one shared compile cache): each engine is ready only once both models
are warm, a switch to the second model compiles nothing afresh, and visitors reach both engines.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from itertools import combinations

import httpx
import pytest
from gradio_client import Client

from conftest import free_ports, request_fields
from test_tpu_host_doc import start_command_on_cpu
from tpu_standin import TpuStandIn
from tpu_demo.core.catalog import CATALOG, REAL_MODEL_IDS, Placement
from tpu_demo.launch.chips import ENGINES, TENSOR_PARALLEL, ChipsError, Host, plan_chips
from tpu_demo.models.placement_plan import CHIP_COUNTS, TPU_CHIPS, plan_serving

REPO = Path(__file__).resolve().parents[1]
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
V6E = Host("tpu", 4, "TPU v6e", 32.0)


def test_the_plan_uses_every_chip():
    plan = plan_chips("all", V6E, ["flux.1-schnell", "sd3.5-medium"])
    assert (plan.layout, plan.count) == (ENGINES, 4)  # both fit one v6e chip: four independent engines
    assert plan.serving == {"flux.1-schnell": "resident, one engine per chip", "sd3.5-medium": "whole, one engine per chip"}
    eight = plan_chips("all", Host("tpu", 8, "TPU v6e", 32.0), ["flux.2-dev", "flux.1-schnell"])
    # FLUX.2-dev fits no single chip: one group over the 8, and FLUX.1 (which can be sharded) joins it
    assert (eight.layout, eight.count, eight.models) == (TENSOR_PARALLEL, 8, ("flux.2-dev", "flux.1-schnell"))
    # SD3.5 has no tensor-parallel plan: it cannot join that group, and the plan says so instead of dropping it
    with pytest.raises(ChipsError) as refused:
        plan_chips("all", Host("tpu", 8, "TPU v6e", 32.0), ["flux.2-dev", "flux.1-schnell", "sd3.5-medium"])
    assert "- sd3.5-medium: flux.2-dev fits no single chip, so the 8 chips form one tensor-parallel group" in str(refused.value)
    assert "--models flux.2-dev,flux.1-schnell" in str(refused.value) and "v5p x 8" in str(refused.value)
    assert plan_chips("2", Host("cpu", 0, "CPU"), ["tiny-flux"]).count == 2
    with pytest.raises(ChipsError, match="no TPU chips"):
        plan_chips("all", Host("cpu", 0, "CPU"), ["tiny-flux"])
    with pytest.raises(ChipsError, match="has 4"):
        plan_chips("8", V6E, ["sd3.5-medium"])
    with pytest.raises(ChipsError, match="flux.2-dev"):
        plan_chips("all", V6E, ["flux.2-dev"])  # 4 v6e chips cannot hold it even sharded


OFFERED_SETS = [models for size in range(1, len(REAL_MODEL_IDS) + 1) for models in combinations(REAL_MODEL_IDS, size)]


@pytest.mark.parametrize("chip,count", [(chip, count) for chip in TPU_CHIPS for count in CHIP_COUNTS])
def test_every_row_of_the_placement_table_serves_every_offered_model_or_refuses_naming_it(chip, count):
    """Each TPU and chip count of docs/placements.md, each set of real models offered: ``--chips all``
    serves every one of them in the way the table says, or refuses with one message that names exactly
    the models it cannot serve and, for each, the options. Nothing is left out silently."""
    host = Host("tpu", count, f"TPU {chip}", TPU_CHIPS[chip])
    table_rows = {line.split(" | ")[0].lstrip("| "): line for line in
                  (REPO / "docs" / "placements.md").read_text().splitlines() if line.startswith(f"| {chip} ")}
    for models in OFFERED_SETS:
        servings = {model: plan_serving(CATALOG[model], TPU_CHIPS[chip], count) for model in models}
        try:
            plan = plan_chips("all", host, models)
        except ChipsError as error:
            message = str(error)
            named = [line[2:].split(":")[0] for line in message.splitlines() if line.startswith("- ")]
            assert named, message
            for model in named:  # each refused model: why, and at least one thing the operator can do
                [line] = [line for line in message.splitlines() if line.startswith(f"- {model}: ")]
                assert "Options: " in line and line.split("Options: ")[1].strip(". "), line
            # refused exactly the models the table says do not fit, or cannot join the group another one needs
            needs_group = any(s is not None and s.chips_per_engine > 1 for s in servings.values())
            expected = [m for m in models if servings[m] is None or
                        (needs_group and Placement.TENSOR_PARALLEL not in CATALOG[m].placements)]
            assert named == expected, (models, message)
            assert message.startswith(f"--chips all on {count} x TPU {chip}")
            continue
        assert plan.models == models and set(plan.serving) == set(models)  # every offered model, none dropped
        row = table_rows[f"{chip} ({TPU_CHIPS[chip]:.0f} GB) x {count}"]
        for model in models:
            assert servings[model] is not None and servings[model].describe() in row  # what the table says
            assert plan.layout == (TENSOR_PARALLEL if any(s.chips_per_engine > 1 for s in servings.values())
                                   else ENGINES)


def test_each_engine_process_is_pinned_to_its_own_chip(monkeypatch):
    from tpu_demo.device import detect_device, one_chip_environment, scan_tpu_chips

    tpu = TpuStandIn(chips=4, name="TPU v6e", hbm_bytes=32 * 10**9).install(monkeypatch)
    # the launcher counts chips with torch-tpu's PCI scan and never starts the runtime (its engines need the chips)
    assert scan_tpu_chips() == (4, "TPU v6e", 32 * 10**9)
    assert "torch_tpu._loader.load" not in tpu.names()
    plan = plan_chips("all", V6E, ["flux.1-schnell", "sd3.5-medium"])
    for index in range(plan.count):  # what each engine process finds in its environment when torch-tpu loads
        tpu.clear()
        tpu.loaded = False
        with monkeypatch.context() as env:
            for name, value in plan.engine_environment(index).items():
                env.setenv(name, value)
            device = detect_device()
        [load] = tpu.named("torch_tpu._loader.load")
        assert load.kwargs["libtpu_env"] == one_chip_environment(index)
        assert load.kwargs["libtpu_env"]["TPU_VISIBLE_CHIPS"] == str(index)
        assert (device.kind, device.count) == ("tpu", 1)  # it sees one chip and says which
        assert device.badge == f"TPU v6e \u00b7 chip {index + 1} of 4"
    ports = {plan.engine_environment(i)["TPU_PROCESS_PORT"] for i in range(plan.count)}
    assert len(ports) == plan.count  # each process its own libtpu port


def test_help_and_header_never_claim_more_than_the_process_uses():
    from tpu_demo.device import DeviceInfo

    assert DeviceInfo("tpu", 4, "TPU v6e", 32 * 10**9, host_chips=4).badge == "TPU v6e \u00b7 chip 1 of 4"
    assert DeviceInfo("tpu", 4, "TPU v6e", 32 * 10**9, host_chips=4, tensor_parallel_ranks=4).badge == \
        "TPU v6e x 4, tensor parallel"
    assert DeviceInfo("cpu", 1, "CPU", None).badge == "CPU"


def test_the_launcher_never_imports_torch():
    """On a TPU host ``import torch`` starts torch-tpu's runtime, which would hold the chips the engines need."""
    code = "import sys, tpu_demo.launch.fleet; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    assert "torch" not in out.stdout.split()


def _engine_requests(log: Path) -> list[dict]:
    marker = "tpu_demo.requests: "
    return [json.loads(line.split(marker, 1)[1]) for line in log.read_text().splitlines() if marker in line]


@pytest.mark.skipif(not os.path.exists(NGINX), reason="Debian's nginx is not installed (scripts/test.sh installs it)")
@pytest.mark.timeout(1500)
def test_all_chips_command_on_cpu_two_engines_behind_nginx_every_model_warm(tmp_path):
    port = free_ports(3)  # nginx, then one engine per chip on the next ports
    cache = tmp_path / "cache"
    from tpu_demo.engine.compile_cache import compile_cache_env

    # a compile cache an earlier in-process test pointed this worker at would win over --cache-dir: leave it out,
    # so engine 0 starts cold and engine 1 can only hit what engine 0 wrote
    inherited = set(compile_cache_env(cache))
    env = {**{k: v for k, v in os.environ.items() if k not in inherited},
           "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONUNBUFFERED": "1"}
    # docs/tpu-host.md's start command with tiny models and two loopback engines, plus the test's own settings
    command = start_command_on_cpu(port) + [
        "--cache-dir", str(cache), "--model", "tiny-flux",
        # the start model on one bucket (the second model keeps all four): a third fewer inductor compiles
        "--buckets", "64x64", "--compile-backend", "inductor", "--threads", "1", "--max-per-ip", "0",
        "--max-batch", "1"]  # one graph per bucket: batch sizes 2 and 4 would triple the inductor compiles
    with open(tmp_path / "launcher.log", "w") as out:
        launcher = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    engines = [f"http://127.0.0.1:{port + 1 + i}/" for i in range(2)]
    logs = [cache / f"chips-{port}" / f"engine-{i}.log" for i in range(2)]
    try:
        reasons: list[list[str]] = [[], []]
        warmed: list[dict] = []
        deadline = time.monotonic() + 1200
        with httpx.Client(timeout=10) as http:
            while time.monotonic() < deadline and not all(r and r[-1].startswith("ready") for r in reasons):
                assert launcher.poll() is None, (tmp_path / "launcher.log").read_text()[-3000:]
                for index, url in enumerate(engines):
                    try:
                        reasons[index].append(http.get(url + "ready").json()["reason"])
                    except (httpx.HTTPError, ValueError):
                        pass
                time.sleep(0.5)
        for index, seen in enumerate(reasons):
            assert seen and seen[-1].startswith("ready"), (seen[-3:], logs[index].read_text()[-3000:])
            # ready only after both models: the other one first, then the start model, which stays loaded
            waiting = [r for r in seen if not r.startswith("ready")]
            assert all(r.startswith(("warming tiny-sd3 (model 1 of 2, ", "warming tiny-flux (model 2 of 2, "))
                       for r in waiting), sorted(set(waiting))
            assert "--warm all: tiny-sd3 warm in compiled" in logs[index].read_text()
            health = httpx.get(engines[index] + "health").json()
            assert set(health["models_loaded"]) == {"tiny-flux"} and health["device"]["name"] == "CPU"
            warmed.append(health["warmed"])
        # the engines warmed one after another: engine 1 started once engine 0 was ready, and every graph it
        # needed was already in the shared compile cache (inductor's counters: every lookup a hit)
        assert "engine 0 is ready: starting engine 1" in (tmp_path / "launcher.log").read_text()
        for model in ("tiny-sd3", "tiny-flux"):
            first, second = warmed[0][model]["compiled"], warmed[1][model]["compiled"]
            assert first["warm"] == second["warm"] == first["shapes"] > 0, warmed
            assert first["from_cache"] is False and second["from_cache"] is True, warmed
            print(f"{model} compiled warmup: engine 0 {first['compile_seconds']} s ({first['graphs']} graphs), "
                  f"engine 1 {second['compile_seconds']} s ({second['graphs']} graphs, every lookup a cache hit)")
        balancer = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 60
        while httpx.get(balancer + "gradio_api/info", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "nginx never listed a ready engine"
            time.sleep(0.5)

        # visitors, each a new client (its own cookie), switch to the second model: nothing compiles afresh
        seeds: list[int] = []
        served: list[set[int]] = [set(), set()]
        for seed in range(100, 116):  # new visitors land on either engine (nginx hashes a fresh id)
            client = Client(balancer, verbose=False)
            gallery, _ = client.predict(**request_fields(model="tiny-sd3", mode="compiled", guidance_scale=4.5,
                                                         seed=seed, previews=False), api_name="/generate")
            assert len(gallery) == 1
            seeds.append(seed)
            deadline = time.monotonic() + 30  # the request's log line is written as it ends
            while not any(seed in s for s in served) and time.monotonic() < deadline:
                served = [{r["seed"] for r in _engine_requests(log) if r.get("outcome") == "ok"} for log in logs]
                time.sleep(0.1)
            if len(seeds) >= 4 and all(served):
                break
        assert set(seeds) == served[0] | served[1] and all(served), served  # every visitor served, both engines
        for index, url in enumerate(engines):
            buckets = [b for b in httpx.get(url + "health").json()["buckets"]
                       if b["model"] == "tiny-sd3" and b["mode"] == "compiled" and b["resolution"] == "64x64"]
            [switched] = [b for b in buckets if b["batch"] == 2]  # SD3's CFG doubles the batch: the warmed shape
            assert switched["state"] == "warm" and switched["from_cache"] is True, switched  # every lookup hit
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.kill()
    assert launcher.returncode == 0, (tmp_path / "launcher.log").read_text()[-3000:]
    for url in engines:  # the engines went with it
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "health", timeout=2)
