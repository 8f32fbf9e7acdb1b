"""Readiness (/ready) against liveness (/health) on the real app: 503 with the reason while the
start model loads and compiles its buckets, 200 once every configured bucket is warm, 503 again
when the server is shutting down; /health answers 200 throughout."""

import time

import httpx

from tpu_demo.core.events import BucketState, BucketStatus, ShapeKey
from tpu_demo.core.readiness import bucket_readiness
from tpu_demo.web.runs import StopReason

BUCKETS = ("64x64", "96x64", "128x128")


def _buckets(*states: BucketState) -> list[BucketStatus]:
    return [BucketStatus(**ShapeKey("tiny-flux", "compiled", resolution, 1)._asdict(), state=state)
            for resolution, state in zip(BUCKETS, states)]


def test_the_verdict_names_what_the_replica_is_waiting_for():
    cold, compiling, warm, failed = BucketState.COLD, BucketState.COMPILING, BucketState.WARM, BucketState.FAILED
    assert bucket_readiness(_buckets(cold, cold, cold), False, "tiny-flux", "compiled").reason == "loading tiny-flux"
    verdict = bucket_readiness(_buckets(warm, compiling, cold), True, "tiny-flux", "compiled")
    assert not verdict.ready and verdict.reason.startswith("compiling bucket 2 of 3 of tiny-flux (compiled)")
    verdict = bucket_readiness(_buckets(warm, failed, warm), True, "tiny-flux", "compiled")
    assert not verdict.ready and "failed" in verdict.reason and "96x64" in verdict.reason
    verdict = bucket_readiness(_buckets(warm, warm, warm), True, "tiny-flux", "compiled")
    assert verdict.ready and verdict.reason == "ready: 3 of 3 buckets of tiny-flux (compiled) warm"


def test_ready_only_once_every_configured_bucket_is_warm_while_health_stays_200(launch_app):
    app, url = launch_app("--model", "tiny-flux", "--mode", "compiled", "--buckets", ",".join(BUCKETS))
    observed = []  # (ready status, ready body, health status, warm configured buckets per /health)
    deadline = time.monotonic() + 300
    with httpx.Client(timeout=10) as http:
        while time.monotonic() < deadline:
            # /health first: warm buckets only grow, so a 503 after it means it saw a cold bucket
            health, ready = http.get(url + "health"), http.get(url + "ready")
            warm = sum(1 for b in health.json()["buckets"] if b["model"] == "tiny-flux" and b["mode"] == "compiled"
                       and b["resolution"] in BUCKETS and b["state"] == "warm")
            observed.append((ready.status_code, ready.json(), health.status_code, warm))
            assert ready.headers["cache-control"] == "no-store"
            if ready.status_code == 200:
                break
            time.sleep(0.05)
    assert observed[-1][0] == 200, observed[-5:]
    not_ready = [body["reason"] for status, body, _, _ in observed if status == 503]
    assert not_ready, "the replica was never seen not ready: warmup finished before the server answered"
    assert all(reason == "loading tiny-flux" or reason.startswith("compiling bucket ") for reason in not_ready)
    # 503 exactly while some configured bucket was not warm; liveness answered 200 all along
    assert all(warm < len(BUCKETS) for status, _, _, warm in observed if status == 503)
    assert observed[-1][1] == {"ready": True, "reason": "ready: 3 of 3 buckets of tiny-flux (compiled) warm"}
    assert [b["state"] for b in httpx.get(url + "health").json()["buckets"]
            if b["mode"] == "compiled" and b["resolution"] in BUCKETS] == ["warm"] * len(BUCKETS)
    assert all(health_status == 200 for _, _, health_status, _ in observed)
    print("not-ready reasons seen:", sorted(set(not_ready)))

    # the start model evicted by another model does not take readiness back, but the reason says what is
    # loaded now (never "tiny-flux warm" once it is gone); SIGTERM's drain takes readiness back
    app.engine.warmup("tiny-sd3", app.config.start_mode)
    assert "tiny-flux" not in app.engine.status().models
    after = httpx.get(url + "ready")
    assert after.status_code == 200
    assert after.json()["reason"] == ("ready: loaded now: tiny-sd3 (compiled: 4 of 4 buckets warm); the start model "
                                      "tiny-flux is not loaded (a request for it loads it again)")
    health = httpx.get(url + "health").json()
    assert health["ready_reason"] == after.json()["reason"] and set(health["models_loaded"]) == {"tiny-sd3"}
    assert not [b for b in health["buckets"] if b["model"] == "tiny-flux" and b["state"] == "warm"]
    app.ui.runs.stop_all(StopReason.SHUTDOWN)  # what the SIGTERM handler calls first
    drained = httpx.get(url + "ready")
    assert drained.status_code == 503 and drained.json()["reason"] == "shutting down"
    assert httpx.get(url + "health").json()["ready"] is False and httpx.get(url + "health").status_code == 200


def test_without_warmup_the_replica_is_ready_at_once(launch_app):
    _, url = launch_app("--no-warmup")
    response = httpx.get(url + "ready")
    assert response.status_code == 200 and "--no-warmup" in response.json()["reason"]
