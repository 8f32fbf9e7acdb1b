"""Failures injected into the real pipeline, and a client that drops its connection: only that request fails."""

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

from tpu_demo.core.events import BucketState, ShapeKey
from tpu_demo.core.modes import ExecutionMode

from conftest import request_fields
from support import (GOOD, Hook, generate_fn_index, good_request_works, pixels, raising_once, raw_call, reference,
                     slow_steps, stopped_early, wait_until)

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("failure, message", [
    (RuntimeError("injected failure in the transformer"), "Generation failed: injected failure in the transformer"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), "ran out of memory"),
])
def test_a_failing_pipeline_call_fails_only_that_request(served_app, request_log, failure, message):
    app, url = served_app
    client = Client(url, verbose=False)
    fail_once, raised = raising_once(failure)
    with Hook(app.engine.load("tiny-flux").transformer, fail_once):
        with pytest.raises(AppError, match=message):
            client.predict(**request_fields(**GOOD), api_name="/generate")
        # the device thread is free again (not at the very instant the error reaches the client: the
        # job's cleanup, or a background warmup job of this module's app, may still hold it a moment)
        assert raised == [1] and wait_until(lambda: not app.engine.status().busy, 30)
        good_request_works(client, app)  # same pipeline, same device, right pixels
    failed = [line for line in request_log() if line["outcome"] == "failed"]
    assert len(failed) == 1 and message in failed[0]["error"] and failed[0]["model"] == "tiny-flux"


def test_a_failing_vae_decode_fails_only_that_request(served_app):
    app, url = served_app
    client = Client(url, verbose=False)
    fail_once, _ = raising_once(RuntimeError("injected decode failure"))
    with Hook(app.engine.load("tiny-flux").vae.decoder, fail_once):
        with pytest.raises(AppError, match="injected decode failure"):
            client.predict(**request_fields(**GOOD), api_name="/generate")
        good_request_works(client, app)


def test_a_failed_bucket_warmup_marks_only_that_bucket(launch_app):
    app, url = launch_app("--no-warmup", "--model", "tiny-flux", "--buckets", "64x64,128x128,96x64")
    transformer = app.engine.load("tiny-flux").transformer

    def fail_128(module, args, kwargs):  # 128x128 packs into 8x8=64 latent tokens
        if kwargs["hidden_states"].shape[1] == 64:
            raise RuntimeError("injected warmup failure")

    with Hook(transformer, fail_128, with_kwargs=True):
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
            (item,), _ = client.predict(**request_fields(resolution=resolution, **GOOD), api_name="/generate")
            assert Image.open(item["image"]).size == size
    # the failed bucket is tried again on demand once the fault is gone
    (item,), _ = client.predict(**request_fields(resolution="128x128", **GOOD), api_name="/generate")
    assert Image.open(item["image"]).size == (128, 128)
    assert app.engine.bucket_status(ShapeKey("tiny-flux", ExecutionMode.EAGER.value, "128x128")).state is BucketState.WARM


# ---- 3b. a client that goes away frees the device -------------------------------------------
def test_a_client_that_drops_its_connection_frees_the_device(served_app, request_log):
    app, url = served_app
    steps, slow = slow_steps(app)
    fn_index = generate_fn_index(url)
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
        assert wait_until(lambda: not app.engine.status().busy, 20)
        after = sum(1 for t in steps if t > dropped_at)
        print(f"steps after the client dropped its connection: {after}")
        assert after <= 15, f"{after} steps ran after the client left"
        assert len(steps) < 50
        assert wait_until(lambda: any(line.get("outcome") == "disconnected" for line in request_log()), 5)
    client = Client(url, verbose=False)
    good_request_works(client, app)
