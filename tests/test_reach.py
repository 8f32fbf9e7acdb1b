"""What the app can reach and what it exposes: file routes, the API's names, loading, /health."""

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


# ---- 4. no reach beyond the demo ------------------------------------------------------------
def test_file_routes_serve_only_the_apps_own_files(served_app, cache_dir):
    app, url = served_app
    answer = raw_call(url, json.dumps({"data": list(request_fields(**GOOD).values())}))
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


def test_the_api_names_no_paths_repos_or_files(served_app):
    app, url = served_app
    api = Client(url, verbose=False).view_api(return_format="dict", print_info=False)
    assert sorted(api["named_endpoints"]) == ["/compare_execution_modes", "/compare_modes", "/generate",
                                              "/generate_images", "/list_models", "/stop"]  # the MCP tools too
    assert not api["unnamed_endpoints"]
    for endpoint in ("/generate", "/compare_modes", "/generate_images", "/compare_execution_modes"):
        kinds = {p["component"] for p in api["named_endpoints"][endpoint]["parameters"]}
        assert not kinds & {"File", "UploadButton", "Image"}


def test_no_pickle_and_no_remote_code_in_the_loading_path():
    sources = {path.name: path.read_text() for path in (REPO / "tpu_demo").rglob("*.py")}
    for name, text in sources.items():
        assert "trust_remote_code=True" not in text, name
        assert "torch.load(" not in text and "import pickle" not in text, name
    loading = sources["loading.py"]
    assert "use_safetensors=True" in loading and "local_files_only=True" in loading


def test_health_reports_device_models_buckets_and_queue_without_paths(served_app, cache_dir):
    app, url = served_app
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
