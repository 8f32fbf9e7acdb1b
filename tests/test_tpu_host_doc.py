"""docs/tpu-host.md works as written where it can without a TPU: its `hf download` commands and sizes are
the catalog's, its `python app.py --check` runs here (as written it names every problem of this host; with
tiny models and two loopback engines it passes), and its start command is the one tests/test_chips.py runs
end to end (``start_command_on_cpu``). README's first screen links the page."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from conftest import free_ports
from tpu_demo.core.catalog import CATALOG, REAL_MODEL_IDS

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "tpu-host.md"
#: on CPU the real models stand in as the tiny models of the same pipelines
TINY_FOR = {"flux.1-schnell": "tiny-flux", "sd3.5-medium": "tiny-sd3", "flux.2-dev": "tiny-flux2"}


def page_commands(prefix: str) -> list[str]:
    """The page's commands (lines of its bash blocks and its table's code spans) that start with ``prefix``."""
    text = PAGE.read_text()
    lines = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()]
    lines += [span for row in text.splitlines() if row.startswith("| ") for span in re.findall(r"`([^`]+)`", row)]
    return [line.strip() for line in lines if line.strip().startswith(prefix)]


def on_cpu(command: str, port: int) -> list[str]:
    """``python app.py ...`` of the page with tiny models, two loopback engines for ``--chips all``, ``port``."""
    argv = shlex.split(command)[2:]
    swaps = {"--models": lambda v: ",".join(TINY_FOR[m] for m in v.split(",")), "--chips": lambda v: "2",
             "--host": lambda v: "127.0.0.1", "--port": lambda v: str(port)}
    out, skip = [], False
    for index, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        out.append(arg)
        if arg in swaps:
            out.append(swaps[arg](argv[index + 1]))
            skip = True
    return [sys.executable, "app.py", *out] + ([] if "--port" in out else ["--port", str(port)])


def start_command_on_cpu(port: int) -> list[str]:
    """The page's start command (`--chips all ... --warm all`) as it runs here: tests/test_chips.py runs it."""
    [start] = [c for c in page_commands("python app.py") if "--check" not in c]
    return on_cpu(start, port)


def test_download_commands_and_sizes_are_the_catalogs():
    rows = {row.split("|")[1].strip(): row for row in PAGE.read_text().splitlines() if row.startswith("| ")}
    downloads = page_commands("hf download") + page_commands("HF_TOKEN=... hf download")
    assert sorted(downloads) == sorted(CATALOG[m].download_command for m in REAL_MODEL_IDS)
    for model in REAL_MODEL_IDS:
        spec = CATALOG[model]
        assert f"`{spec.download_command}`" in rows[model]
        assert f"about {round(spec.total_gb)} GB" in rows[model], (model, spec.total_gb)  # 34, 16 and 112 GB
    # the install command carries the Dockerfile's torch index (else pip pulls a CUDA build)
    [install] = page_commands("pip install")
    index = re.search(r"--extra-index-url (\S+)", (REPO / "Dockerfile").read_text()).group(1)
    assert f"--extra-index-url {index}" in install and install.endswith("-r requirements.txt")


def test_the_check_command_runs_here_as_written_and_with_tiny_models(tmp_path):
    [check] = page_commands("python app.py --check")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "TPU_DEMO_CACHE_DIR": str(tmp_path / "cache")}
    written = subprocess.run([sys.executable, *shlex.split(check)[1:]], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=300)
    # as written, on this host: no chips for --chips all, no weights of either model; each named, exit 1
    assert written.returncode == 1, written.stdout
    summary = written.stdout[written.stdout.index("problem(s):"):]
    for problem in ("--chips all: no TPU chips on this host", "flux.1-schnell: weights incomplete, missing model_index.json",
                    "sd3.5-medium: weights incomplete, missing model_index.json"):
        assert problem in summary, summary
    tiny = subprocess.run(on_cpu(check, free_ports(3)), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert tiny.returncode == 0, tiny.stdout
    assert "--chips 2: one engine per chip: 2 engines on CPU; tiny-flux" in tiny.stdout


def test_the_start_command_is_the_one_the_chips_test_runs():
    command = start_command_on_cpu(8080)
    assert command[2:] == ["--chips", "2", "--host", "127.0.0.1", "--port", "8080", "--models", "tiny-flux,tiny-sd3",
                           "--mode", "compiled", "--warm", "all"]
    source = (REPO / "tests" / "test_chips.py").read_text()
    assert "start_command_on_cpu(port)" in source


def test_readme_first_screen_links_the_page():
    first_screen = "\n".join((REPO / "README.md").read_text().splitlines()[:45])
    assert "(docs/tpu-host.md)" in first_screen and "On a TPU host" in first_screen
