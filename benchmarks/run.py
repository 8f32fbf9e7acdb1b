"""The benchmark suite: ``python -m benchmarks.run [--smoke]``.

Proves "compile once, then only compute" on whatever device this machine has: it starts the
real app (engine + Gradio server on loopback) and measures, in one run and side by side,
what the engine and the app add over the bare diffusers call, cold vs warm per mode, that
nothing recompiles after warmup, memory with one vs all buckets warm, what step previews
cost, throughput with a saturated queue, and a restart with the persistent compile cache vs
a cold one (real subprocesses). Writes ``benchmarks/results/<device>-<date>.json`` and prints
a markdown table. Timings are reported, never asserted. This module runs the suite; the sections are
in ``benchmarks/sections.py``, the table in ``benchmarks/report.py``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from benchmarks.measure import free_port
from benchmarks.report import markdown_table, output_path
from benchmarks.sections import (REPO_ROOT, Bench, measure_app_overhead, measure_engine_overhead,
                                 measure_load_section, measure_other_buckets, measure_previews, measure_recompiles,
                                 measure_restart, measure_throughput, measure_warm_vs_cold)

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-flux", help="catalog model id (real ones need local weights)")
    parser.add_argument("--resolution", default="128x128", help="the bucket most figures are measured on")
    parser.add_argument("--buckets", default=None,
                        help="buckets warmed for the all-buckets figures (default: the model's catalog buckets)")
    parser.add_argument("--steps", type=int, default=8, help="num_inference_steps of the measured requests")
    parser.add_argument("--style-model", default="tiny-shapes",
                        help="the model whose style adapters the style switch figure swaps (its own engine, compiled)")
    parser.add_argument("--switch-to", default="tiny-sd3",
                        help="the second model of the switch figure (never warmed vs pre-warmed with --warm all)")
    parser.add_argument("--pairs", type=int, default=20, help="interleaved A/B pairs per comparison")
    parser.add_argument("--steady", type=int, default=5, help="warm requests per mode for the warm-vs-cold figure")
    parser.add_argument("--mixed-requests", type=int, default=50, help="requests in the recompile check")
    parser.add_argument("--clients", type=int, default=4, help="concurrent gradio clients for throughput")
    parser.add_argument("--requests-per-client", type=int, default=5)
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend off TPU")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 on CPU)")
    parser.add_argument("--device", default=None, choices=["tpu", "cuda", "cpu"], help="restrict device detection")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="cache dir of the measuring process (default: a fresh one, so cold means cold)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--startup-timeout", type=float, default=1800.0, help="seconds a restart probe may take")
    parser.add_argument("--smoke", action="store_true",
                        help="CI: 64x64, 2 steps, 2 buckets, aot_eager, few repetitions, start-up probes at --max-batch 1 "
                             "(checks it runs, not speed)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.resolution, args.buckets, args.steps = "64x64", "64x64,96x64", 2
        args.pairs, args.steady, args.mixed_requests = 2, 1, 6
        args.clients, args.requests_per_client, args.compile_backend = 2, 1, "aot_eager"
    return args


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run_suite(args: argparse.Namespace) -> dict[str, Any]:
    work_dir = Path(tempfile.mkdtemp(prefix="tpu-demo-bench-"))
    args.main_cache_dir = args.cache_dir or work_dir / "main-cache"

    import tpu_demo  # noqa: F401 - offline defaults before gradio/hub imports
    from tpu_demo.engine.compile_cache import use_compile_cache

    use_compile_cache(args.main_cache_dir)  # before torch: torch-tpu reads it once at initialisation

    import torch
    from diffusers.utils import logging as diffusers_logging

    from benchmarks.measure import median, peak_rss_bytes, rss_bytes
    from tpu_demo.core.buckets import Bucket, parse_bucket_list
    from tpu_demo.core.catalog import get_spec
    from tpu_demo.launch.config import parse_config
    from tpu_demo.device import compile_backend_name, detect_device
    from tpu_demo.launch.serve import build_app, launch

    diffusers_logging.set_verbosity_error()  # the tiny tokenizers' truncation notes would flood the output
    device = detect_device(args.device)
    threads = args.threads or (1 if device.kind == "cpu" else None)
    args.threads = threads
    spec = get_spec(args.model)
    main_bucket = Bucket.parse(args.resolution)
    buckets = parse_bucket_list(args.buckets) if args.buckets else spec.buckets
    buckets = (main_bucket,) + tuple(b for b in buckets if b != main_bucket)
    bucket_text = ",".join(str(b) for b in buckets)
    port = free_port()
    flags = ["--port", str(port), "--cache-dir", str(args.main_cache_dir), "--model", args.model, "--models", args.model,
             "--buckets", bucket_text, "--mode", "compiled", "--compile-backend", args.compile_backend, "--no-warmup",
             "--max-queue", str(max(64, 2 * args.clients)), "--max-per-ip", "0"]
    if threads:
        flags += ["--threads", str(threads)]
    if args.device:
        flags += ["--device", args.device]
    results: dict[str, Any] = {
        "device": device.badge, "device_kind": device.kind, "model": args.model, "resolution": str(main_bucket),
        "buckets": [str(b) for b in buckets], "steps": args.steps,
        # the backend compiled mode really uses here: torch-tpu's "tpu" on TPU, else the flag's
        "compile_backend": compile_backend_name(device, args.compile_backend),
        "threads": threads, "smoke": args.smoke, "torch": torch.__version__, "python": platform.python_version(),
        "commit": _git_commit(), "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "load_average_start": _load_average(), "command": "python -m benchmarks.run " + " ".join(sys.argv[1:]),
        "figures": {},
    }
    figures = results["figures"]
    app = build_app(parse_config(flags, environ={}))
    launch(app, prevent_thread_lock=True, quiet=True)
    try:
        bench = Bench(args, app, f"http://127.0.0.1:{port}/", spec, main_bucket, buckets, app.engine.load(args.model))
        _section(results, "warm_vs_cold", lambda: measure_warm_vs_cold(bench))
        figures["memory"] = {"one_bucket_peak_rss_mb": round(peak_rss_bytes() / 1e6, 1),
                             "one_bucket_rss_mb": round(rss_bytes() / 1e6, 1)}
        _section(results, "other_buckets_cold", lambda: measure_other_buckets(bench))
        memory = figures["memory"]
        memory.update(all_buckets_peak_rss_mb=round(peak_rss_bytes() / 1e6, 1), all_buckets_rss_mb=round(rss_bytes() / 1e6, 1),
                      warm_buckets=len(buckets))
        memory["ratio"] = round(memory["all_buckets_peak_rss_mb"] / memory["one_bucket_peak_rss_mb"], 3)
        memory["rss_ratio"] = round(memory["all_buckets_rss_mb"] / memory["one_bucket_rss_mb"], 3)
        memory["weights_mb"] = app.engine.status().models[args.model]["weights_mb"]
        _section(results, "engine_overhead", lambda: measure_engine_overhead(bench))
        _section(results, "previews", lambda: measure_previews(bench))
        _section(results, "recompiles_after_warmup", lambda: measure_recompiles(bench))
        _section(results, "app_overhead", lambda: measure_app_overhead(bench))
        bare_image_s = median(figures["engine_overhead"]["b_ms"] + figures["app_overhead"]["b_ms"]) / 1000
        _section(results, "throughput", lambda: measure_throughput(bench, bare_image_s))
        _section(results, "load", lambda: measure_load_section(bench))
    finally:
        app.demo.close()
        app.engine.close()
    restart_buckets = str(main_bucket) if args.smoke else bucket_text  # smoke: two process start-ups are enough
    _section(results, "restart", lambda: measure_restart(args, work_dir, restart_buckets))
    from benchmarks.switch_probe import measure_switch

    _section(results, "switch", lambda: measure_switch(work_dir, args.model, args.switch_to, str(main_bucket),
                                                       args.compile_backend, threads, args.startup_timeout + 120,
                                                       max_batch=1 if args.smoke else 0))
    from benchmarks.styles import measure_style_switch

    _section(results, "style_switch", lambda: measure_style_switch(
        args.main_cache_dir / "models", args.style_model, args.compile_backend, args.steps, args.smoke))
    results["load_average_end"] = _load_average()
    results["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    shutil.rmtree(work_dir, ignore_errors=True)
    return results


def _section(results: dict[str, Any], name: str, measure: Callable[[], Any]) -> None:
    started = time.perf_counter()
    results["figures"][name] = measure()
    results.setdefault("section_seconds", {})[name] = round(time.perf_counter() - started, 1)
    print(f"[benchmarks] {name}: {results['section_seconds'][name]} s", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = run_suite(args)
    path = output_path(results, args.output_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
    results["table"] = markdown_table(results)
    path.write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
    print(results["table"])
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
