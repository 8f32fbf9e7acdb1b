"""``python app.py --check`` as an operator runs it: real processes, a real (temporary) Hugging Face
cache, no weights loaded. On this CPU host it prints the CPU plan and exits 0; a model whose download
stopped half way makes it exit 1 naming each missing file; under the TPU stand-in (installed in every
process through tests/helpers/standin_site) it probes each chip in its own child process and fails when
a pinned process sees more than its chip."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import free_ports
from tpu_demo.core.catalog import CATALOG

REPO = Path(__file__).resolve().parents[1]
STANDIN_SITE = REPO / "tests" / "helpers" / "standin_site"


def run_check(tmp_path: Path, *flags: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "TPU_DEMO_CACHE_DIR": str(tmp_path / "cache"), **env}
    started = time.perf_counter()
    # --chips: an engine per chip (up to 8) on the ports after the public one
    out = subprocess.run([sys.executable, "app.py", "--check", "--port", str(free_ports(9)), *flags], cwd=REPO,
                         env=environ, capture_output=True, text=True, timeout=600)
    print(f"--check {' '.join(flags)}: exit {out.returncode} in {time.perf_counter() - started:.1f} s")
    return out


def fake_snapshot(hub: Path, repo: str, files: dict[str, bytes]) -> Path:
    """A snapshot in the hub cache's own layout (refs/main -> snapshots/<commit>/...), as `hf download` leaves it."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = hub / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    snapshot = root / "snapshots" / commit
    for name, data in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_bytes(data)
    return snapshot


