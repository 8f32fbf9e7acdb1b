"""The operator's log: one JSON line per request, prompts only when asked."""

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


# ---- 5. operator logs -----------------------------------------------------------------------
def test_one_json_log_line_per_request_without_the_prompt(served_app, request_log):
    app, url = served_app
    client = Client(url, verbose=False)
    prompt = "a secret little prompt"
    client.predict(**request_fields(prompt=prompt, num_images=2, seed=21, **GOOD), api_name="/generate")
    (line,) = [line for line in request_log() if line.get("outcome") == "ok"]
    assert line["model"] == "tiny-flux" and line["bucket"] == "64x64" and line["steps"] == 2
    assert line["images_done"] == 2 and line["num_images"] == 2 and line["mode"] == "eager"
    assert len(line["id"]) == 32 and line["queue_wait_s"] is not None and line["queue_wait_s"] >= 0
    assert line["denoise_s"] > 0 and line["decode_s"] > 0 and line["compile_s"] >= 0
    assert "prompt" not in line and prompt not in json.dumps(request_log())


def test_prompts_are_logged_only_when_the_operator_asks(launch_app, request_log):
    app, url = launch_app("--no-warmup", "--log-prompts")
    Client(url, verbose=False).predict(**request_fields(prompt="log me", **GOOD), api_name="/generate")
    (line,) = [line for line in request_log() if line.get("outcome") == "ok"]
    assert line["prompt"] == "log me"
