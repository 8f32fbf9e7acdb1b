"""SIGTERM on the real `python app.py` process: the running request stops, the process exits 0."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from gradio_client import Client

from conftest import free_port, request_fields

REPO = Path(__file__).resolve().parents[1]


def test_sigterm_stops_the_running_request_and_exits_cleanly(cache_dir):
    """Started as the README starts it (PyTorch's backend autoload left as it is): on this host, whose
    PCI bus lists no Google device, the app never loads torch-tpu."""
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "app.py", "--port", str(port), "--cache-dir", str(cache_dir), "--compile-backend",
         "aot_eager", "--no-warmup", "--threads", "1"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(url + "health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        loaded = Path(f"/proc/{process.pid}/maps").read_text()
        assert "torch_tpu" not in loaded and "libtpu" not in loaded
        client = Client(url, verbose=False)
        job = client.submit(**request_fields(num_inference_steps=50, num_images=4, resolution="128x128",
                                             previews=False), api_name="/generate")
        images_when_signalled = None
        for gallery, _ in job:
            images_when_signalled = len(gallery)
            process.send_signal(signal.SIGTERM)
            signalled_at = time.monotonic()
            break
        assert images_when_signalled == 1
        output, _ = process.communicate(timeout=60)
        exit_seconds = time.monotonic() - signalled_at
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    print(f"exit {exit_seconds:.2f}s after SIGTERM")
    assert process.returncode == 0, output[-3000:]
    assert "shut down cleanly" in output
    request_lines = [json.loads(line.split("tpu_demo.requests: ", 1)[1]) for line in output.splitlines()
                     if "tpu_demo.requests: " in line]
    (line,) = [line for line in request_lines if line.get("num_images") == 4]
    assert line["outcome"] == "shutdown" and 1 <= line["images_done"] < 4
