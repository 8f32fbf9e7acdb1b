"""Public-demo hardening on the real app: a Gradio server on loopback, gradio_client, raw HTTP.

Bad input through the API, a load of concurrent clients, the per-client and queue limits,
failures injected into the real pipeline, a client that drops its connection, the time limit,
the health endpoint, the file routes and the operator log lines.
"""

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from gradio_client import Client
from gradio_client.exceptions import AppError
from gradio_client.utils import QueueError
from PIL import Image

from tpu_demo.launch.config import parse_config
from tpu_demo.core.events import BucketState, ImageResult
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.events import ShapeKey
from tpu_demo.core.request import validate_request
from tpu_demo.launch.serve import build_app, launch

from conftest import free_port, request_fields

REPO = Path(__file__).resolve().parents[1]
# 2 steps at 64x64 on the tiny FLUX: a fraction of a second; every input given, in the handler's order,
# so the positional raw-HTTP bodies below are complete
GOOD = dict(previews=False, negative_prompt="")


def _start(cache_dir, *flags):
    port = free_port()
    config = parse_config(["--port", str(port), "--cache-dir", str(cache_dir), "--compile-backend", "aot_eager",
                           "--no-warmup", *flags], environ={})
    app = build_app(config)
    launch(app, prevent_thread_lock=True)
    return app, f"http://127.0.0.1:{port}/"


def _stop(app):
    app.demo.close()
    app.engine.close()


@pytest.fixture(scope="module")
def server(cache_dir):
    """One app for the tests that need no special flags; each test leaves it as it found it."""
    app, url = _start(cache_dir)
    yield app, url
    _stop(app)


@pytest.fixture
def start_app(cache_dir):
    apps = []

    def start(*flags):
        app, url = _start(cache_dir, *flags)
        apps.append(app)
        return app, url

    yield start
    for app in apps:
        _stop(app)


@pytest.fixture
def request_log(caplog):
    """The JSON lines the app wrote to the ``tpu_demo.requests`` logger during the test."""
    caplog.set_level(logging.INFO, logger="tpu_demo.requests")

    def lines():
        return [json.loads(r.getMessage()) for r in caplog.records if r.name == "tpu_demo.requests"]

    return lines


def _pixels(item) -> np.ndarray:
    with Image.open(item["image"]) as image:
        return np.asarray(image.convert("RGB"))


def _reference(app, **fields) -> np.ndarray:
    """The image the engine makes for these fields, generated in-process (no HTTP)."""
    (result,) = [e for e in app.engine.generate(validate_request(request_fields(**fields)))
                 if isinstance(e, ImageResult)]
    return np.asarray(result.image.convert("RGB"))


def _good_request_works(client, app, seed=7) -> None:
    (item,) = client.predict(**request_fields(seed=seed, **GOOD), api_name="/generate")
    assert np.array_equal(_pixels(item), _reference(app, seed=seed))


