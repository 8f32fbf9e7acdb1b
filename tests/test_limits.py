"""Limits on the real app: concurrent clients, the bounded queue, per-client shares, the time limit."""

import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import httpx
import numpy as np
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from gradio_client.utils import QueueError

from tpu_demo.core.events import BucketState, ShapeKey
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.web.gradio_internals import set_queue_polling

from conftest import request_fields
from support import (GOOD, generate_fn_index, good_request_works, pixels, reference,
                     slow_steps, stopped_early, wait_until)

REPO = Path(__file__).resolve().parents[1]


# ---- 2. load: concurrent clients, bounded queue ---------------------------------------------
def test_sixteen_clients_three_requests_each_complete_or_are_told_busy(launch_app):
    app, url = launch_app("--no-warmup", "--max-queue", "8", "--max-per-ip", "0")
    seeds = {client: 500 + client for client in range(16)}
    references = {seed: reference(app, seed=seed) for seed in seeds.values()}

    def session(client_index: int) -> list:
        client = Client(url, verbose=False)
        outcomes = []
        for _ in range(3):
            try:
                (item,), _ = client.predict(**request_fields(seed=seeds[client_index], **GOOD), api_name="/generate")
                outcomes.append(("ok", pixels(item)))
            except QueueError as busy:
                outcomes.append(("busy", str(busy)))
        return outcomes

    started = time.monotonic()
    pool = ThreadPoolExecutor(max_workers=16)
    futures = {pool.submit(session, index): index for index in seeds}
    done, not_done = wait(futures, timeout=150)
    pool.shutdown(wait=False, cancel_futures=True)
    assert not not_done, f"{len(not_done)} clients hung"
    completed = busy = 0
    for future, index in futures.items():
        outcomes = future.result()
        assert len(outcomes) == 3
        for kind, value in outcomes:
            if kind == "ok":
                completed += 1
                assert np.array_equal(value, references[seeds[index]]), f"client {index} got another client's image"
            else:
                busy += 1
                assert value == "Queue is full! Please try again."
    print(f"load: {completed} completed, {busy} busy, {time.monotonic() - started:.1f}s")
    assert completed + busy == 48 and completed >= 9  # the first wave alone fills the device and the queue
    assert wait_until(lambda: not app.engine.status().busy, 10)
    health = httpx.get(url + "health").json()
    assert health["queue_length"] == 0 and health["running"] == 0


def test_full_queue_answers_busy_at_once(launch_app):
    app, url = launch_app("--no-warmup", "--max-queue", "1", "--max-per-session", "0", "--max-per-ip", "0")
    steps, slow = slow_steps(app)
    with slow:
        client = Client(url, verbose=False)
        running = client.submit(**request_fields(num_inference_steps=50, num_images=4, **GOOD), api_name="/generate")
        assert wait_until(lambda: len(steps) >= 1)
        waiting = client.submit(**request_fields(seed=8, **GOOD), api_name="/generate")
        assert wait_until(lambda: httpx.get(url + "health").json()["queue_length"] == 1, 10)
        started = time.monotonic()
        with pytest.raises(QueueError, match="Queue is full! Please try again."):
            client.predict(**request_fields(seed=9, **GOOD), api_name="/generate")
        assert time.monotonic() - started < 5  # answered, not parked
        raw = httpx.post(url + "gradio_api/call/generate", json={"data": list(request_fields(**GOOD).values())})
        assert raw.status_code == 503
        assert raw.json()["detail"] == "busy: the queue is full (1 requests waiting); try again in a minute"
        # the full queue refuses generations only: Stop still reaches the running request
        client.predict(api_name="/stop")
        stopped_early(running, 4)
        assert len(waiting.result()[0]) == 1


