"""``GET /health`` (liveness) and ``GET /ready`` (readiness), as JSON, without paths or secrets.

``/health`` answers 200 while the server serves (device, loaded models, bucket states without error
text, requests waiting, busy, the readiness verdict); ``/ready`` answers 200 only once core/readiness.py
says so, else 503 with the reason. Neither runs anything on the device.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi.routing import APIRoute
from fastapi.responses import JSONResponse

from tpu_demo.core.engine_api import EngineAPI
from tpu_demo.core.events import BucketState
from tpu_demo.core.readiness import Readiness


HEALTH_PATH = "/health"
READY_PATH = "/ready"


def health_payload(engine: EngineAPI, queue_length: int, running: int, readiness: Readiness,
                   warmed: dict[str, Any] | None = None) -> dict[str, Any]:
    """The /health body. ``models_loaded`` and ``buckets`` are what is loaded now; ``warmed`` (``--warm all``)
    what start-up warmed into the compile cache, per model and mode, loaded now or not."""
    status = engine.status()
    buckets = [{"model": b.model, "mode": b.mode, "resolution": b.resolution, "batch": b.batch, "state": b.state.value,
                "compile_seconds": b.compile_seconds, "graphs": b.compiles,
                # True: every compiler cache lookup of its compile hit (nothing compiled afresh); None: no counters
                "from_cache": b.from_cache} for b in status.buckets]
    return {
        "status": "ok",
        "ready": readiness.ready,
        "ready_reason": readiness.reason,
        "device": {"name": status.device, "kind": status.device_kind, "count": status.device_count},
        "models_offered": list(engine.specs),
        "models_loaded": {model_id: {"placement": info["placement"], "compiled": info["compiled"]}
                          for model_id, info in status.models.items()},
        "buckets": buckets,
        "warm_buckets": sum(1 for b in status.buckets if b.state is BucketState.WARM),
        "failed_buckets": sum(1 for b in status.buckets if b.state is BucketState.FAILED),
        "compiles_total": status.compiles_total,
        "queue_length": queue_length,
        "running": running,
        "busy": status.busy,
        "loading": status.loading,
        "warmed": warmed,
    }


def health_routes(engine: EngineAPI, queue_length: Callable[[], int], running: Callable[[], int],
                  readiness: Callable[[], Readiness],
                  warmed: Callable[[], dict[str, Any] | None] = lambda: None) -> list[APIRoute]:
    """Both routes, for ``launch(app_kwargs={"routes": [...]})`` (routes Gradio's app serves as its own)."""
    no_store = {"Cache-Control": "no-store"}

    async def health() -> JSONResponse:
        return JSONResponse(health_payload(engine, queue_length(), running(), readiness(), warmed()),
                            headers=no_store)

    async def ready() -> JSONResponse:
        verdict = readiness()
        return JSONResponse({"ready": verdict.ready, "reason": verdict.reason},
                            status_code=200 if verdict.ready else 503, headers=no_store)

    return [APIRoute(HEALTH_PATH, health, methods=["GET"], include_in_schema=False),
            APIRoute(READY_PATH, ready, methods=["GET"], include_in_schema=False)]