def sd35_files(shards_present: int) -> dict[str, bytes]:
    """SD3.5 Medium's layout in small: a transformer in two shards (the first ``shards_present`` there)."""
    shards = [f"diffusion_pytorch_model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    index = {"metadata": {"total_size": 4_000_000}, "weight_map": {"a.weight": shards[0], "b.weight": shards[1]}}
    files = {"model_index.json": json.dumps({"_class_name": "StableDiffusion3Pipeline",
                                             "transformer": ["diffusers", "SD3Transformer2DModel"],
                                             "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
                                             "vae": ["diffusers", "AutoencoderKL"], "tokenizer": ["transformers", "CLIPTokenizer"],
                                             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
                                             "image_encoder": [None, None]}).encode(),
             "transformer/config.json": b"{}", "transformer/diffusion_pytorch_model.safetensors.index.json":
                 json.dumps(index).encode(),
             "text_encoder/config.json": b"{}", "text_encoder/model.safetensors": b"\0" * 1000,
             "vae/config.json": b"{}", "tokenizer/tokenizer_config.json": b"{}",
             "scheduler/scheduler_config.json": b"{}"}
    for shard in shards[:shards_present]:
        files[f"transformer/{shard}"] = b"\0" * 2_000_000
    return files


def test_check_on_this_cpu_host_prints_the_cpu_plan_and_exits_0(tmp_path):
    out = run_check(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("host: ") and "Python 3." in lines[0]
    assert lines[1].startswith("versions: torch 2.") and "torch-tpu " in lines[1] and "libtpu " in lines[1]
    assert any(l.startswith("device: CPU (cpu)") and "this is the CPU plan" in l for l in lines), lines
    for model in ("tiny-shapes", "tiny-flux"):  # the offline defaults, each with its placement and weights
        assert any(l.startswith(f"- {model}: whole on cpu, 1 device; weights ") for l in lines), lines
    assert "pinning probe: skipped (no TPU chips on this host" in out.stdout
    assert any(l.startswith("processes: one app process serving http://127.0.0.1:") for l in lines)
    assert lines[-1] == "check: OK (CPU, 4 model(s) offered)"
    assert not (tmp_path / "cache" / "models").exists()  # nothing built, nothing loaded


def test_a_half_downloaded_model_exits_1_naming_the_missing_files_and_complete_it_passes(tmp_path):
    spec = CATALOG["sd3.5-medium"]
    hub = tmp_path / "hub"
    fake_snapshot(hub, spec.hub_repo, sd35_files(shards_present=1))
    half = run_check(tmp_path, "--models", "tiny-flux,sd3.5-medium")
    assert half.returncode == 1, half.stdout
    text = half.stdout
    assert "- sd3.5-medium: whole on cpu, 1 device; weights INCOMPLETE, 2 file(s) missing" in text
    assert "    transformer/diffusion_pytorch_model-00002-of-00002.safetensors  MISSING" in text
    assert "    vae/*.safetensors  MISSING" in text  # a component with a config and no weights
    assert "    transformer/diffusion_pytorch_model-00001-of-00002.safetensors  2.00 MB" in text
    summary = text[text.index("check: 1 problem(s):"):]
    assert "sd3.5-medium: weights incomplete, missing transformer/diffusion_pytorch_model-00002-of-00002" \
           ".safetensors, vae/*.safetensors" in summary and spec.download_command in summary
    # the default offer (no --models) does not count a half download as present
    assert "models offered: tiny-shapes, tiny-flux, tiny-sd3, tiny-flux2\n" in run_check(tmp_path).stdout

    fake_snapshot(hub, spec.hub_repo, {"transformer/diffusion_pytorch_model-00002-of-00002.safetensors": b"\0" * 2_000_000,
                                       "vae/diffusion_pytorch_model.safetensors": b"\0" * 500})
    complete = run_check(tmp_path, "--models", "sd3.5-medium")
    assert complete.returncode == 0, complete.stdout
    assert "- sd3.5-medium: whole on cpu, 1 device; weights complete: 6 file(s), 4.00 MB" in complete.stdout
    assert "models offered: tiny-shapes, tiny-flux, tiny-sd3, tiny-flux2, sd3.5-medium\n" in run_check(tmp_path).stdout


def test_check_chips_all_on_cpu_names_the_problem_and_chips_n_lists_the_processes(tmp_path):
    refused = run_check(tmp_path, "--chips", "all", "--models", "tiny-flux")
    assert refused.returncode == 1
    assert "- --chips all: no TPU chips on this host; give a number (--chips 2)" in refused.stdout
    two = run_check(tmp_path, "--chips", "2", "--models", "tiny-flux")
    assert two.returncode == 0, two.stdout
    assert "--chips 2: one engine per chip: 2 engines on CPU; tiny-flux (whole, one engine each)" in two.stdout
    assert two.stdout.count("  engine ") == 2 and "  nginx (" in two.stdout and "readiness sync: " in two.stdout


@pytest.mark.timeout(900)
def test_on_a_tpu_host_each_chip_is_probed_in_its_own_process_and_a_leaky_pin_fails(tmp_path):
    """Under the stand-in (4 v6e chips in every process): four probe children, each pinned to its chip,
    each sees one; with a libtpu that ignores the pins (on 2 chips), each sees both and the check exits 1."""
    standin = {"PYTHONPATH": str(STANDIN_SITE), "TPU_STANDIN": "4,TPU v6e,32000000000"}
    good = run_check(tmp_path, "--chips", "all", "--models", "tiny-flux,tiny-sd3", **standin)
    assert good.returncode == 0, good.stdout + good.stderr[-3000:]
    assert "device: TPU v6e, 4 chip(s) on this host, 32.0 GB HBM per chip" in good.stdout
    for chip in range(4):
        assert (f"pinning probe chip {chip}: TPU_VISIBLE_CHIPS={chip} -> the process sees 1 device(s), "
                f"chip {chip} (ok)") in good.stdout
    assert "--chips all: one engine per chip: 4 x TPU v6e" in good.stdout
    assert good.stdout.count("  engine ") == 4 and "TPU_VISIBLE_CHIPS=3 TPU_CHIPS_PER_PROCESS_BOUNDS=1,1,1" in good.stdout

    # two chips are enough to show a leak (each probe is a process importing torch)
    leaky = run_check(tmp_path, "--models", "tiny-flux", **{**standin, "TPU_STANDIN": "2,TPU v6e,32000000000"},
                      TPU_STANDIN_IGNORES_PINNING="1")
    assert leaky.returncode == 1
    assert "- pinning probe chip 1: a process pinned to chip 1 sees 2 TPU v6e device(s), not 1" in leaky.stdout

    # a v5e-4 host asked to serve both real models: refused naming FLUX.1, whose weights are also missing
    v5e = run_check(tmp_path, "--chips", "all", "--models", "flux.1-schnell,sd3.5-medium",
                    **{**standin, "TPU_STANDIN": "4,TPU v5e,16000000000"})
    assert v5e.returncode == 1
    assert "- flux.1-schnell: it fits neither one TPU v5e chip nor 4 of them sharded. Options: " in v5e.stdout
    assert "flux.1-schnell: weights incomplete, missing model_index.json" in v5e.stdout
