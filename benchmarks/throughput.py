"""Throughput under load: 1, 4 and 16 clients, batching off and on, against back-to-back bare calls.

``python -m benchmarks.throughput`` starts the real app (tiny-flux, 64x64, 4 steps, compiled,
``--max-batch 4``, every batch size warm), then in rounds runs each configuration once, in an
order that rotates every round (interleaved, so machine load hits all alike), plus a block of
back-to-back bare pipeline calls on the same warm pipeline. "Batching off" is the same app with
the engine's largest batch set to 1 (handlers still overlap); "on" lets waiting images of one
shape share a call of 2 or 4. The clients run in another process (benchmarks/load_clients.py).
Reported: images/min, the ratio to the bare calls' images/min, p50/p95 latency per request as
a client saw it, and the machine's load average. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "a lighthouse on a cliff at sunset, oil painting"


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run_clients(url: str, clients: int, requests: int, fields: dict[str, Any], kind: str = "http") -> dict[str, Any]:
    """One burst: ``clients`` visitors of ``kind`` in another process, ``requests`` each, back to back;
    adds the CPU seconds this process (the server) spent meanwhile."""
    command = [sys.executable, "-m", "benchmarks.load_clients", "--url", url, "--clients", str(clients),
               "--requests", str(requests), "--fields", json.dumps(fields), "--client", kind]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ready = process.stdout.readline()
        if ready.strip() != "READY":
            raise RuntimeError(f"load clients did not start: {ready!r}")
        server_cpu = time.process_time()
        process.stdin.write("go\n")
        process.stdin.flush()
        line = process.stdout.readline()
        server_cpu = time.process_time() - server_cpu
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    return {**json.loads(line), "server_cpu_seconds": server_cpu}


def row_key(clients: int, batch: int, kind: str, poll: float | None) -> str:
    if kind == FLOOR:
        return f"{clients}_clients_floor_http"
    return f"{clients}_clients_batch_{batch}_{kind}" + ("" if poll is None else f"_poll_{poll:g}")


#: the client kind of the floor rows: raw HTTP visitors against benchmarks/floor_app.py
FLOOR = "floor"


class RequestLines(logging.Handler):
    """The app's request log lines (``tpu_demo.requests``) as they are written: their ``stages_ms``."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = json.loads(record.getMessage())
        except ValueError:
            return
        if isinstance(line, dict) and "stages_ms" in line and line.get("outcome") == "ok":
            self.lines.append(line)