class _Hook:
    """A forward pre-hook on a real pipeline component, removed when the test ends."""

    def __init__(self, module, fn, with_kwargs=False):
        self.handle = module.register_forward_pre_hook(fn, with_kwargs=with_kwargs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def _slow_steps(app, seconds=0.05):
    """Each denoising step sleeps ``seconds``; returns the list of step times and the hook."""
    steps: list[float] = []

    def slow(module, args):
        time.sleep(seconds)
        steps.append(time.monotonic())

    return steps, _Hook(app.engine.load("tiny-flux").transformer, slow)


def _wait_until(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


# ---- 1. every field validated on the server --------------------------------------------------
BAD_INPUTS = [
    # (field, value, text the error must contain)
    ("prompt", 123, "prompt: must be text"),
    ("prompt", None, "prompt: must be text"),
    ("prompt", "   ", "prompt: is empty"),
    ("prompt", "x" * 100_000, "prompt: is 100000 characters long; the limit is 1000"),
    ("prompt", "a cat\x00; rm -rf /", "prompt: contains control"),
    ("prompt", "bell \x07 and escape \x1b[31m", "prompt: contains control"),
    ("model", "no-such-model", "model:"),
    ("model", "black-forest-labs/FLUX.1-dev", "model:"),
    ("model", "../../../etc/passwd", "model:"),
    ("model", 5, "model: must be a model id"),
    ("mode", "turbo", "mode: 'turbo' is not a mode"),
    ("mode", None, "mode: 'None' is not a mode"),
    ("resolution", "64", "resolution: resolution '64' is not of the form WIDTHxHEIGHT"),
    ("resolution", "64x64; cat /etc/passwd", "is not of the form WIDTHxHEIGHT"),
    ("resolution", "64x65", "must have both sides positive multiples"),
    ("resolution", "4096x4096", "resolution: 4096x4096 is not served for tiny-flux; choose one of"),
    ("resolution", 64, "is not of the form WIDTHxHEIGHT"),
    ("num_inference_steps", 0, "num_inference_steps: must be from 1 to 50, got 0"),
    ("num_inference_steps", 10**9, "num_inference_steps: must be from 1 to 50"),
    ("num_inference_steps", 2.5, "num_inference_steps: must be a whole number"),
    ("num_inference_steps", "many", "num_inference_steps: must be an integer"),
    ("num_inference_steps", [2], "num_inference_steps: must be an integer"),
    ("seed", -1, "seed: must be from 0 to 4294967295, got -1"),
    ("seed", 2**40, "seed: must be from 0 to 4294967295"),
    ("seed", True, "seed: must be an integer"),
    ("seed", "12abc", "seed: must be an integer"),
    ("num_images", 0, "num_images: must be from 1 to 4, got 0"),
    ("num_images", 10**6, "num_images: must be from 1 to 4, got 1000000"),
    ("num_images", -3, "num_images: must be from 1 to 4"),
    ("previews", "yes please", "previews: must be true or false"),
]


def test_bad_inputs_get_their_field_error_and_the_server_keeps_serving(server, request_log):
    app, url = server
    client = Client(url, verbose=False)
    calls: list[int] = []
    with _Hook(app.engine.load("tiny-flux").transformer, lambda module, args: calls.append(1)):
        for field, value, expected in BAD_INPUTS:
            with pytest.raises(AppError) as error:
                client.predict(**request_fields(**{**GOOD, field: value}), api_name="/generate")
            assert expected in str(error.value), (field, value, str(error.value))
            assert "Traceback" not in str(error.value)
        assert calls == []  # no bad request reached the device
        # guidance is checked against the model's range (tiny SD3 takes CFG); still nothing loads
        for value, expected in ((1000, "guidance_scale: must be from 0.0 to 20.0"), ("inf", "guidance_scale")):
            with pytest.raises(AppError, match=expected):
                client.predict(**request_fields(model="tiny-sd3", guidance_scale=value, **GOOD), api_name="/generate")
        assert "tiny-sd3" not in app.engine.status().models
        # markup in a refused value comes back escaped (Gradio shows error text as HTML)
        with pytest.raises(AppError) as error:
            client.predict(**request_fields(mode="<img src=x onerror=alert(1)>", **GOOD), api_name="/generate")
        assert "<img" not in str(error.value) and "&lt;img" in str(error.value)
        # what gradio_client cannot send: a lone surrogate (raw JSON escape), a payload of the wrong shape
        fields = list(request_fields(**GOOD).values())
        body = json.dumps({"data": ["lone surrogate PLACEHOLDER", *fields[1:]]}).replace("PLACEHOLDER", "\\ud800")
        assert "prompt: contains control" in _raw_call(url, body)
        for data in ([], fields[:3], "not a list", [fields]):  # (extra values are ignored by Gradio)
            assert "error" in _raw_call(url, json.dumps({"data": data}))
        # unicode prompts are fine; the server answers good requests after all of the above
        (item,) = client.predict(**request_fields(prompt="\u65e5\u672c\u8a9e \U0001f3a8 caf\u00e9", **GOOD),
                                 api_name="/generate")
        assert Image.open(item["image"]).size == (64, 64)
        _good_request_works(client, app)
    assert len(calls) == 3 * 2  # the unicode and the good request, and the in-process reference: 2 steps each
    invalid = [line for line in request_log() if line["outcome"] == "invalid"]
    assert len(invalid) >= len(BAD_INPUTS) + 4
    assert all(line["error"] for line in invalid)


def _raw_call(url: str, body: str) -> str:
    """POST a raw JSON body to the ``/call/generate`` API; the event stream of its answer, as text."""
    with httpx.Client(base_url=url, timeout=30) as http:
        posted = http.post("gradio_api/call/generate", content=body.encode(), headers={"content-type": "application/json"})
        if posted.status_code != 200:
            return f"error {posted.status_code} {posted.text}"
        return http.get(f"gradio_api/call/generate/{posted.json()['event_id']}").text


def test_good_request_after_each_bad_one(server):
    """Interleaved: a refused request never leaves the session or the device stuck."""
    app, url = server
    client = Client(url, verbose=False)
    for field, value, expected in BAD_INPUTS[::6]:
        with pytest.raises(AppError, match=expected.split(":")[0]):
            client.predict(**request_fields(**{**GOOD, field: value}), api_name="/generate")
        _good_request_works(client, app, seed=11)


# ---- 2. load: concurrent clients, bounded queue ---------------------------------------------
def test_sixteen_clients_three_requests_each_complete_or_are_told_busy(start_app):
    app, url = start_app("--max-queue", "8", "--max-per-ip", "0")
    seeds = {client: 500 + client for client in range(16)}
    references = {seed: _reference(app, seed=seed) for seed in seeds.values()}

    def session(client_index: int) -> list:
        client = Client(url, verbose=False)
        outcomes = []
        for _ in range(3):
            try:
                (item,) = client.predict(**request_fields(seed=seeds[client_index], **GOOD), api_name="/generate")
                outcomes.append(("ok", _pixels(item)))
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
    assert _wait_until(lambda: not app.engine.status().busy, 10)
    health = httpx.get(url + "health").json()
    assert health["queue_length"] == 0 and health["running"] == 0


def test_full_queue_answers_busy_at_once(start_app):
    app, url = start_app("--max-queue", "1", "--max-per-session", "0", "--max-per-ip", "0")
    steps, slow = _slow_steps(app)
    with slow:
        client = Client(url, verbose=False)
        running = client.submit(**request_fields(num_inference_steps=50, num_images=4, **GOOD), api_name="/generate")
        assert _wait_until(lambda: len(steps) >= 1)
        waiting = client.submit(**request_fields(seed=8, **GOOD), api_name="/generate")
        assert _wait_until(lambda: httpx.get(url + "health").json()["queue_length"] == 1, 10)
        started = time.monotonic()
        with pytest.raises(QueueError, match="Queue is full! Please try again."):
            client.predict(**request_fields(seed=9, **GOOD), api_name="/generate")
        assert time.monotonic() - started < 5  # answered, not parked
        raw = httpx.post(url + "gradio_api/call/generate", json={"data": list(request_fields(**GOOD).values())})
        assert raw.status_code == 503
        assert raw.json()["detail"] == "busy: the queue is full (1 requests waiting); try again in a minute"
        # the full queue refuses generations only: Stop still reaches the running request
        client.predict(api_name="/stop")
        assert len(running.result()) < 4 and len(waiting.result()) == 1


# ---- 2b. per-client limits -----------------------------------------------------------------
def test_one_request_per_session_and_a_few_per_address(start_app):
    app, url = start_app("--max-per-session", "1", "--max-per-ip", "2")
    steps, slow = _slow_steps(app)
    with slow:
        first = Client(url, verbose=False, headers={"X-Forwarded-For": "203.0.113.7"})
        running = first.submit(**request_fields(num_inference_steps=50, num_images=4, **GOOD), api_name="/generate")
        assert _wait_until(lambda: len(steps) >= 1)
        # the same session again: busy, with the reason in the HTTP answer
        with pytest.raises(QueueError):
            first.predict(**request_fields(**GOOD), api_name="/generate")
        raw = httpx.post(url + "gradio_api/queue/join", headers={"X-Forwarded-For": "203.0.113.7"},
                         json={"data": list(request_fields(**GOOD).values()), "fn_index": _generate_fn_index(url),
                               "session_hash": first.session_hash})
        assert raw.status_code == 503
        assert raw.json()["detail"].startswith("busy: this session already has 1 request(s) waiting or running")
        # another session from the same address: one more is admitted (it waits), the next is busy
        second = Client(url, verbose=False, headers={"X-Forwarded-For": "203.0.113.7"})
        waiting = second.submit(**request_fields(seed=3, **GOOD), api_name="/generate")
        assert _wait_until(lambda: httpx.get(url + "health").json()["queue_length"] == 1, 10)
        third = Client(url, verbose=False, headers={"X-Forwarded-For": "203.0.113.7"})
        with pytest.raises(QueueError):
            third.predict(**request_fields(**GOOD), api_name="/generate")
        # another address is served as usual
        other = Client(url, verbose=False, headers={"X-Forwarded-For": "198.51.100.1"})
        elsewhere = other.submit(**request_fields(seed=4, **GOOD), api_name="/generate")
        # a waiting request that is cancelled gives its place back
        waiting.cancel()
        assert _wait_until(lambda: httpx.get(url + "health").json()["queue_length"] == 1, 10)
        late = third.submit(**request_fields(seed=5, **GOOD), api_name="/generate")
        first.predict(api_name="/stop")  # ends the long request early (its finished images are kept)
        assert len(running.result()) < 4 and len(elsewhere.result()) == 1 and len(late.result()) == 1
    # everything ended: the first session is admitted again (nothing leaked)
    _good_request_works(first, app, seed=12)


def _generate_fn_index(url: str) -> int:
    config = httpx.get(url + "config").json()
    return next(dep["id"] for dep in config["dependencies"] if dep.get("api_name") == "generate")


# ---- 3. failure recovery -------------------------------------------------------------------
def _raising_once(error: BaseException):
    """A forward pre-hook that raises ``error`` on its first call only, and the list that records it."""
    raised: list[int] = []

    def fail_once(module, args):
        if not raised:
            raised.append(1)
            raise error

    return fail_once, raised


@pytest.mark.parametrize("failure, message", [
    (RuntimeError("injected failure in the transformer"), "Generation failed: injected failure in the transformer"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), "ran out of memory"),
])
def test_a_failing_pipeline_call_fails_only_that_request(server, request_log, failure, message):
    app, url = server
    client = Client(url, verbose=False)
    fail_once, raised = _raising_once(failure)
    with _Hook(app.engine.load("tiny-flux").transformer, fail_once):
        with pytest.raises(AppError, match=message):
            client.predict(**request_fields(**GOOD), api_name="/generate")
        assert raised == [1] and not app.engine.status().busy
        _good_request_works(client, app)  # same pipeline, same device, right pixels
    failed = [line for line in request_log() if line["outcome"] == "failed"]
    assert len(failed) == 1 and message in failed[0]["error"] and failed[0]["model"] == "tiny-flux"


def test_a_failing_vae_decode_fails_only_that_request(server):
    app, url = server
    client = Client(url, verbose=False)
    fail_once, _ = _raising_once(RuntimeError("injected decode failure"))
    with _Hook(app.engine.load("tiny-flux").vae.decoder, fail_once):
        with pytest.raises(AppError, match="injected decode failure"):
            client.predict(**request_fields(**GOOD), api_name="/generate")
        _good_request_works(client, app)


def test_a_failed_bucket_warmup_marks_only_that_bucket(start_app):
    app, url = start_app("--model", "tiny-flux", "--buckets", "64x64,128x128,96x64")
    transformer = app.engine.load("tiny-flux").transformer

    def fail_128(module, args, kwargs):  # 128x128 packs into 8x8=64 latent tokens
        if kwargs["hidden_states"].shape[1] == 64:
            raise RuntimeError("injected warmup failure")

    with _Hook(transformer, fail_128, with_kwargs=True):
        states = app.engine.warmup("tiny-flux", ExecutionMode.EAGER)
        assert [(s.resolution, s.state) for s in states] == [
            ("64x64", BucketState.WARM), ("128x128", BucketState.FAILED), ("96x64", BucketState.WARM)]
        panel = app.ui.bucket_table("tiny-flux", "eager")
        failed_row = next(line for line in panel.splitlines() if line.startswith("| 128x128"))
        assert "failed" in failed_row and "injected warmup failure" in failed_row
        health = httpx.get(url + "health").json()
        assert health["failed_buckets"] == 1 and health["warm_buckets"] == 2
        client = Client(url, verbose=False)
        for resolution, size in (("64x64", (64, 64)), ("96x64", (96, 64))):
            (item,) = client.predict(**request_fields(resolution=resolution, **GOOD), api_name="/generate")
            assert Image.open(item["image"]).size == size
    # the failed bucket is tried again on demand once the fault is gone
    (item,) = client.predict(**request_fields(resolution="128x128", **GOOD), api_name="/generate")
    assert Image.open(item["image"]).size == (128, 128)
    assert app.engine.bucket_status(ShapeKey("tiny-flux", ExecutionMode.EAGER.value, "128x128")).state is BucketState.WARM


# ---- 3b. a client that goes away frees the device -------------------------------------------
def test_a_client_that_drops_its_connection_frees_the_device(server, request_log):
    app, url = server
    steps, slow = _slow_steps(app)
    fn_index = _generate_fn_index(url)
    session = "dropped-connection"
    fields = request_fields(num_inference_steps=50, num_images=2, **GOOD)
    with slow:
        with httpx.Client(base_url=url, timeout=30) as http:
            joined = http.post("gradio_api/queue/join", json={"data": list(fields.values()), "fn_index": fn_index,
                                                              "session_hash": session})
            assert joined.status_code == 200
            with http.stream("GET", "gradio_api/queue/data", params={"session_hash": session}) as stream:
                for line in stream.iter_lines():
                    if len(steps) >= 5:
                        break
            dropped_at = time.monotonic()
        # no preview is streamed, so the handler never yields before the image ends: the watch
        # thread has to see the dropped stream
        assert _wait_until(lambda: not app.engine.status().busy, 20)
        after = sum(1 for t in steps if t > dropped_at)
        print(f"steps after the client dropped its connection: {after}")
        assert after <= 15, f"{after} steps ran after the client left"
        assert len(steps) < 50
        assert _wait_until(lambda: any(line.get("outcome") == "disconnected" for line in request_log()), 5)
    client = Client(url, verbose=False)
    _good_request_works(client, app)


# ---- 2c. time limit ---------------------------------------------------------------------------
def test_a_request_over_the_time_limit_is_stopped_and_reported(start_app, request_log):
    app, url = start_app("--request-timeout", "1")
    steps, slow = _slow_steps(app)
    client = Client(url, verbose=False)
    with slow:
        started = time.monotonic()
        with pytest.raises(AppError, match=r"Time limit: this request generated for longer than 1 s"):
            client.predict(**request_fields(num_inference_steps=50, num_images=2, **GOOD), api_name="/generate")
        assert time.monotonic() - started < 10 and len(steps) < 50
    (line,) = [line for line in request_log() if line["outcome"] == "timeout"]
    assert line["images_done"] == 0 and line["steps"] == 50
    _good_request_works(client, app)


def test_loading_and_compiling_do_not_count_against_the_time_limit(start_app):
    app, url = start_app("--request-timeout", "0.5")
    client = Client(url, verbose=False)
    started = time.monotonic()
    (item,) = client.predict(**request_fields(mode="compiled", **GOOD), api_name="/generate")
    status = app.engine.bucket_status(ShapeKey("tiny-flux", ExecutionMode.COMPILED.value, "64x64"))
    print(f"cold compiled request: {time.monotonic() - started:.2f}s, compile {status.compile_seconds}s")
    assert status.state is BucketState.WARM and status.compile_seconds > 0.5  # longer than the limit
    assert "compiled first" in item["caption"]


# ---- 4. no reach beyond the demo ------------------------------------------------------------
def test_file_routes_serve_only_the_apps_own_files(server, cache_dir):
    app, url = server
    answer = _raw_call(url, json.dumps({"data": list(request_fields(**GOOD).values())}))
    image_url = json.loads(answer.split("data: ", 1)[1].splitlines()[0])[0][0]["image"]["url"]
    model_file = next((cache_dir / "models").rglob("model_index.json"))
    port = url.rsplit(":", 1)[1].strip("/")
    forbidden = ["/etc/passwd", str(REPO / "app.py"), str(REPO / "tpu_demo" / "engine.py"), str(model_file),
                 "../../../../etc/passwd", "%2Fetc%2Fpasswd", "~/.bashrc", f"http://127.0.0.1:{port}/health",
                 "http://169.254.169.254/latest/meta-data/", "file:///etc/passwd"]
    with httpx.Client(base_url=url.rstrip("/"), timeout=10) as http:
        # what it does serve: the image it just made, from Gradio's own cache
        served = http.get(image_url)
        assert served.status_code == 200 and served.content[:8] == b"\x89PNG\r\n\x1a\n"
        for target in forbidden:
            for prefix in ("/gradio_api/file=", "/file="):
                response = http.get(prefix + target)
                assert response.status_code in (403, 404), (prefix + target, response.status_code)
                assert "root:" not in response.text and "import" not in response.text
        for path in ("/static/../../../etc/passwd", "/assets/..%2F..%2F..%2Fapp.py", "/gradio_api/../app.py"):
            response = http.get(path)
            assert "root:x" not in response.text and "from tpu_demo" not in response.text, path
    assert not app.demo.allowed_paths  # nothing beyond Gradio's own cache is opened to file routes


def test_the_api_names_no_paths_repos_or_files(server):
    app, url = server
    api = Client(url, verbose=False).view_api(return_format="dict", print_info=False)
    assert sorted(api["named_endpoints"]) == ["/compare_modes", "/generate", "/stop"]
    assert not api["unnamed_endpoints"]
    for endpoint in ("/generate", "/compare_modes"):
        kinds = {p["component"] for p in api["named_endpoints"][endpoint]["parameters"]}
        assert not kinds & {"File", "UploadButton", "Image"}


def test_no_pickle_and_no_remote_code_in_the_loading_path():
    sources = {path.name: path.read_text() for path in (REPO / "tpu_demo").rglob("*.py")}
    for name, text in sources.items():
        assert "trust_remote_code=True" not in text, name
        assert "torch.load(" not in text and "import pickle" not in text, name
    loading = sources["loading.py"]
    assert "use_safetensors=True" in loading and "local_files_only=True" in loading


def test_health_reports_device_models_buckets_and_queue_without_paths(server, cache_dir):
    app, url = server
    Client(url, verbose=False).predict(**request_fields(**GOOD), api_name="/generate")
    response = httpx.get(url + "health")
    assert response.status_code == 200 and response.headers["cache-control"] == "no-store"
    health = response.json()
    assert health["status"] == "ok" and health["device"]["kind"] == "cpu"
    assert "tiny-flux" in health["models_loaded"] and health["warm_buckets"] >= 1
    assert {"model": "tiny-flux", "mode": "eager", "resolution": "64x64", "batch": 1, "state": "warm"}.items() \
        <= next(b for b in health["buckets"]
                if b["model"] == "tiny-flux" and b["resolution"] == "64x64" and b["mode"] == "eager").items()
    assert health["queue_length"] == 0 and health["busy"] is False
    text = response.text
    assert str(cache_dir) not in text and str(REPO) not in text and "/root" not in text and "/tmp" not in text


# ---- 5. operator logs -----------------------------------------------------------------------
def test_one_json_log_line_per_request_without_the_prompt(server, request_log):
    app, url = server
    client = Client(url, verbose=False)
    prompt = "a secret little prompt"
    client.predict(**request_fields(prompt=prompt, num_images=2, seed=21, **GOOD), api_name="/generate")
    (line,) = [line for line in request_log() if line.get("outcome") == "ok"]
    assert line["model"] == "tiny-flux" and line["bucket"] == "64x64" and line["steps"] == 2
    assert line["images_done"] == 2 and line["num_images"] == 2 and line["mode"] == "eager"
    assert len(line["id"]) == 32 and line["queue_wait_s"] is not None and line["queue_wait_s"] >= 0
    assert line["denoise_s"] > 0 and line["decode_s"] > 0 and line["compile_s"] >= 0
    assert "prompt" not in line and prompt not in json.dumps(request_log())


def test_prompts_are_logged_only_when_the_operator_asks(start_app, request_log):
    app, url = start_app("--log-prompts")
    Client(url, verbose=False).predict(**request_fields(prompt="log me", **GOOD), api_name="/generate")
    (line,) = [line for line in request_log() if line.get("outcome") == "ok"]
    assert line["prompt"] == "log me"
