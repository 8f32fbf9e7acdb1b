"""Batching of one shape and overlap under load, on real tiny pipelines and a real app.

Engine tests: an image is the same batched or alone (several seeds, two models); a Stop of one
request in a shared call leaves the others' images intact and ends its own stream at once;
batch sizes warm like buckets, and nothing compiles after warmup with batching on; round robin.
App test: 16 gradio_client clients x 3 requests against the real server with batching on: the
per-session and per-address limits, the queue bound and the request log all hold.
"""

import threading
import time

import numpy as np
import pytest

from conftest import request_fields

from tpu_demo.core.events import BucketState, ImageResult, StepProgress, Stopped
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.request import validate_request


def _pixels(result: ImageResult) -> np.ndarray:
    return np.asarray(result.image.convert("RGB"), dtype=np.int16)


def _run_together(engine, requests, stops=None, on_event=None):
    """Start every request's ``Engine.generate`` at once (threads); returns each one's events."""
    events = [[] for _ in requests]
    stops = stops or [threading.Event() for _ in requests]
    errors = []

    def consume(i):
        try:
            for event in engine.generate(requests[i], stops[i]):
                events[i].append(event)
                if on_event is not None:
                    on_event(i, event)
        except Exception as error:  # noqa: BLE001 - asserted below
            errors.append(error)

    # hold the device while all requests queue up, so they meet in the image queue (first let the
    # device thread drain jobs left from earlier requests: they would take images before the gate)
    engine.submit(lambda: None).result()
    gate = threading.Event()
    engine.submit(gate.wait)
    threads = [threading.Thread(target=consume, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while engine.requests_waiting() < len(requests) and time.monotonic() < deadline:
        time.sleep(0.01)
    gate.set()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return events


@pytest.mark.parametrize("model, guidance, placement", [("tiny-flux", 0.0, None), ("tiny-sd3", 4.5, None),
                                                        ("tiny-sd3", 4.5, "resident")])
def test_same_pixels_batched_and_alone(make_engine, model, guidance, placement):
    """Four seeds alone (batch 1) and as one call of 4 from two requests: the same images within 1/255.
    Resident placement: each image's cached prompt embeddings are stacked into the batch."""
    from tpu_demo.core.catalog import Placement

    engine = make_engine(max_batch=4, placement_override=Placement(placement) if placement else None)
    engine.warmup(model, ExecutionMode.EAGER, buckets=None)
    if placement:
        assert engine.status().models[model]["placement"] == placement
    shapes = {s.batch: s.state for s in engine.buckets_for(model, ExecutionMode.EAGER) if s.resolution == "64x64"}
    cfg = 2 if model == "tiny-sd3" else 1  # SD3's classifier-free guidance doubles the transformer batch
    assert shapes == {cfg * n: BucketState.WARM for n in (1, 2, 4)}
    fields = dict(model=model, guidance_scale=guidance, resolution="64x64")
    alone = {}
    for seed in (11, 12, 40, 41):
        engine.set_max_batch(1)
        [result] = [e for e in engine.generate(validate_request(request_fields(seed=seed, **fields)))
                    if isinstance(e, ImageResult)]
        assert result.timings["batch"] == 1
        alone[seed] = _pixels(result)
    engine.set_max_batch(4)
    requests = [validate_request(request_fields(seed=11, num_images=2, **fields)),
                validate_request(request_fields(seed=40, num_images=2, prompt="a blue square", **fields))]
    # the second request has its own prompt: compare it with that prompt alone
    engine.set_max_batch(1)
    for seed in (40, 41):
        [result] = [e for e in engine.generate(validate_request(request_fields(seed=seed, prompt="a blue square",
                                                                               **fields)))
                    if isinstance(e, ImageResult)]
        alone[seed] = _pixels(result)
    engine.set_max_batch(4)
    events = _run_together(engine, requests)
    batched = {e.seed: e for stream in events for e in stream if isinstance(e, ImageResult)}
    assert sorted(batched) == [11, 12, 40, 41]
    assert {e.timings["batch"] for e in batched.values()} == {4}, "the two requests did not share one call"
    for seed, result in batched.items():
        difference = np.abs(_pixels(result) - alone[seed]).max()
        assert difference <= 1, f"seed {seed}: batched differs from alone by {difference}/255"
    assert len({alone[s].tobytes() for s in alone}) == 4  # the seeds really make different images


def test_stop_of_one_request_in_a_shared_call(make_engine):
    """Three requests share one call of 4; one is stopped mid-denoise: its stream ends at once with
    Stopped, the others get every image, identical to an undisturbed run."""
    engine = make_engine(max_batch=4)
    engine.warmup("tiny-flux", ExecutionMode.EAGER)
    fields = dict(num_inference_steps=12, resolution="64x64")
    requests = [validate_request(request_fields(seed=100, num_images=2, **fields)),
                validate_request(request_fields(seed=200, **fields)),
                validate_request(request_fields(seed=300, **fields))]
    undisturbed = _run_together(engine, requests)
    stops = [threading.Event() for _ in requests]
    stopped_at = {}

    def on_event(i, event):
        if i == 1 and isinstance(event, StepProgress) and event.step == 3:
            stops[1].set()
            stopped_at["time"] = time.monotonic()
        if i == 1 and isinstance(event, Stopped):
            stopped_at["ended"] = time.monotonic()

    events = _run_together(engine, requests, stops, on_event)
    assert isinstance(events[1][-1], Stopped) and events[1][-1].completed == 0
    assert not any(isinstance(e, ImageResult) for e in events[1])
    # its stream ended at the next step, not when the shared call finished
    others_done = [e for i in (0, 2) for e in events[i] if isinstance(e, ImageResult)]
    assert len(others_done) == 3
    steps_after_stop = [e for e in events[0] if isinstance(e, StepProgress) and e.index == 0 and e.step > 4]
    assert steps_after_stop, "the others went on denoising"
    assert stopped_at["ended"] - stopped_at["time"] < 5
    for i in (0, 2):
        before = {e.seed: _pixels(e) for e in undisturbed[i] if isinstance(e, ImageResult)}
        after = {e.seed: _pixels(e) for e in events[i] if isinstance(e, ImageResult)}
        assert before.keys() == after.keys()
        for seed in before:
            assert np.abs(before[seed] - after[seed]).max() <= 1
        assert {e.timings["batch"] for e in events[i] if isinstance(e, ImageResult)} == {4}


def test_every_request_stopped_skips_the_decode(make_engine):
    """When every image of a call is stopped the pipeline is interrupted and the VAE never decodes."""
    engine = make_engine(max_batch=2)
    engine.warmup("tiny-flux", ExecutionMode.EAGER)
    decodes, forwards = [], []
    pipeline = engine.load("tiny-flux")
    requests = [validate_request(request_fields(seed=s, num_inference_steps=12)) for s in (1, 2)]
    stops = [threading.Event(), threading.Event()]

    def stop_both_at_the_second_step(module, args):
        # set on the device thread itself, so the stop is seen at this step's end, not whenever a
        # consumer thread gets scheduled (on a busy machine the call could finish first)
        forwards.append(1)
        if len(forwards) == 2:
            for stop in stops:
                stop.set()

    hooks = [pipeline.vae.decoder.register_forward_pre_hook(lambda module, args: decodes.append(1)),
             pipeline.transformer.register_forward_pre_hook(stop_both_at_the_second_step)]
    try:
        events = _run_together(engine, requests, stops)
    finally:
        for hook in hooks:
            hook.remove()
    assert all(isinstance(stream[-1], Stopped) for stream in events)
    assert len(forwards) == 2  # interrupted at the second of 12 steps
    assert decodes == []


def test_zero_compiles_after_warmup_with_batching(make_engine):
    """Compiled mode, batching on: warmup compiles each (bucket, batch size) once; then mixed
    requests of 1-4 images from several clients, at every bucket, compile nothing."""
    from tpu_demo.core.buckets import Bucket

    engine = make_engine(max_batch=4)
    buckets = ["64x64", "128x128"]
    statuses = engine.warmup("tiny-flux", ExecutionMode.COMPILED, buckets=tuple(map(Bucket.parse, buckets)))
    assert len(statuses) == 6 and all(s.state is BucketState.WARM for s in statuses)
    assert {s.batch for s in statuses} == {1, 2, 4}
    after_warmup = engine.counter.count
    assert after_warmup >= 6  # a graph per (bucket, batch size)
    requests = [validate_request(request_fields(mode="compiled", seed=10 * i, num_images=1 + i % 4,
                                                resolution=buckets[i % len(buckets)]))
                for i in range(8)]
    events = _run_together(engine, requests)
    results = [e for stream in events for e in stream if isinstance(e, ImageResult)]
    assert len(results) == sum(r.num_images for r in requests)
    assert max(e.timings["batch"] for e in results) > 1, "nothing was batched"
    assert all(e.warm for e in results)
    assert engine.counter.count == after_warmup


def test_batching_is_on_by_default_at_each_models_catalog_size(make_engine):
    """No flag: ``--max-batch auto``, each model's catalog ``max_batch`` (tiny models 4, FLUX.1-schnell 2,
    FLUX.2-dev 1); warmup warms each of its sizes, and four images of one request share one call."""
    from tpu_demo.core.buckets import Bucket
    from tpu_demo.engine.engine import EngineConfig
    from tpu_demo.launch.config import parse_config

    assert parse_config([], environ={}).max_batch == EngineConfig.max_batch == 0  # auto
    engine = make_engine(max_batch=EngineConfig.max_batch)
    assert [engine.batch_sizes_for(m) for m in ("tiny-flux", "sd3.5-medium", "flux.1-schnell", "flux.2-dev")] == [
        (1, 2, 4), (1, 2, 4), (1, 2), (1,)]
    statuses = engine.warmup("tiny-flux", ExecutionMode.COMPILED, buckets=(Bucket.parse("64x64"),))
    assert [(s.batch, s.state) for s in statuses] == [(n, BucketState.WARM) for n in (1, 2, 4)]
    after_warmup = engine.counter.count
    request = validate_request(request_fields(mode="compiled", resolution="64x64", num_images=4))
    results = [e for e in engine.generate(request) if isinstance(e, ImageResult)]
    assert [e.timings["batch"] for e in results] == [4] * 4 and engine.counter.count == after_warmup


def test_round_robin_between_requests(make_engine):
    """Batch 1: a request of 4 images and one of 1 queued behind it: the single image comes
    second, not fifth."""
    engine = make_engine(max_batch=1)
    order = []
    requests = [validate_request(request_fields(seed=1, num_images=4)), validate_request(request_fields(seed=50))]
    _run_together(engine, requests, on_event=lambda i, e: order.append(i) if isinstance(e, ImageResult) else None)
    assert order.index(1) <= 1, order


def test_sixteen_clients_three_requests_limits_and_log_hold_with_batching(launch_app, request_log):
    """16 gradio_client clients x 3 requests (four addresses, four clients each) against the real
    server with --max-batch 4: every request is served with its own pixels or told busy; at no
    moment does a session hold 2, an address more than its share, or the queue more than its
    bound (requests waiting in Gradio's queue or for the device); one log line per request; and
    calls were really shared."""
    import httpx
    from gradio_client import Client
    from gradio_client.utils import QueueError

    from support import GOOD, pixels, wait_until

    max_queue, per_ip = 6, 3
    app, url = launch_app("--model", "tiny-flux", "--models", "tiny-flux", "--buckets", "64x64", "--mode", "eager",
                          "--max-batch", "4", "--max-queue", str(max_queue), "--max-per-ip", str(per_ip))
    assert wait_until(lambda: httpx.get(url + "ready").status_code == 200, 120)
    seeds = {client: 700 + client for client in range(16)}
    references = {}
    for seed in seeds.values():
        (result,) = [e for e in app.engine.generate(validate_request(request_fields(seed=seed, **GOOD)))
                     if isinstance(e, ImageResult)]
        references[seed] = np.asarray(result.image.convert("RGB"), dtype=np.int16)
    calls_before = sum(app.engine.calls_by_batch.values())
    violations, peak = [], {"waiting": 0, "running": 0}
    watching = threading.Event()

    def watch():
        while not watching.is_set():
            events = list(app.ui.runs)  # the registry of admitted runs the limits count
            waiting = sum(not e.running for e in events)
            peak["waiting"] = max(peak["waiting"], waiting)
            peak["running"] = max(peak["running"], app.ui.runs.active())
            sessions, hosts = {}, {}
            for e in events:
                sessions[e.session] = sessions.get(e.session, 0) + 1
                hosts[e.client_host] = hosts.get(e.client_host, 0) + 1
            if waiting > max_queue or max(sessions.values(), default=0) > 1 or max(hosts.values(), default=0) > per_ip:
                violations.append((waiting, sessions, hosts))
            time.sleep(0.01)

    def session(index):
        client = Client(url, verbose=False, headers={"X-Forwarded-For": f"203.0.113.{index % 4 + 1}"})
        outcomes = []
        for _ in range(3):
            try:
                (item,), _ = client.predict(**request_fields(seed=seeds[index], **GOOD), api_name="/generate")
                outcomes.append(("ok", np.asarray(pixels(item), dtype=np.int16)))
            except QueueError as busy:
                outcomes.append(("busy", str(busy)))
        return outcomes

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    from concurrent.futures import ThreadPoolExecutor, wait

    pool = ThreadPoolExecutor(max_workers=16)
    futures = {pool.submit(session, index): index for index in seeds}
    done, not_done = wait(futures, timeout=240)
    watching.set()
    watcher.join()
    pool.shutdown(wait=False, cancel_futures=True)
    assert not not_done, f"{len(not_done)} clients hung"
    completed = busy = 0
    for future, index in futures.items():
        for kind, value in future.result():
            if kind == "ok":
                completed += 1
                assert np.abs(value - references[seeds[index]]).max() <= 1, f"client {index} got other pixels"
            else:
                busy += 1
                assert value == "Queue is full! Please try again."
    calls = {size: n for size, n in app.engine.calls_by_batch.items()}
    print(f"load with batching: {completed} completed, {busy} busy, peak waiting {peak['waiting']}, "
          f"peak running handlers {peak['running']}, calls by batch size {calls}")
    assert completed + busy == 48 and completed >= 12
    assert not violations, violations[:3]
    assert peak["running"] > 1, "generate handlers never overlapped"
    assert sum(n for size, n in calls.items() if size > 1) > 0, "no call was shared"
    assert sum(calls.values()) - calls_before < completed, "every image had its own call"
    lines = request_log()
    assert sum(1 for line in lines if line.get("outcome") == "ok") == completed
    assert sum(1 for line in lines if line.get("outcome") == "busy") == busy
    assert wait_until(lambda: not app.engine.status().busy, 10)
    health = httpx.get(url + "health").json()
    assert health["queue_length"] == 0 and health["running"] == 0


def _pending(seed: int):
    from tpu_demo.engine.batching import PendingRequest

    return PendingRequest(validate_request(request_fields(seed=seed)), lambda event: None, threading.Event())


def test_a_call_leaves_at_once_and_images_arriving_meanwhile_join_the_next():
    """No batch window: a lone visitor's image leaves with the first call; images that arrive while that
    call runs wait for the next one, which takes the largest warm size of them (here 1 and 2 are warm)."""
    from tpu_demo.engine.batching import ImageQueue

    queue = ImageQueue()
    stopped = []
    warm = lambda shape, size: size <= 2  # noqa: E731
    queue.add(_pending(1))
    started = time.monotonic()
    first = queue.take(4, usable=warm, stopped=stopped.append)
    assert [m.pending.request.seed for m in first] == [1] and time.monotonic() - started < 0.05
    for seed in (2, 3, 4):  # arrive while the device runs the first call
        queue.add(_pending(seed))
    second = queue.take(4, usable=warm, stopped=stopped.append)
    third = queue.take(4, usable=warm, stopped=stopped.append)
    assert [m.pending.request.seed for m in second] == [2, 3] and [m.pending.request.seed for m in third] == [4]
    assert queue.take(4, usable=warm, stopped=stopped.append) == [] and stopped == []
