"""The benchmark suite: ``python -m benchmarks.run [--smoke]``.

Proves "compile once, then only compute" on whatever device this machine has: it starts the
real app (engine + Gradio server on loopback) and measures, in one run and side by side,
what the engine and the app add over the bare diffusers call, cold vs warm per mode, that
nothing recompiles after warmup, memory with one vs all buckets warm, what step previews
cost, throughput with a saturated queue, and a restart with the persistent compile cache vs
a cold one (real subprocesses). Writes ``benchmarks/results/<device>-<date>.json`` and prints
a markdown table. Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

PROMPT = "a lighthouse on a cliff at sunset, oil painting"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent

#: Targets from issue 7 (reported next to the measurement, not asserted).
TARGETS = {
    "engine_overhead": "<= 1.02x",
    "app_overhead": "<= 1.10x and <= 25 ms",
    "recompiles_after_warmup": "0",
    "memory": "<= 1.15x",
    "previews": "<= 1.05x",
    "restart": "<= 0.35x",
}


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
                        help="CI: 64x64, 2 steps, 2 buckets, aot_eager, few repetitions (checks it runs, not speed)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.resolution, args.buckets, args.steps = "64x64", "64x64,96x64", 2
        args.pairs, args.steady, args.mixed_requests = 2, 1, 6
        args.clients, args.requests_per_client, args.compile_backend = 2, 1, "aot_eager"
    return args


@dataclass
class Bench:
    """What every section measures against: the running app, its engine and the same warm pipeline."""

    args: argparse.Namespace
    app: Any
    url: str
    spec: Any
    bucket: Any
    buckets: tuple
    pipeline: Any

    @property
    def engine(self) -> Any:
        return self.app.engine

    def fields(self, seed: int, mode: str = "compiled", bucket: Any = None, steps: int | None = None,
               num_images: int = 1, previews: bool = False) -> dict[str, Any]:
        return dict(prompt=PROMPT, model=self.spec.id, mode=mode, resolution=str(bucket or self.bucket),
                    num_inference_steps=steps or self.args.steps, guidance_scale=self.spec.default_guidance,
                    seed=seed, num_images=num_images, previews=previews)

    def engine_request(self, **fields: Any) -> list[Any]:
        """One request through ``Engine.generate``, consumed to the end; returns its ImageResults."""
        from tpu_demo.core.events import ImageResult
        from tpu_demo.core.request import validate_request

        request = validate_request(self.fields(**fields), self.app.ui.settings.limits)
        results = [event for event in self.engine.generate(request) if isinstance(event, ImageResult)]
        if len(results) != request.num_images:
            raise RuntimeError(f"engine returned {len(results)} of {request.num_images} images")
        return results

    def bare_call(self, seed: int, mode: str = "compiled", callback: Callable | None = None) -> Any:
        """The bare diffusers call: the same pipeline, inputs and execution mode, no engine."""
        import torch

        from tpu_demo.device import execution_mode, synchronize
        from tpu_demo.core.modes import ExecutionMode

        kwargs = self.spec.pipeline_kwargs(self.spec.default_guidance)
        if callback is not None:
            kwargs.update(callback_on_step_end=callback, callback_on_step_end_tensor_inputs=["latents"])
        with execution_mode(ExecutionMode(mode), self.engine.device), torch.inference_mode():
            output = self.pipeline(prompt=PROMPT, height=self.bucket.height, width=self.bucket.width,
                                   num_inference_steps=self.args.steps,
                                   generator=torch.Generator("cpu").manual_seed(seed), **kwargs)
            synchronize(self.engine.device)
        return output.images[0]


# ---- sections ------------------------------------------------------------------------------

def measure_warm_vs_cold(bench: Bench) -> dict[str, Any]:
    """Per mode: the first request of the main bucket (compiles in compiled mode) vs steady state."""
    from benchmarks.measure import median, timed

    from tpu_demo.core.events import ShapeKey
    from tpu_demo.core.modes import ExecutionMode

    figures = {}
    for mode in ExecutionMode:
        first: list[Any] = []
        cold = timed(lambda: first.extend(bench.engine_request(seed=1, mode=mode.value)))
        warm = [timed(lambda s=seed: bench.engine_request(seed=s, mode=mode.value)) for seed in range(2, 2 + bench.args.steady)]
        status = bench.engine.bucket_status(ShapeKey(bench.spec.id, mode.value, str(bench.bucket)))
        figures[mode.value] = {"cold_s": round(cold, 3), "warm_median_s": round(median(warm), 4),
                               "ratio": round(cold / median(warm), 2), "compiles_first": first[0].timings["compiles"],
                               "from_cache": status.from_cache, "described_as": bench.engine.mode_description(mode)}
    return figures


def measure_other_buckets(bench: Bench) -> dict[str, Any]:
    """Compiled mode: the first (compiling) request of every other bucket, then a warm one."""
    from benchmarks.measure import timed

    figures = {}
    for bucket in bench.buckets:
        if bucket == bench.bucket:
            continue
        results: list[Any] = []
        cold = timed(lambda b=bucket: results.extend(bench.engine_request(seed=1, bucket=b)))
        warm = timed(lambda b=bucket: bench.engine_request(seed=2, bucket=b))
        figures[str(bucket)] = {"cold_s": round(cold, 3), "warm_s": round(warm, 4),
                                "compiles_first": results[0].timings["compiles"]}
    return figures


def measure_engine_overhead(bench: Bench) -> dict[str, Any]:
    from benchmarks.measure import interleaved_pairs

    a_seeds, b_seeds = itertools.count(100), itertools.count(100)  # pair i: seed 100 + i on both sides
    pairs = interleaved_pairs(lambda: bench.engine_request(seed=next(a_seeds)), lambda: bench.bare_call(next(b_seeds)),
                              bench.args.pairs)
    return {**pairs.summary(), "a": "Engine.generate (compiled, previews off)", "b": "bare pipeline call"}


def measure_previews(bench: Bench) -> dict[str, Any]:
    """What previews cost: end to end through the app (what a visitor waits for, previews on vs off),
    and beside it the device thread's own share per step (project on the device, start the copy)."""
    from benchmarks import previews as end_to_end
    from benchmarks.measure import median, timed

    from tpu_demo.engine.preview_stream import PreviewStream
    from tpu_demo.engine.previews import LatentPreviewer

    steps, bucket = bench.args.steps, bench.bucket
    previewer = LatentPreviewer()
    final: dict[str, Any] = {}

    def keep_final(pipeline: Any, step: int, timestep: Any, kwargs: dict) -> dict:
        final["latents"] = kwargs["latents"].detach().to("cpu", copy=True)
        return {}

    image = bench.bare_call(7, callback=keep_final)  # fit the projection as the app's warmup does
    previewer.observe(final["latents"], image, bucket)
    capture_ms: list[float] = []
    render_ms: list[float] = []
    step_ms: list[float] = []
    frames: list[Any] = []
    stream = PreviewStream(previewer, bucket, bench.engine.device, every=1, min_seconds=0.0)

    def with_previews(pipeline: Any, step: int, timestep: Any, kwargs: dict) -> dict:
        started = time.perf_counter()
        frame = stream.step(step + 1, steps, kwargs["latents"])  # the device thread's share, every step
        capture_ms.append(1000 * (time.perf_counter() - started))
        if frame is not None:
            frames.append(frame)
        return {}

    last: dict[str, float] = {}

    def timestamps_only(pipeline: Any, step: int, timestep: Any, kwargs: dict) -> dict:
        now = time.perf_counter()
        if "t" in last:
            step_ms.append(1000 * (now - last["t"]))
        last["t"] = now
        return {}

    for _ in range(bench.args.pairs):
        bench.bare_call(11, callback=with_previews)
        last.clear()
        bench.bare_call(11, callback=timestamps_only)
    for frame in frames:  # the UI thread's share, off the device thread
        render_ms.append(1000 * timed(frame.render))
    if bench.args.smoke:
        cases = (end_to_end.PreviewCase("tiny-shapes", "64x64", 2, num_images=1),)
    else:
        cases = end_to_end.DEFAULT_CASES
    through_app = end_to_end.run(cases, bench.args.pairs, bench.args.main_cache_dir, bench.args.threads)
    return {"end_to_end": through_app,
            "fraction_of_step": round(median(capture_ms) / median(step_ms), 4),
            "capture_ms_median": round(median(capture_ms), 4), "render_ms_median": round(median(render_ms), 3),
            "render_fraction_of_step": round(median(render_ms) / median(step_ms), 4),
            "step_ms_median": round(median(step_ms), 3), "renders": len(render_ms),
            "preview_code": "PreviewStream.step on the device thread (project on device, start the host copy), "
                            "PreviewFrame.render in the UI"}


