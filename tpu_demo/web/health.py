"""``GET /health``: what a load balancer or an operator needs, as JSON, without paths or secrets.

Reports the device, the loaded models, each bucket's state (warm / compiling / cold / failed, no
error text: errors can quote file paths), how many requests wait in the queue and whether the
device is busy. HTTP 200 while the server serves; it does not run anything on the device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from fastapi.routing import APIRoute
from fastapi.responses import JSONResponse

from tpu_demo.core.events import BucketState

if TYPE_CHECKING:
    from tpu_demo.engine.engine import Engine

HEALTH_PATH = "/health"


def health_payload(engine: "Engine", queue_length: int, running: int) -> dict[str, Any]:
    status = engine.status()
    buckets = [{"model": b.model, "mode": b.mode, "resolution": b.resolution, "batch": b.batch, "state": b.state.value,
                "compile_seconds": b.compile_seconds} for b in status.buckets]
    return {
        "status": "ok",
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
    }


def health_route(engine: "Engine", queue_length: Callable[[], int], running: Callable[[], int]) -> APIRoute:
    """The route, for ``launch(app_kwargs={"routes": [...]})`` (routes Gradio's app serves as its own)."""

    async def health() -> JSONResponse:
        return JSONResponse(health_payload(engine, queue_length(), running()),
                            headers={"Cache-Control": "no-store"})

    return APIRoute(HEALTH_PATH, health, methods=["GET"], include_in_schema=False)
