"""The benchmark suite's sections: each measures one figure against the running app (:class:`Bench`).

``benchmarks.run`` starts the app and calls them in order; each returns the figure's dict. Timings
are measured as ratios inside one run (interleaved pairs where two things are compared), never
asserted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from benchmarks.measure import free_port

PROMPT = "a lighthouse on a cliff at sunset, oil painting"
REPO_ROOT = Path(__file__).resolve().parent.parent


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
    port = free_port()
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
    """1, 4, 16 clients (smoke: 1, 2), batching off and on (the default), raw HTTP and gradio_client
    clients, and raw HTTP against Gradio's floor (benchmarks/floor_app.py), interleaved
    (benchmarks/throughput.py)."""
    from benchmarks.floor_app import start_floor, stop_floor
    from benchmarks.load_clients import INPUTS
    from benchmarks.throughput import measure_load
    from tpu_demo.core.modes import ExecutionMode
    from tpu_demo.launch.serve import generate_concurrency

    bench.engine.warmup(bench.spec.id, ExecutionMode.COMPILED, buckets=(bench.bucket,))  # every batch size
    clients = (1, 2) if bench.args.smoke else (1, 4, 16)
    rounds, per_client = (1, 1) if bench.args.smoke else (3, 8)
    port = free_port()
    floor, work = start_floor(INPUTS, generate_concurrency(bench.engine.max_batch),
                              bench.app.config.queue_poll_seconds, port)
    try:
        return measure_load(bench.url, bench.engine, bench.fields(seed=0), lambda seed: bench.bare_call(seed),
                            clients, per_client, rounds, bench.engine.max_batch,
                            floor_url=f"http://127.0.0.1:{port}/")
    finally:
        stop_floor(floor, work)


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
    if args.smoke:  # one graph per bucket, not one per batch size: the start-ups are what the smoke runs
        flags += ["--max-batch", "1"]
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