def median_stages(lines: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per stage, the median milliseconds over ``lines``."""
    names = lines[0]["stages_ms"] if lines else {}
    return {name: round(percentile([line["stages_ms"][name] for line in lines], 0.5), 2) for name in names}


def bare_block(bare_call: Callable[[int], Any], images: int) -> float:
    """Seconds for ``images`` back-to-back bare pipeline calls."""
    started = time.perf_counter()
    for seed in range(images):
        bare_call(seed)
    return time.perf_counter() - started


def measure_load(url: str, engine: Any, fields: dict[str, Any], bare_call: Callable[[int], Any],
                 clients: Sequence[int] = (1, 4, 16), requests_per_client: int = 3, rounds: int = 3,
                 max_batch: int = 4, kinds: Sequence[str] = ("http", "gradio_client"),
                 polls: Sequence[float] = (), set_poll: Callable[[float], Any] = lambda seconds: None,
                 floor_url: str | None = None) -> dict[str, Any]:
    """Every (clients, batching, client kind, queue poll) configuration ``rounds`` times, interleaved,
    plus bare blocks (run with the server idle at the first of ``polls``, the app's own setting) and,
    given ``floor_url`` (benchmarks/floor_app.py), the same raw-HTTP visitors against Gradio's floor."""
    configs = [(n, batch, kind, poll) for poll in (polls or (None,)) for kind in kinds for n in clients
               for batch in (1, max_batch)]
    if floor_url:
        configs += [(n, 1, FLOOR, None) for n in clients]
    totals = {config: {"seconds": 0.0, "images": 0, "latencies": [], "errors": [], "server_cpu": 0.0,
                       "client_cpu": 0.0, "stages": []} for config in configs}
    logs = RequestLines()
    request_log = logging.getLogger("tpu_demo.requests")
    level = request_log.level
    request_log.setLevel(logging.INFO)  # the app's request lines are INFO; unconfigured logging drops them
    request_log.addHandler(logs)
    bare_seconds = bare_images = 0.0
    load = []
    for round_index in range(rounds):
        order = configs[round_index % len(configs):] + configs[:round_index % len(configs)]
        if round_index % 2:
            order.reverse()
        n_bare = 4 * requests_per_client
        if polls:
            set_poll(polls[0])
        bare_seconds += bare_block(bare_call, n_bare)
        bare_images += n_bare
        for n, batch, kind, poll in order:
            engine.set_max_batch(batch)
            if poll is not None:
                set_poll(poll)
            logged = len(logs.lines)
            if kind == FLOOR:
                burst = run_clients(floor_url, n, requests_per_client, fields, "http")
            else:
                burst = run_clients(url, n, requests_per_client, fields, kind)
            total = totals[(n, batch, kind, poll)]
            total["stages"] += logs.lines[logged:]
            total["seconds"] += burst["seconds"]
            total["images"] += burst["images"]
            total["latencies"] += burst["latencies"]
            total["errors"] += burst["errors"]
            total["server_cpu"] += burst["server_cpu_seconds"]
            total["client_cpu"] += burst["client_cpu_seconds"]
        load.append(os.getloadavg()[0])
    request_log.removeHandler(logs)
    request_log.setLevel(level)
    engine.set_max_batch(max_batch)
    if polls:
        set_poll(polls[0])
    bare_per_minute = 60 * bare_images / bare_seconds
    rows = {}
    for (n, batch, kind, poll), total in totals.items():
        per_minute = 60 * total["images"] / total["seconds"]
        images = max(total["images"], 1)
        rows[row_key(n, batch, kind, poll if len(polls) > 1 else None)] = {
            "clients": n, "max_batch": batch, "client": kind, "queue_poll_seconds": poll,
            "images_per_minute": round(per_minute, 1),
            # CPU per image: the server process (every thread: Gradio, handlers, the device thread) and the clients'
            "server_cpu_ms_per_image": round(1000 * total["server_cpu"] / images, 1),
            "client_cpu_ms_per_image": round(1000 * total["client_cpu"] / images, 1),
            "ratio_to_bare": round(per_minute / bare_per_minute, 3), "images": total["images"],
            "p50_latency_s": round(percentile(total["latencies"], 0.5), 3),
            "p95_latency_s": round(percentile(total["latencies"], 0.95), 3), "errors": total["errors"][:5],
            "error_count": len(total["errors"]), "stages_ms": median_stages(total["stages"])}
    on, off = max_batch, 1
    shown_polls = polls if len(polls) > 1 else (None,)

    def ipm(n: int, batch: int, kind: str, poll: float | None) -> float:
        return rows[row_key(n, batch, kind, poll)]["images_per_minute"]

    four_vs_one = {f"{kind}, batching {side}" + ("" if poll is None else f", poll {poll:g} s"):
                   round(ipm(4, batch, kind, poll) / ipm(1, batch, kind, poll), 3)
                   for poll in shown_polls for kind in kinds for side, batch in (("on", on), ("off", off))
                   } if {1, 4} <= set(clients) else {}
    result = {"configs": rows, "bare_images_per_minute": round(bare_per_minute, 1), "rounds": rounds,
              "requests_per_client": requests_per_client, "load_average_per_round": [round(x, 2) for x in load],
              "calls_by_batch": dict(engine.calls_by_batch), "four_clients_vs_one": four_vs_one}
    if floor_url and "http" in kinds:
        result["targets"] = targets(rows, bare_per_minute, max_batch, max(clients))
    return result


def targets(rows: dict[str, Any], bare_per_minute: float, max_batch: int, crowd: int) -> dict[str, Any]:
    """The request path's targets, each with its figure, its goal and, where it misses, the stage that
    holds it back (the largest beyond the device in the app's request log)."""
    one_on, one_off = rows[row_key(1, max_batch, "http", None)], rows[row_key(1, 1, "http", None)]
    floor = rows[row_key(1, 1, FLOOR, None)]
    bare_ms = 60_000 / bare_per_minute
    beyond = 1000 * one_on["p50_latency_s"] - 1000 * floor["p50_latency_s"] - bare_ms
    stages = {name: ms for name, ms in one_on["stages_ms"].items() if name != "device"}
    holding = max(stages, key=stages.get) if stages else "unknown"
    figures = {
        "one visitor at the default settings / bare calls": (one_on["ratio_to_bare"], ">= 0.8", one_on["ratio_to_bare"] >= 0.8),
        "one visitor: ms per request beyond the floor and the bare call": (round(beyond, 1), "<= 5", beyond <= 5),
        "one visitor, batching on / off": (round(one_on["images_per_minute"] / one_off["images_per_minute"], 3), ">= 0.98",
                                           one_on["images_per_minute"] >= 0.98 * one_off["images_per_minute"]),
        f"{crowd} visitors, batching on / bare calls": (rows[row_key(crowd, max_batch, "http", None)]["ratio_to_bare"],
                                                       ">= 0.9", rows[row_key(crowd, max_batch, "http", None)]["ratio_to_bare"] >= 0.9),
    }
    return {name: {"figure": figure, "goal": goal, "met": met, **({} if met else {"held_back_by": holding})}
            for name, (figure, goal, met) in figures.items()} | {
        "floor_ms_per_request": round(1000 * floor["p50_latency_s"], 1), "bare_ms_per_image": round(bare_ms, 1),
        "one_visitor_stages_ms": one_on["stages_ms"]}


def markdown(result: dict[str, Any]) -> str:
    lines = ["| client | clients | max batch | queue poll | images/min | / bare calls | p50 latency | p95 latency | "
             "CPU ms per image: server, clients | errors |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["configs"].values():
        poll = "app's" if row["queue_poll_seconds"] is None else f"{row['queue_poll_seconds'] * 1000:g} ms"
        lines.append(f"| {row['client']} | {row['clients']} | {row['max_batch']} | {poll} | "
                     f"{row['images_per_minute']:.0f} | "
                     f"{row['ratio_to_bare']:.2f}x | {row['p50_latency_s'] * 1000:.0f} ms | "
                     f"{row['p95_latency_s'] * 1000:.0f} ms | {row['server_cpu_ms_per_image']:.0f}, "
                     f"{row['client_cpu_ms_per_image']:.0f} | {row['error_count']} |")
    for name, target in result.get("targets", {}).items():
        if isinstance(target, dict) and "goal" in target:
            held = f" (held back by: {target['held_back_by']})" if "held_back_by" in target else ""
            lines.append(f"| target | {name} | | | {target['figure']} | goal {target['goal']} | "
                         f"{'met' if target['met'] else 'missed'}{held} | | | |")
    if "targets" in result:
        lines.append(f"\none visitor's median stages (ms, from the app's request log): "
                     f"{result['targets']['one_visitor_stages_ms']}; floor {result['targets']['floor_ms_per_request']} "
                     f"ms/request; bare call {result['targets']['bare_ms_per_image']} ms/image")
    lines.append(f"\nbare back-to-back calls: {result['bare_images_per_minute']:.0f} images/min; 4 clients / 1 client: "
                 f"{result['four_clients_vs_one']}; load average per round {result['load_average_per_round']}; "
                 f"calls by batch size {result['calls_by_batch']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-flux")
    parser.add_argument("--resolution", default="64x64")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--mode", default="compiled")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--max-batch", type=int, default=4, help="the batching-on side (the app's default: the "
                        "model's catalog max_batch, 4 for the tiny models)")
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--client-kinds", default="http,gradio_client",
                        help="which clients to run (benchmarks/load_clients.py): http (raw HTTP), gradio_client, "
                             "gradio_client_one_ssl_context")
    parser.add_argument("--queue-polls", default="",
                        help="Gradio queue poll intervals to compare, comma separated, the app's first (e.g. "
                             "0.01,0.001; default: only the app's --queue-poll-seconds)")
    parser.add_argument("--requests-per-client", type=int, default=8,
                        help="requests each visitor makes back to back (short bursts are mostly ramp-up)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--output", default=None, help="write the JSON result here")
    args = parser.parse_args(argv)

    import tempfile

    import tpu_demo  # noqa: F401 - offline defaults before gradio/hub imports
    from tpu_demo.engine.compile_cache import use_compile_cache

    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="tpu-demo-throughput-")
    use_compile_cache(cache_dir)
    import torch

    from benchmarks.measure import free_port
    from tpu_demo.core.buckets import Bucket
    from tpu_demo.core.modes import ExecutionMode
    from tpu_demo.device import execution_mode, synchronize
    from tpu_demo.launch.config import parse_config
    from benchmarks.floor_app import start_floor, stop_floor
    from benchmarks.load_clients import INPUTS
    from tpu_demo.launch.serve import build_app, generate_concurrency, launch
    from tpu_demo.web.gradio_internals import set_queue_polling

    port = free_port()
    flags = ["--port", str(port), "--cache-dir", cache_dir, "--model", args.model, "--models", args.model,
             "--buckets", args.resolution, "--mode", args.mode, "--compile-backend", args.compile_backend,
             "--no-warmup", "--max-batch", str(args.max_batch), "--max-per-ip", "0", "--max-queue", "64",
             "--threads", str(args.threads)]
    app = build_app(parse_config(flags, environ={}))
    launch(app, prevent_thread_lock=True, quiet=True)
    try:
        mode, bucket = ExecutionMode(args.mode), Bucket.parse(args.resolution)
        warmed = app.engine.warmup(args.model, mode, buckets=(bucket,))
        print(f"[throughput] warm: {[(s.batch, s.state.value, s.compile_seconds) for s in warmed]}", file=sys.stderr)
        spec, pipeline = app.engine.spec(args.model), app.engine.load(args.model)

        def bare_call(seed: int) -> Any:
            with execution_mode(mode, app.engine.device), torch.inference_mode():
                output = pipeline(prompt=PROMPT, height=bucket.height, width=bucket.width,
                                  num_inference_steps=args.steps, generator=torch.Generator("cpu").manual_seed(seed),
                                  **spec.pipeline_kwargs(spec.default_guidance))
                synchronize(app.engine.device)
            return output.images[0]

        fields = dict(prompt=PROMPT, model=args.model, mode=args.mode, resolution=args.resolution,
                      num_inference_steps=args.steps, guidance_scale=spec.default_guidance, num_images=1,
                      previews=False)
        floor_port = free_port()
        floor, work = start_floor(INPUTS, generate_concurrency(args.max_batch), app.config.queue_poll_seconds,
                                  floor_port)
        try:
            result = measure_load(f"http://127.0.0.1:{port}/", app.engine, fields, bare_call,
                                  tuple(int(n) for n in args.clients.split(",")), args.requests_per_client,
                                  args.rounds, args.max_batch, tuple(args.client_kinds.split(",")),
                                  polls=tuple(float(x) for x in args.queue_polls.split(",") if x),
                                  set_poll=lambda seconds: set_queue_polling(app.demo, seconds),
                                  floor_url=f"http://127.0.0.1:{floor_port}/")
        finally:
            stop_floor(floor, work)
    finally:
        app.demo.close()
        app.engine.close()
    result.update(model=args.model, resolution=args.resolution, steps=args.steps, mode=args.mode,
                  compile_backend=args.compile_backend, threads=args.threads, cpu_count=os.cpu_count())
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