def measure_recompiles(bench: Bench) -> dict[str, Any]:
    """After warmup of every bucket in every mode: a mixed sequence over all of them (modes, step
    counts, seeds, image counts, previews on/off) must compile nothing."""
    from benchmarks.measure import CompileWatch

    from tpu_demo.core.modes import ExecutionMode

    spec, steps = bench.spec, bench.args.steps
    for mode in ExecutionMode:  # compiled buckets are warm already; eager ones warm in one call each
        bench.engine.warmup(spec.id, mode, bench.buckets)
    step_choices = sorted({max(spec.min_steps, min(spec.max_steps, s)) for s in (steps, max(1, steps // 2), steps + 3)})
    modes = ["compiled", "compiled", "eager", "compiled", "eager-fused"]
    images = not_warm = 0
    with CompileWatch(bench.engine.counter) as watch:
        for index in range(bench.args.mixed_requests):
            results = bench.engine_request(
                seed=1000 + 37 * index, mode=modes[index % len(modes)], bucket=bench.buckets[index % len(bench.buckets)],
                steps=step_choices[index % len(step_choices)], num_images=2 if index % 7 == 3 else 1,
                previews=index % 2 == 0)
            images += len(results)
            not_warm += sum(1 for r in results if not r.warm)
    return {"compiles": watch.compiles, "dynamo_graphs": watch.graphs, "backend_calls": watch.backend_calls,
            "requests": bench.args.mixed_requests, "images": images, "images_not_warm": not_warm,
            "buckets": [str(b) for b in bench.buckets], "steps": step_choices, "modes": sorted(set(modes))}


def measure_app_overhead(bench: Bench) -> dict[str, Any]:
    from gradio_client import Client

    from benchmarks.measure import interleaved_pairs

    client = Client(bench.url, verbose=False)
    a_seeds, b_seeds = itertools.count(500), itertools.count(500)  # pair i: seed 500 + i on both sides

    def through_app() -> None:
        job = client.submit(**bench.fields(seed=next(a_seeds)), api_name="/generate")
        updates = list(job)
        if not updates or not updates[-1][0]:  # each update: (gallery, live preview)
            raise RuntimeError("the app returned no image")

    pairs = interleaved_pairs(through_app, lambda: bench.bare_call(next(b_seeds)), bench.args.pairs)
    floor = gradio_floor_ms(bench.args.pairs)
    return {**pairs.summary(), "a": "gradio_client /generate on loopback (previews off)", "b": "bare pipeline call",
            "gradio_floor_ms": floor, "app_beyond_gradio_floor_ms": round(pairs.median_extra_ms - floor, 2)}


def gradio_floor_ms(calls: int) -> float:
    """Median round trip of the same client through a bare Gradio app whose generator yields one
    ready PNG into a gallery: Gradio's and gradio_client's own cost, which no app can go below."""
    import gradio as gr
    from gradio_client import Client
    from PIL import Image

    from benchmarks.measure import median, timed

    work = Path(tempfile.mkdtemp(prefix="gradio-floor-"))
    png = work / "image.png"
    Image.new("RGB", (128, 128), "white").save(png)

    def one_image(prompt: str):
        yield [(str(png), prompt)]

    with gr.Blocks(analytics_enabled=False) as floor_app:
        prompt, gallery = gr.Textbox(), gr.Gallery(format="png", type="filepath")
        prompt.submit(one_image, prompt, gallery, api_name="generate")
    port = _free_port()
    floor_app.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        client.predict("warm", api_name="/generate")
        seconds = [timed(lambda: list(client.submit("x", api_name="/generate"))) for _ in range(calls)]
    finally:
        floor_app.close()
        shutil.rmtree(work, ignore_errors=True)
    return round(1000 * median(seconds), 2)


def measure_throughput(bench: Bench, bare_image_s: float) -> dict[str, Any]:
    """Images per minute with the queue kept full by concurrent clients."""
    from gradio_client import Client

    clients = [Client(bench.url, verbose=False) for _ in range(bench.args.clients)]
    done: list[int] = []
    errors: list[str] = []

    def client_loop(index: int, client: Client) -> None:
        for request in range(bench.args.requests_per_client):
            try:
                updates = list(client.submit(**bench.fields(seed=10_000 + 100 * index + request), api_name="/generate"))
                done.append(len(updates[-1][0]))
            except Exception as error:  # noqa: BLE001 - counted and reported
                errors.append(str(error)[:200])

    threads = [threading.Thread(target=client_loop, args=(i, c)) for i, c in enumerate(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    images = sum(done)
    per_minute = 60 * images / elapsed
    bare_per_minute = 60 / bare_image_s
    return {"images_per_minute": round(per_minute, 1), "images": images, "seconds": round(elapsed, 2),
            "clients": bench.args.clients, "errors": errors, "bare_sequential_images_per_minute": round(bare_per_minute, 1),
            "ratio_to_bare": round(per_minute / bare_per_minute, 3)}


def measure_load_section(bench: Bench) -> dict[str, Any]:
    """1, 4, 16 clients (smoke: 1, 2), batching off and on, raw HTTP and gradio_client clients,
    interleaved (benchmarks/throughput.py)."""
    from benchmarks.throughput import measure_load
    from tpu_demo.core.modes import ExecutionMode

    bench.engine.warmup(bench.spec.id, ExecutionMode.COMPILED, buckets=(bench.bucket,))  # every batch size
    clients = (1, 2) if bench.args.smoke else (1, 4, 16)
    rounds, per_client = (1, 1) if bench.args.smoke else (3, 8)
    return measure_load(bench.url, bench.engine, bench.fields(seed=0), lambda seed: bench.bare_call(seed),
                        clients, per_client, rounds, bench.engine.max_batch)


def measure_restart(args: argparse.Namespace, work_dir: Path, buckets: str) -> dict[str, Any]:
    """Start-up to all buckets warm: a cold process (empty compile cache), then a second one."""
    from tpu_demo.core.catalog import get_spec
    from tpu_demo.engine.compile_cache import compile_cache_env
    from tpu_demo.models.loading import resolve_source

    cache_dir = work_dir / "restart-cache"
    resolve_source(get_spec(args.model), cache_dir / "models")  # build tiny models first: not compile time
    flags = ["--port", "0", "--cache-dir", str(cache_dir), "--model", args.model, "--models", args.model,
             "--buckets", buckets, "--mode", "compiled", "--compile-backend", args.compile_backend]
    if args.threads:
        flags += ["--threads", str(args.threads)]
    if args.device:
        flags += ["--device", args.device]
    ours = {name for name, value in compile_cache_env(args.main_cache_dir).items() if os.environ.get(name) == value}
    env = {name: value for name, value in os.environ.items() if name not in ours}
    runs = {}
    for label in ("cold", "with_cache"):
        command = [sys.executable, "-m", "benchmarks.startup_probe", "--timeout", str(args.startup_timeout), "--", *flags]
        spawned = time.time()
        out = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                             timeout=args.startup_timeout + 120)
        line = next((l for l in out.stdout.splitlines() if l.startswith("STARTUP_PROBE ")), None)
        if out.returncode != 0 or line is None:
            raise RuntimeError(f"startup probe ({label}) failed with {out.returncode}: {out.stderr[-2000:]}")
        report = json.loads(line.removeprefix("STARTUP_PROBE "))
        report["seconds_to_all_warm"] = round(report.pop("all_warm_at") - spawned, 2)
        runs[label] = report
    ratio = runs["with_cache"]["seconds_to_all_warm"] / runs["cold"]["seconds_to_all_warm"]
    return {"ratio": round(ratio, 3), **runs, "compile_cache_files": sum(1 for p in (cache_dir / "compile").rglob("*") if p.is_file())}


# ---- the run -------------------------------------------------------------------------------

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
    port = _free_port()
    flags = ["--port", str(port), "--cache-dir", str(args.main_cache_dir), "--model", args.model, "--models", args.model,
             "--buckets", bucket_text, "--mode", "compiled", "--compile-backend", args.compile_backend, "--no-warmup",
             "--max-queue", str(max(64, 2 * args.clients)), "--max-batch", "4", "--max-per-ip", "0"]
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
                                                       args.compile_backend, threads, args.startup_timeout + 120))
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


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _met(value: bool) -> str:
    return "yes" if value else "**no**"


def markdown_table(results: dict[str, Any]) -> str:
    """The README table: one row per figure, measured value next to its target."""
    f = results["figures"]
    rows = []
    e = f["engine_overhead"]
    rows.append(("engine overhead: `Engine.generate` / bare pipeline call", f"{e['ratio']:.3f}x ({e['median_extra_ms']:+.1f} ms/image, "
                 f"{e['median_b_ms']:.0f} ms bare, {e['pairs']} pairs; fastest/fastest {e['best_ratio']:.3f}x)", TARGETS["engine_overhead"], _met(e["ratio"] <= 1.02)))
    a = f["app_overhead"]
    rows.append(("app overhead: `gradio_client` `/generate` on loopback / bare call", f"{a['ratio']:.3f}x ({a['median_extra_ms']:+.1f} ms/request, "
                 f"{a['pairs']} pairs; fastest/fastest {a['best_ratio']:.3f}x)", TARGETS["app_overhead"], _met(a["ratio"] <= 1.10 and a["median_extra_ms"] <= 25)))
    rows.append(("Gradio's own floor: same client, bare Gradio app yielding one ready PNG",
                 f"{a['gradio_floor_ms']:.0f} ms/request; the app adds {a['app_beyond_gradio_floor_ms']:+.0f} ms beyond it",
                 "\u2013", "\u2013"))
    for mode, w in f["warm_vs_cold"].items():
        rows.append((f"warm vs cold, {mode} ({w['described_as']})", f"first request {w['cold_s']:.2f} s, then {1000 * w['warm_median_s']:.0f} ms "
                     f"({w['ratio']:.1f}x; {w['compiles_first']} graph compiled)", "\u2013", "\u2013"))
    if f["other_buckets_cold"]:
        cold = ", ".join(f"{b} {v['cold_s']:.1f} s" for b, v in f["other_buckets_cold"].items())
        rows.append(("first request of each other bucket (compiled)", cold, "\u2013", "\u2013"))
    r = f["recompiles_after_warmup"]
    rows.append(("recompiles after warmup", f"**{r['compiles']}** over {r['requests']} requests ({r['images']} images, "
                 f"{r['images_not_warm']} not warm; buckets "
                 f"{', '.join(r['buckets'])}; steps {', '.join(map(str, r['steps']))}; modes {', '.join(r['modes'])}; seeds varied)",
                 TARGETS["recompiles_after_warmup"], _met(r["compiles"] == 0 and r["images_not_warm"] == 0)))
    m = f["memory"]
    rows.append(("peak RSS, all buckets warm / one bucket warm", f"{m['ratio']:.3f}x ({m['all_buckets_peak_rss_mb']:.0f} MB / "
                 f"{m['one_bucket_peak_rss_mb']:.0f} MB, {m['warm_buckets']} buckets; weights {m['weights_mb']} MB held once)",
                 TARGETS["memory"], _met(m["ratio"] <= 1.15)))
    p = f["previews"]
    for label, e2e in p["end_to_end"].items():
        d, w = e2e["denoise_per_image"], e2e["whole_request"]
        rows.append((f"previews on / off through the app, {label}: denoise per image (whole request)",
                     f"{d['ratio']:.3f}x (pairs {d['pair_ratio_min']:.2f}-{d['pair_ratio_max']:.2f}; whole request "
                     f"{w['ratio']:.3f}x; {e2e['preview_frames_per_request']:g} previews/request, {e2e['pairs']} pairs)",
                     TARGETS["previews"], _met(d["ratio"] <= 1.05)))
    rows.append(("step preview on the device thread (project + start copy) / denoising step",
                 f"{100 * p['fraction_of_step']:.1f}% ({p['capture_ms_median']:.3f} ms / {p['step_ms_median']:.1f} ms); "
                 f"rendering it in the UI thread: {p['render_ms_median']:.3f} ms", "\u2013", "\u2013"))
    t = f["throughput"]
    rows.append((f"throughput, queue saturated by {t['clients']} clients", f"{t['images_per_minute']:.0f} images/min "
                 f"({t['ratio_to_bare']:.2f}x of back-to-back bare calls; {t['images']} images, {len(t['errors'])} errors)", "\u2013", "\u2013"))
    for row in f["load"]["configs"].values():
        rows.append((f"load: {row['clients']} client(s), max batch {row['max_batch']} ({row['client']} clients)",
                     f"{row['images_per_minute']:.0f} images/min ({row['ratio_to_bare']:.2f}x of bare calls; p50 "
                     f"{1000 * row['p50_latency_s']:.0f} ms, p95 {1000 * row['p95_latency_s']:.0f} ms; "
                     f"{row['error_count']} errors)",
                     ">= 0.6x at 4 clients, batching on" if row["clients"] == 4 and row["max_batch"] > 1 else "\u2013",
                     _met(row["ratio_to_bare"] >= 0.6) if row["clients"] == 4 and row["max_batch"] > 1 else "\u2013"))
    s = f["restart"]
    rows.append(("restart: start-up to all buckets warm, with cache / cold", f"{s['ratio']:.3f}x ({s['with_cache']['seconds_to_all_warm']:.1f} s / "
                 f"{s['cold']['seconds_to_all_warm']:.1f} s, {len(s['cold']['buckets'])} buckets)", TARGETS["restart"], _met(s["ratio"] <= 0.35)))
    w = f["switch"]
    pre, never = w["pre_warmed"], w["never_warmed"]
    rows.append((f"switch {pre['from']} -> {pre['to']}: pre-warmed (--warm all) / never warmed, seconds to the first image",
                 f"{w['ratio']:.3f}x ({pre['switch_seconds']:.2f} s / {never['switch_seconds']:.2f} s); compiled afresh "
                 f"after the switch: {pre['fresh_compiles']} (never warmed: {never['fresh_compiles']}; graphs traced "
                 f"{pre['graphs_captured']} / {never['graphs_captured']})", "0 compiled afresh",
                 _met(pre["fresh_compiles"] == 0) if pre["fresh_compiles"] is not None else "\u2013"))
    if "style_switch" in f:
        from benchmarks.styles import table_row

        rows.append(table_row(f["style_switch"]))
    header = (f"{results['device']} \u00b7 {results['model']} \u00b7 {results['resolution']} \u00b7 {results['steps']} steps \u00b7 "
              f"compiled = {results['compile_backend']} \u00b7 torch threads {results['threads']} \u00b7 load average "
              f"{results['load_average_start']} \u2192 {results['load_average_end']}")
    lines = [header, "", "| figure | measured | target | met |", "|---|---|---|---|"]
    lines += [f"| {name} | {value} | {target} | {met} |" for name, value, target, met in rows]
    return "\n".join(lines)


def output_path(results: dict[str, Any], output_dir: Path) -> Path:
    device = re.sub(r"[^a-z0-9]+", "-", results["device"].lower()).strip("-") or results["device_kind"]
    return Path(output_dir) / f"{device}-{datetime.date.today().isoformat()}.json"


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
