"""One app process from start-up until all buckets of its start model are warm (for the restart figure).

Run by ``benchmarks.run`` as a real subprocess, once with an empty compile cache and once
with the cache the first run left. It starts the app the way app.py does (compile cache set
before torch is imported, then ``build_app`` with its background warmup, then the HTTP
server), waits until every start-model bucket is warm or failed, and prints one JSON line:
the wall-clock time at which that happened (the parent subtracts its spawn time) and each
bucket's compile seconds and cache source.

    python -m benchmarks.startup_probe --timeout 900 -- <app flags>
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    timeout = float(argv[argv.index("--timeout") + 1]) if "--timeout" in argv else 900.0
    app_flags = argv[argv.index("--") + 1:] if "--" in argv else []

    import tpu_demo  # noqa: F401 - offline defaults
    from tpu_demo.engine.compile_cache import use_compile_cache
    from tpu_demo.launch.config import parse_config

    config = parse_config(app_flags)
    use_compile_cache(config.resolved_cache_dir)  # before torch, as app.py does

    from tpu_demo.core.events import BucketState
    from tpu_demo.launch.serve import build_app, launch

    app = build_app(config)
    launch(app, prevent_thread_lock=True)
    model = app.ui.settings.start_model
    expected = len(app.engine.spec(model).buckets)
    deadline = time.monotonic() + timeout
    done_states = (BucketState.WARM, BucketState.FAILED)
    while True:
        buckets = [b for b in app.engine.status().buckets if b.model == model and b.mode == config.mode]
        if len(buckets) >= expected and all(b.state in done_states for b in buckets):
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    all_warm_at = time.time()
    report = {
        "all_warm_at": all_warm_at,
        "all_warm": len(buckets) >= expected and all(b.state is BucketState.WARM for b in buckets),
        "buckets": [{"resolution": b.resolution, "state": b.state.value, "compile_seconds": b.compile_seconds,
                     "compiles": b.compiles, "from_cache": b.from_cache, "error": b.error} for b in buckets],
        "compiles_total": app.engine.counter.count,
    }
    print("STARTUP_PROBE " + json.dumps(report), flush=True)
    app.demo.close()
    app.engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
