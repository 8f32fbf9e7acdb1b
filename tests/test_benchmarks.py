"""The benchmark suite's own tools, the persistent compile cache, and a smoke run of the whole suite."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.measure import CompileWatch, interleaved_pairs, peak_rss_bytes, rss_bytes
from tpu_demo.engine import compile_cache
from tpu_demo.engine.compile_counter import CompileCounter

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_compile_watch_counts_a_known_recompile():
    counter = CompileCounter("eager")

    def scale(x):
        return x * 2 + 1

    compiled = torch.compile(scale, backend=counter, dynamic=False, fullgraph=True)
    with CompileWatch(counter) as first:
        compiled(torch.ones(3))
    with CompileWatch(counter) as same_shape:
        compiled(torch.ones(3) * 5)
    with CompileWatch(counter) as new_shape:
        compiled(torch.ones(7))  # static shapes: a new shape is a recompile
    assert (first.graphs, first.backend_calls) == (1, 1)
    assert (same_shape.graphs, same_shape.backend_calls, same_shape.compiles) == (0, 0, 0)
    assert (new_shape.graphs, new_shape.backend_calls, new_shape.compiles) == (1, 1, 1)


def test_rss_probe_sees_a_known_allocation():
    before, peak_before = rss_bytes(), peak_rss_bytes()
    block = np.full(200 * 1024 * 1024 // 8, 1.0)  # 200 MiB, every page written
    grown = rss_bytes() - before
    peak_after = peak_rss_bytes()
    del block
    assert 190 * 1024 * 1024 <= grown <= 260 * 1024 * 1024
    assert peak_after >= peak_before and peak_after >= before + 190 * 1024 * 1024
    assert peak_rss_bytes() >= before + 190 * 1024 * 1024  # the high-water mark remembers it after the release


def test_interleaved_pairs_alternate_order():
    order = []
    pairs = interleaved_pairs(lambda: order.append("a"), lambda: order.append("b"), 4)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert len(pairs.a_seconds) == len(pairs.b_seconds) == 4


@pytest.fixture
def clean_cache_env(monkeypatch):
    for name in compile_cache.compile_cache_env(Path("/x")):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(compile_cache, "_set_by_us", {})


def test_compile_cache_points_every_backend_under_cache_dir(tmp_path, clean_cache_env, monkeypatch):
    in_effect = compile_cache.use_compile_cache(tmp_path)
    assert in_effect["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "compile" / "inductor")
    assert in_effect["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] == str(tmp_path / "compile" / "torch-tpu")
    assert in_effect["TORCHINDUCTOR_FX_GRAPH_CACHE"] == in_effect["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "1"
    assert (tmp_path / "compile" / "inductor").is_dir() and (tmp_path / "compile" / "torch-tpu").is_dir()
    # our own earlier value may move; the operator's never does
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/operator/choice")
    moved = compile_cache.use_compile_cache(tmp_path / "other")
    assert moved["TORCHINDUCTOR_CACHE_DIR"] == "/operator/choice"
    assert moved["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] == str(tmp_path / "other" / "compile" / "torch-tpu")


def test_compile_source_reads_inductor_cache_hits(tmp_path, clean_cache_env):
    """A real inductor compile misses the empty cache; after a reset the same graph is a hit."""
    compile_cache.use_compile_cache(tmp_path)

    def shifted(x):
        return torch.sin(x) * 3 + 0.25

    sources = []
    for _ in range(2):
        torch._dynamo.reset()
        before = compile_cache.cache_counters()
        torch.compile(shifted, backend="inductor", dynamic=False)(torch.ones(8))
        sources.append(compile_cache.compile_source(before, compile_cache.cache_counters()))
    assert sources == [False, True]
    assert any((tmp_path / "compile" / "inductor").rglob("*")), "the cache was written under <cache-dir>/compile"
    assert compile_cache.compile_source(before, before) is None  # nothing compiled: unknown


def test_smoke_run_emits_every_figure(tmp_path):
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    run = subprocess.run([sys.executable, "-m", "benchmarks.run", "--smoke", "--output-dir", str(tmp_path)],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=480)
    assert run.returncode == 0, run.stderr[-3000:]
    [path] = list(tmp_path.glob("cpu-*.json"))
    results = json.loads(path.read_text())
    figures = results["figures"]
    assert set(figures) >= {"engine_overhead", "app_overhead", "warm_vs_cold", "recompiles_after_warmup", "memory",
                            "previews", "throughput", "restart"}
    assert figures["engine_overhead"]["pairs"] == figures["app_overhead"]["pairs"] == 2
    assert figures["engine_overhead"]["ratio"] > 0 and figures["app_overhead"]["median_a_ms"] > 0
    assert figures["app_overhead"]["gradio_floor_ms"] > 0
    assert set(figures["warm_vs_cold"]) == {"eager", "eager-fused", "compiled"}
    assert figures["warm_vs_cold"]["compiled"]["compiles_first"] == 1
    recompiles = figures["recompiles_after_warmup"]
    assert recompiles["compiles"] == 0 and recompiles["images_not_warm"] == 0 and recompiles["requests"] == 6 and len(recompiles["buckets"]) == 2
    assert figures["memory"]["all_buckets_peak_rss_mb"] >= figures["memory"]["one_bucket_peak_rss_mb"] > 0
    assert figures["previews"]["renders"] > 0 and figures["previews"]["fraction_of_step"] > 0
    [through_app] = figures["previews"]["end_to_end"].values()  # previews on vs off, measured from the client
    assert through_app["pairs"] == 2 and through_app["denoise_per_image"]["ratio"] > 0
    assert through_app["whole_request"]["on_ms"] > 0 and through_app["updates_per_request"]["off"] >= 1
    assert figures["throughput"]["images"] == 2 and figures["throughput"]["errors"] == []
    load = figures["load"]["configs"]  # 1 and 2 clients, batching off and on, one request each (smoke)
    assert sorted((row["clients"], row["max_batch"], row["client"]) for row in load.values()) == sorted(
        [(n, batch, kind) for n in (1, 2) for batch in (1, 4) for kind in ("http", "gradio_client")]
        + [(n, 1, "floor") for n in (1, 2)])  # the same raw-HTTP visitors against Gradio's floor
    assert all(row["images"] == row["clients"] and row["error_count"] == 0 for row in load.values())
    assert all(row["server_cpu_ms_per_image"] > 0 and row["client_cpu_ms_per_image"] > 0 for row in load.values())
    # the request path against its floor, each target with its figure, and where the time went
    targets = figures["load"]["targets"]
    assert {"figure", "goal", "met"} <= set(targets["one visitor at the default settings / bare calls"])
    stages = targets["one_visitor_stages_ms"]
    assert set(stages) == {"admission", "queue", "engine_handoff", "device", "png_encode_write", "after_last_image"}
    assert stages["device"] > 0 and stages["png_encode_write"] > 0 and targets["floor_ms_per_request"] > 0
    restart = figures["restart"]
    assert restart["cold"]["all_warm"] and restart["with_cache"]["all_warm"] and restart["ratio"] > 0
    # the smoke compiles with aot_eager, which keeps no persistent cache: the status says "unknown", not "hit"
    # one bucket at batch 1 (the smoke starts its probes with --max-batch 1)
    assert [b["from_cache"] for b in restart["with_cache"]["buckets"]] == [None]
    # a switch to a second model, never warmed vs pre-warmed by --warm all (aot_eager keeps no cache counters)
    styles = figures["style_switch"]  # tiny-shapes' styles hot-swapped on its warm compiled graph
    assert styles["switches"] >= 5 and styles["compiles"] == 0 and styles["dynamo_graphs"] == 0
    assert styles["swap_ms_median"] > 0 and "style switch" in run.stdout
    switch = figures["switch"]
    assert switch["pre_warmed"]["images"] == switch["never_warmed"]["images"] == 1 and switch["ratio"] > 0
    assert switch["pre_warmed"]["loaded_after"] == [switch["pre_warmed"]["to"]]
    # the smoke states the backend its compiled figures used (aot_eager off TPU in the smoke; inductor by default)
    assert results["compile_backend"] == "aot_eager"
    assert "compiled = aot_eager" in run.stdout
    for row in ("engine overhead", "app overhead", "warm vs cold, compiled", "recompiles after warmup", "peak RSS",
                "previews on / off through the app", "step preview", "throughput", "load: 2 client(s), max batch 4", "restart",
                "switch tiny-flux -> tiny-sd3: pre-warmed (--warm all)"):
        assert row in run.stdout
