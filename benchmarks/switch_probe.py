"""A model switch, timed, with and without ``--warm all`` (for the "switch" figure).

Run by ``benchmarks.run`` (``measure_switch``) as real subprocesses, each with an empty compile
cache of its own: ``--warm start`` warms only the start model, so the switch loads the other
model and compiles its bucket; ``--warm all`` warms both first (the other one into the compile
cache, then evicted), so the switch loads weights and reads the cache. Each prints one JSON line:
the switch's seconds to its first image, dynamo graphs captured during it, and inductor's cache
hits and misses during it (a miss is a graph compiled afresh; aot_eager and torch-tpu keep no
such counters, so there both read 0 and ``fresh_compiles`` is None).

    python -m benchmarks.switch_probe --warm all --model tiny-flux --other tiny-sd3 --bucket 64x64 -- <app flags>
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent


def probe(argv: Sequence[str]) -> dict[str, Any]:
    own, _, app_flags = _split(argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.switch_probe")
    parser.add_argument("--warm", choices=["start", "all"], required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--other", required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(own)

    import tpu_demo  # noqa: F401 - offline defaults
    from tpu_demo.engine.compile_cache import use_compile_cache
    from tpu_demo.launch.config import parse_config

    config = parse_config(app_flags, environ={})
    use_compile_cache(config.resolved_cache_dir)  # before torch, as app.py does

    from tpu_demo.core.buckets import Bucket
    from tpu_demo.core.events import ImageResult
    from tpu_demo.core.modes import ExecutionMode
    from tpu_demo.core.request import RequestLimits, validate_request
    from tpu_demo.device import detect_device
    from tpu_demo.engine.compile_cache import cache_counters
    from tpu_demo.engine.engine import Engine, EngineConfig
    from tpu_demo.engine.warm_all import WarmAll

    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    bucket = Bucket.parse(args.bucket)
    models = (args.model, args.other)
    engine = Engine(EngineConfig(models_dir=config.resolved_cache_dir / "models", cpu_compile_backend=config.compile_backend,
                                 offered_models=models, bucket_overrides={m: (bucket,) for m in models},
                                 max_batch=config.max_batch),
                    detect_device(config.device))
    mode = ExecutionMode.COMPILED
    started = time.perf_counter()
    if args.warm == "all":
        warm_all = WarmAll(engine, models, args.model, mode)
        warm_all.run()
        assert not warm_all.failures(), warm_all.failures()
    else:
        engine.warmup(args.model, mode)
    warmup_seconds = time.perf_counter() - started
    spec = engine.spec(args.other)
    request = validate_request(dict(prompt="a red circle on a white background", model=spec.id, mode=mode.value,
                                    resolution=str(bucket), num_inference_steps=args.steps,
                                    guidance_scale=spec.default_guidance, seed=0, num_images=1, previews=False),
                               RequestLimits(offered_models=models, offered_modes=tuple(ExecutionMode)))
    graphs_before, cache_before = engine.counter.count, cache_counters()
    started = time.perf_counter()
    images = [event for event in engine.generate(request) if isinstance(event, ImageResult)]
    seconds = time.perf_counter() - started
    cache_after = cache_counters()
    misses = sum(cache_after[k] - cache_before[k] for k in cache_after if k.endswith("_miss"))
    hits = sum(cache_after[k] - cache_before[k] for k in cache_after if k.endswith("_hit"))
    backend = engine.counter.backend
    report = {
        "warm": args.warm, "from": args.model, "to": args.other, "bucket": str(bucket), "backend": backend,
        "warmup_seconds": round(warmup_seconds, 2), "switch_seconds": round(seconds, 3), "images": len(images),
        "graphs_captured": engine.counter.count - graphs_before, "cache_hits": hits, "cache_misses": misses,
        # inductor keeps hit/miss counters; a backend that keeps none cannot say what was compiled afresh
        "fresh_compiles": misses if backend == "inductor" else None,
        "loaded_after": sorted(engine.status().models),
    }
    engine.close()
    return report


def _split(argv: Sequence[str]) -> tuple[list[str], str, list[str]]:
    argv = list(argv)
    if "--" not in argv:
        return argv, "", []
    index = argv.index("--")
    return argv[:index], "--", argv[index + 1:]


def measure_switch(work_dir: Path, model: str, other: str, bucket: str, backend: str, threads: int | None,
                   timeout: float, max_batch: int = 0) -> dict[str, Any]:
    """The switch from ``model`` to ``other`` in two fresh processes: never warmed, then pre-warmed
    (``max_batch``: ``--max-batch``; 0, each model's own)."""
    from tpu_demo.engine.compile_cache import compile_cache_env

    # the caller's own cache variables would win over the probe's (a variable already set is left alone)
    env = {name: value for name, value in os.environ.items() if name not in compile_cache_env(work_dir)}
    runs = {}
    for warm in ("start", "all"):
        flags = ["--cache-dir", str(work_dir / f"switch-{warm}"), "--compile-backend", backend]
        if threads:
            flags += ["--threads", str(threads)]
        if max_batch:
            flags += ["--max-batch", str(max_batch)]
        command = [sys.executable, "-m", "benchmarks.switch_probe", "--warm", warm, "--model", model, "--other", other,
                   "--bucket", bucket, "--", *flags]
        out = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        line = next((l for l in out.stdout.splitlines() if l.startswith("SWITCH_PROBE ")), None)
        if out.returncode != 0 or line is None:
            raise RuntimeError(f"switch probe (--warm {warm}) failed with {out.returncode}: {out.stderr[-2000:]}")
        runs["never_warmed" if warm == "start" else "pre_warmed"] = json.loads(line.removeprefix("SWITCH_PROBE "))
    ratio = runs["pre_warmed"]["switch_seconds"] / runs["never_warmed"]["switch_seconds"]
    return {"ratio": round(ratio, 3), **runs}


if __name__ == "__main__":
    print("SWITCH_PROBE " + json.dumps(probe(sys.argv[1:])), flush=True)
