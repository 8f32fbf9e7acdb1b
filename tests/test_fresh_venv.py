"""The README's promise on a fresh machine: a new virtual environment (nothing from this machine's
site-packages) with only the requirement files installed runs the app, the launcher and every
import the project and its tests make.

``.ci/run`` runs the whole suite in such a venv and names it in ``CI_FRESH_VENV``: there these
tests use that venv (the interpreter running them) instead of installing every requirement a second
time. Anywhere else they make their own."""

import ast
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import free_port, request_fields

REPO = Path(__file__).resolve().parents[1]
LOCAL = {"tpu_demo", "tiny_shapes", "benchmarks", "scripts", "tests", "conftest", "support", "browser_support",
         "tp_float_output", "app"}


def third_party_imports() -> set[str]:
    """Top-level modules the project's code, scripts and tests import that are neither stdlib nor ours."""
    names: set[str] = set()
    for path in [REPO / "app.py", *REPO.glob("tpu_demo/**/*.py"), *REPO.glob("tiny_shapes/**/*.py"),
                 *REPO.glob("scripts/*.py"), *REPO.glob("benchmarks/**/*.py"), *REPO.glob("tests/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    local = LOCAL | {path.stem for path in REPO.glob("tests/**/*.py")} | {path.stem for path in REPO.glob("scripts/*.py")}
    return {name for name in names if name not in sys.stdlib_module_names and name not in local}


def _ci_venv() -> Path | None:
    """This interpreter, when it runs in the venv ``.ci/run`` made: new, no system site-packages, only
    the requirement files installed by the README's test command."""
    named = os.environ.get("CI_FRESH_VENV")
    if not named or Path(named).resolve() != Path(sys.prefix).resolve():
        return None
    config = (Path(sys.prefix) / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in config, config
    return Path(sys.executable)


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    if (ci := _ci_venv()) is not None:
        print(f"fresh venv: .ci/run's own ({ci.parent.parent})")
        return ci
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    out = subprocess.run([str(python), "-c", "import sys; print(sys.prefix != sys.base_prefix)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
    started = time.monotonic()
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", "requirements-test.txt"], cwd=REPO,
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    print(f"fresh venv: pip install -r requirements-test.txt took {time.monotonic() - started:.0f}s")
    return python


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}


def test_every_import_is_declared(fresh_venv):
    modules = sorted(third_party_imports())
    assert {"torch", "diffusers", "gradio", "gradio_client", "playwright", "PIL", "numpy"} <= set(modules)
    code = ("import importlib, sys\nmissing = []\nfor name in sys.argv[1:]:\n    try: importlib.import_module(name)\n"
            "    except ImportError as error: missing.append(f'{name}: {error}')\nprint('\\n'.join(missing))")
    out = subprocess.run([str(fresh_venv), "-c", code, *modules], cwd="/", env=_env(), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and not out.stdout.strip(), f"imported but not declared:\n{out.stdout}{out.stderr[-2000:]}"


def test_the_app_and_the_launcher_run_from_the_fresh_venv(fresh_venv, tmp_path):
    help_text = subprocess.run([str(fresh_venv), "app.py", "--help"], cwd=REPO, env=_env(), capture_output=True,
                               text=True, timeout=120)
    assert help_text.returncode == 0 and "--max-queue" in help_text.stdout, help_text.stderr[-2000:]
    # scripts/serve_tp.sh starts torchrun and its ranks with $PYTHON: here the fresh venv's
    launcher = subprocess.run(["bash", "scripts/serve_tp.sh", "2", "--device", "cpu", "--help"], cwd=REPO,
                              env={**_env(), "PYTHON": str(fresh_venv)}, capture_output=True, text=True, timeout=180)
    assert launcher.returncode == 0, launcher.stderr[-2000:]
    assert launcher.stdout.count("usage: app.py") == 2  # both ranks ran app.py
    # one request, end to end, over raw HTTP
    port = free_port()
    server = subprocess.Popen([str(fresh_venv), "app.py", "--port", str(port), "--no-warmup", "--models", "tiny-flux",
                               "--cache-dir", str(tmp_path), "--compile-backend", "aot_eager", "--threads", "1"],
                              cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, server.stdout.read()[-3000:]
            try:
                urllib.request.urlopen(url + "health", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the app did not start"
                time.sleep(0.5)
        body = json.dumps({"data": list(request_fields(previews=False, negative_prompt="", style="None",
                                                        style_scale=1.0, upsample_prompt=False).values())}).encode()
        posted = urllib.request.urlopen(urllib.request.Request(url + "gradio_api/call/generate", data=body,
                                                               headers={"content-type": "application/json"}), timeout=30)
        event_id = json.loads(posted.read())["event_id"]
        stream = urllib.request.urlopen(url + f"gradio_api/call/generate/{event_id}", timeout=120).read().decode()
        assert "event: complete" in stream and ".png" in stream, stream[-1000:]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