# ---- 2b. per-client limits -----------------------------------------------------------------
def test_one_request_per_session_and_a_few_per_address(launch_app):
    app, url = launch_app("--no-warmup", "--max-per-session", "1", "--max-per-ip", "2")
    steps, slow = slow_steps(app)
    with slow:
        first = Client(url, verbose=False, headers={"X-Forwarded-For": "203.0.113.7"})
        running = first.submit(**request_fields(num_inference_steps=50, num_images=4, **GOOD), api_name="/generate")
        assert wait_until(lambda: len(steps) >= 1)
        # the same session again: busy, with the reason in the HTTP answer
        with pytest.raises(QueueError):
            first.predict(**request_fields(**GOOD), api_name="/generate")
        # (a session is its hash with the owner cookie the server issued: web/callers.py)
        raw = httpx.post(url + "gradio_api/queue/join", headers={"X-Forwarded-For": "203.0.113.7"}, cookies=first.cookies,
                         json={"data": list(request_fields(**GOOD).values()), "fn_index": generate_fn_index(url),
                               "session_hash": first.session_hash})
        assert raw.status_code == 503
        assert raw.json()["detail"].startswith("busy: this session already has 1 request(s) waiting or running")
        # another session from the same address: one more is admitted (it waits), the next is busy
        second = Client(url, verbose=False, headers={"X-Forwarded-For": "203.0.113.7"})
        waiting = second.submit(**request_fields(seed=3, **GOOD), api_name="/generate")
        assert wait_until(lambda: httpx.get(url + "health").json()["queue_length"] == 1, 10)
        third = Client(url, verbose=False, headers={"X-Forwarded-For": "203.0.113.7"})
        with pytest.raises(QueueError):
            third.predict(**request_fields(**GOOD), api_name="/generate")
        # another address is served as usual
        other = Client(url, verbose=False, headers={"X-Forwarded-For": "198.51.100.1"})
        elsewhere = other.submit(**request_fields(seed=4, **GOOD), api_name="/generate")
        # a waiting request that is cancelled gives its place back
        waiting.cancel()
        assert wait_until(lambda: httpx.get(url + "health").json()["queue_length"] == 1, 10)
        late = third.submit(**request_fields(seed=5, **GOOD), api_name="/generate")
        first.predict(api_name="/stop")  # ends the long request early (its finished images are kept)
        stopped_early(running, 4)
        assert len(elsewhere.result()[0]) == 1 and len(late.result()[0]) == 1
    # everything ended: the first session is admitted again (nothing leaked)
    good_request_works(first, app, seed=12)


# ---- 2c. time limit ---------------------------------------------------------------------------
def test_a_request_over_the_time_limit_is_stopped_and_reported(launch_app, request_log):
    app, url = launch_app("--no-warmup", "--request-timeout", "1")
    steps, slow = slow_steps(app)
    client = Client(url, verbose=False)
    with slow:
        started = time.monotonic()
        with pytest.raises(AppError, match=r"Time limit: this request generated for longer than 1 s"):
            client.predict(**request_fields(num_inference_steps=50, num_images=2, **GOOD), api_name="/generate")
        assert time.monotonic() - started < 10 and len(steps) < 50
    (line,) = [line for line in request_log() if line["outcome"] == "timeout"]
    assert line["images_done"] == 0 and line["steps"] == 50
    good_request_works(client, app)


def test_loading_and_compiling_do_not_count_against_the_time_limit(launch_app):
    app, url = launch_app("--no-warmup", "--request-timeout", "0.5")
    client = Client(url, verbose=False)
    started = time.monotonic()
    (item,), _ = client.predict(**request_fields(mode="compiled", **GOOD), api_name="/generate")
    status = app.engine.bucket_status(ShapeKey("tiny-flux", ExecutionMode.COMPILED.value, "64x64"))
    print(f"cold compiled request: {time.monotonic() - started:.2f}s, compile {status.compile_seconds}s")
    assert status.state is BucketState.WARM and status.compile_seconds > 0.5  # longer than the limit
    assert "compiled first" in item["caption"]


def test_gradio_queue_analytics_are_not_rebuilt_per_request(launch_app):
    """Gradio rebuilds a pandas summary of up to 10 000 past events after every event by default
    (web/gradio_internals.limit_queue_analytics); here it is rebuilt once per 1000 events."""
    app, url = launch_app("--no-warmup")
    client = Client(url, verbose=False)
    for seed in range(3):
        client.predict(**request_fields(seed=seed, **GOOD), api_name="/generate")
    queue = app.demo._queue
    assert queue.events_recorded >= 3 and queue.event_count_at_last_cache == 0
    assert queue.ANAYLTICS_CACHE_FREQUENCY == 1000 and queue.ANALYTICS_MAX_EVENTS == 1000


def event_loop_cpu_seconds(app, seconds: float) -> float:
    """CPU the server's event-loop thread spends in ``seconds`` of wall time."""
    clock = time.pthread_getcpuclockid(app.demo.server.thread.ident)
    started = time.clock_gettime(clock)
    time.sleep(seconds)
    return time.clock_gettime(clock) - started


def test_gradio_queue_polls_at_the_configured_interval(launch_app):
    """Gradio's queue looks for work every 1 ms by default, a thousand event-loop wake-ups a second
    on the cores that denoise (web/gradio_internals.set_queue_polling); the app polls every
    --queue-poll-seconds, and its idle event loop costs less CPU than at Gradio's default."""
    app, url = launch_app("--no-warmup", "--queue-poll-seconds", "0.05")
    queue = app.demo._queue
    assert queue.sleep_when_free == 0.05 and queue.progress_update_sleep_when_free == 0.05
    good_request_works(Client(url, verbose=False), app)
    time.sleep(0.5)  # let the request's stream close
    calm = event_loop_cpu_seconds(app, 2.0)
    set_queue_polling(app.demo, 0.001)
    busy = event_loop_cpu_seconds(app, 2.0)
    print(f"idle event loop CPU over 2 s: {calm * 1000:.0f} ms polling every 50 ms, {busy * 1000:.0f} ms every 1 ms")
    assert calm < busy / 1.5
