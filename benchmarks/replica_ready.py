"""What a new replica costs before a balancer may send it visitors, measured from outside.

Spawns real `python app.py` processes and polls them over HTTP: seconds from spawn until
``GET /health`` answers (the server is up: imports, start-up) and until ``GET /ready`` answers 200
(the start model loaded and every configured bucket compiled). Cold (an empty compile cache) and
with the persistent compile cache a previous process left, in interleaved pairs (cold, cached,
cached, cold, ...), reported as the median ratio. Tiny models are built once beforehand and copied
in, so "load" here is reading weights, as it is from a mounted volume.

    python -m benchmarks.replica_ready --pairs 2 --buckets 64x64,128x128 --compile-backend inductor
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.measure import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent


def start_to_ready(cache_dir: Path, flags: list[str], timeout: float) -> dict[str, Any]:
    """Spawn one replica; seconds until /health answers and until /ready answers 200."""
    port = free_port()
    # the app points the compile caches into --cache-dir only where the environment does not already
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("TORCHINDUCTOR_", "TORCH_TPU_TIER3"))} | {"PYTHONUNBUFFERED": "1"}
    spawned = time.monotonic()
    process = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--cache-dir", str(cache_dir), *flags],
                               cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    alive = ready = None
    reasons: list[str] = []
    try:
        with httpx.Client(timeout=5) as http:
            while ready is None:
                if time.monotonic() - spawned > timeout or process.poll() is not None:
                    raise RuntimeError(f"replica not ready after {time.monotonic() - spawned:.0f} s: {reasons[-1:]}")
                try:
                    if alive is None and http.get(url + "/health").status_code == 200:
                        alive = time.monotonic() - spawned
                    response = http.get(url + "/ready")
                    if response.status_code == 200:
                        ready = time.monotonic() - spawned
                    elif not reasons or reasons[-1] != response.json()["reason"]:
                        reasons.append(response.json()["reason"])
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(timeout=60)
    return {"alive_s": round(alive, 2), "ready_s": round(ready, 2), "not_ready_reasons": reasons}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--model", default="tiny-flux")
    parser.add_argument("--buckets", default="64x64,128x128")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args(argv)
    flags = ["--model", args.model, "--models", args.model, "--buckets", args.buckets, "--mode", "compiled",
             "--compile-backend", args.compile_backend, "--threads", str(args.threads)]
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    work = Path(tempfile.mkdtemp(prefix="replica-ready-"))
    try:
        from tpu_demo.core.catalog import get_spec
        from tpu_demo.models.loading import resolve_source

        resolve_source(get_spec(args.model), work / "models")  # weights exist before the replica starts
        runs: dict[str, list[dict[str, Any]]] = {"cold": [], "cached": []}
        warm_dir = None
        for pair in range(args.pairs):
            order = ("cold", "cached") if pair % 2 == 0 else ("cached", "cold")
            for label in order:
                if label == "cold" or warm_dir is None:
                    cache_dir = work / f"cache-{pair}-{label}"
                    shutil.copytree(work / "models", cache_dir / "models")
                    if label == "cached":  # first a process that fills the compile cache
                        start_to_ready(cache_dir, flags, args.timeout)
                else:
                    cache_dir = warm_dir
                run = start_to_ready(cache_dir, flags, args.timeout)
                runs[label].append(run)
                if label == "cold":
                    warm_dir = cache_dir  # the next cached run reads what this one compiled
                print(label, json.dumps(run), flush=True)
        ratios = [c["ready_s"] / k["ready_s"] for c, k in zip(runs["cached"], runs["cold"])]
        summary = {"model": args.model, "buckets": args.buckets, "backend": args.compile_backend,
                   "pairs": args.pairs, "ready_ratio_cached_over_cold": round(statistics.median(ratios), 3),
                   "cold_ready_s": statistics.median(r["ready_s"] for r in runs["cold"]),
                   "cached_ready_s": statistics.median(r["ready_s"] for r in runs["cached"]),
                   "alive_s": statistics.median(r["alive_s"] for r in runs["cold"] + runs["cached"]),
                   "load_average": os.getloadavg()}
        print("SUMMARY " + json.dumps(summary), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
