"""Bucket parsing and the app's flags/environment variables."""

import subprocess
import sys
from pathlib import Path

import pytest

from tpu_demo.core.buckets import Bucket, BucketError, parse_bucket_list
from tpu_demo.launch.config import parse_config


def test_parse_bucket():
    assert Bucket.parse("128x96") == Bucket(128, 96)
    assert Bucket.parse(" 64 X 64 ") == Bucket(64, 64)
    assert str(Bucket(1344, 768)) == "1344x768"
    assert Bucket(1024, 1024).label == "1:1 \u00b7 1024x1024"
    assert Bucket(96, 64).aspect_ratio == "3:2"


@pytest.mark.parametrize("text", ["", "64", "64x", "x64", "64x65", "0x64", "-64x64", "64*64", "1e3x64"])
def test_bad_buckets_are_refused(text):
    with pytest.raises(BucketError):
        Bucket.parse(text)


def test_bucket_list_keeps_order_and_drops_duplicates():
    assert parse_bucket_list("128x96, 64x64,128x96") == (Bucket(128, 96), Bucket(64, 64))
    with pytest.raises(BucketError):
        parse_bucket_list(" , ")


def test_flags_and_environment():
    config = parse_config(["--port", "0", "--buckets", "64x64,128x96", "--mode", "compiled", "--no-warmup"], environ={})
    assert config.port == 0 and config.buckets == (Bucket(64, 64), Bucket(128, 96))
    assert config.mode == "compiled" and config.no_warmup
    env = {"TPU_DEMO_PORT": "8123", "TPU_DEMO_MODEL": "tiny-sd3", "TPU_DEMO_NO_WARMUP": "1", "TPU_DEMO_HOST": "0.0.0.0"}
    config = parse_config([], environ=env)
    assert (config.port, config.model, config.no_warmup, config.host) == (8123, "tiny-sd3", True, "0.0.0.0")
    assert parse_config(["--port", "9000"], environ=env).port == 9000  # the command line wins


@pytest.mark.parametrize("argv, flag", [
    (["--port", "abc"], "--port"),
    (["--port", "70000"], "--port"),
    (["--buckets", "65x64"], "--buckets"),
    (["--mode", "turbo"], "--mode"),
    (["--model", "no-such-model"], "--model"),
])
def test_bad_flag_exits_2_with_one_line(argv, flag):
    out = subprocess.run([sys.executable, "app.py", *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], out.stderr


def test_bad_environment_value_exits_2():
    with pytest.raises(SystemExit) as exit_info:
        parse_config([], environ={"TPU_DEMO_MODE": "turbo"})
    assert exit_info.value.code == 2


def test_a_switchs_environment_twin_reads_on_off_words_and_refuses_anything_else(capsys):
    """``TPU_DEMO_NO_MCP=maybe`` is a typo, not "off": it exits 2 naming the variable, as a bad flag does."""
    for raw, expected in (("1", True), ("Yes", True), (" ON ", True), ("0", False), ("off", False), ("FALSE", False)):
        assert parse_config([], environ={"TPU_DEMO_NO_MCP": raw}).no_mcp is expected, raw
    with pytest.raises(SystemExit) as exit_info:
        parse_config([], environ={"TPU_DEMO_NO_MCP": "maybe"})
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip()
    assert "TPU_DEMO_NO_MCP" in line and "--no-mcp" in line and "'maybe'" in line and "off" in line, line


def test_flags_doc_is_the_current_help_text():
    """docs/flags.md is generated from the flags' one declaration; regenerate with scripts/flags_doc.py."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from flags_doc import render

    assert (Path(__file__).resolve().parents[1] / "docs" / "flags.md").read_text(encoding="utf-8") == render()


def test_help_lists_the_values_of_every_enumerated_flag():
    """`python app.py --help`, run for real: an operator sees each choice without reading the code."""
    from tpu_demo.core.catalog import CATALOG, Placement
    from tpu_demo.core.modes import ExecutionMode

    result = subprocess.run([sys.executable, "app.py", "--help"], cwd=Path(__file__).resolve().parents[1],
                            env={**__import__("os").environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "COLUMNS": "400"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines: dict[str, str] = {}  # each option with its help, however argparse wrapped it
    option = ""
    for line in result.stdout.split("options:", 1)[1].splitlines():
        if line.strip().startswith("-"):
            option = line.split()[0]
        lines[option] = lines.get(option, "") + " " + line.strip()
    expected = {"--mode": [m.value for m in ExecutionMode], "--placement": [p.value for p in Placement],
                "--device": ["tpu", "cuda", "cpu"], "--compile-backend": ["inductor", "aot_eager", "eager"],
                "--max-batch": ["1", "2", "4"], "--model": list(CATALOG), "--models": list(CATALOG)}
    for option, values in expected.items():
        assert ", ".join(values) in lines[option], (option, lines[option])


def test_limits_default_to_the_layers_own_defaults():
    """One source of truth: a flag's default is the limit type's default, not a copy of it."""
    from tpu_demo.core.request import RequestLimits
    from tpu_demo.web.admission import AdmissionLimits

    config = parse_config([], environ={})
    assert (config.max_images, config.max_prompt_chars) == (RequestLimits().max_images, RequestLimits().max_prompt_chars)
    assert (config.max_queue, config.max_per_session, config.max_per_ip) == (
        AdmissionLimits().max_waiting, AdmissionLimits().max_per_session, AdmissionLimits().max_per_ip)
