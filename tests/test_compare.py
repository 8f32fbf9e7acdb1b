"""Compare modes: one request in strict eager, optimized eager and compiled, through the real API.

A real app on loopback, the real gradio_client and raw HTTP; the figures are checked against the
images themselves (pixel differences recomputed here) and against the engine's compile counter.
"""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from PIL import Image

from conftest import free_port, request_fields
from support import stopped_early

ROOT = Path(__file__).resolve().parent.parent
#: the tolerance the eager-vs-compiled engine test uses: same graph, up to float rounding in uint8
PIXEL_TOLERANCE = 2


def compare(client, **overrides):
    fields = dict(prompt="a red circle on a white background", negative_prompt="", model="tiny-flux",
                  resolution="64x64", num_inference_steps=2, guidance_scale=0.0, seed=7)
    fields.update(overrides)
    return client.predict(*fields.values(), api_name="/compare_modes")


def pixels(item) -> np.ndarray:
    return np.asarray(Image.open(item["image"]).convert("RGB"), dtype=np.int16)


def test_compare_modes_returns_three_matching_images_timed_warm_against_warm(launch_app):
    app, url = launch_app("--model", "tiny-flux", "--models", "tiny-flux,tiny-sd3", "--no-warmup")
    client = Client(url, verbose=False)
    gallery, summary, figures = compare(client)

    assert len(gallery) == 3
    images = [pixels(item) for item in gallery]
    assert [image.shape for image in images] == [(64, 64, 3)] * 3
    modes = figures["modes"]
    assert [m["mode"] for m in modes] == ["eager", "eager-fused", "compiled"]
    for image, mode in zip(images, modes):
        difference = int(np.abs(image - images[0]).max())
        assert difference <= PIXEL_TOLERANCE
        assert mode["max_pixel_difference"] == difference
        assert mode["denoise_seconds"] > 0 and mode["steps_per_second"] > 0
        assert mode["speedup_vs_strict_eager"] == pytest.approx(modes[0]["denoise_seconds"] / mode["denoise_seconds"],
                                                                rel=0.02)
        # nothing was warm (--no-warmup): each bucket was warmed first, outside the timed call
        assert mode["warm_before"] is False and mode["warmup_seconds"] > 0
    assert modes[0]["speedup_vs_strict_eager"] == 1.0
    assert modes[2]["graphs_compiled"] >= 1 and modes[0]["graphs_compiled"] == 0
    assert figures["warm_vs_warm"] is True and figures["same_code"] == [["eager", "eager-fused"]]
    assert figures["timed_rounds"] == 2
    assert "Warm against warm" in summary and "Same code here" in summary and "strict eager" in summary
    assert all("\u00d7" in item["caption"] for item in gallery)

    # again: every bucket is warm now, nothing compiles, the pixels are the same
    graphs = app.engine.counter.count
    gallery_again, _, figures_again = compare(client)
    assert app.engine.counter.count == graphs
    assert all(m["warm_before"] and m["warmup_seconds"] is None for m in figures_again["modes"])
    assert np.array_equal(pixels(gallery_again[2]), images[2])
    # both comparisons feed the speed chart: three warm images each
    # (each comparison times two interleaved rounds)
    assert [run.mode for run in app.engine.recent.snapshot()] == ["eager", "eager-fused", "compiled"] * 4


def test_compare_sd3_with_negative_prompt_and_cfg(launch_app):
    """A CFG model (batch 2) with a negative prompt: the compared images honour it in every mode."""
    app, url = launch_app("--model", "tiny-sd3", "--models", "tiny-sd3", "--no-warmup")
    client = Client(url, verbose=False)
    plain = compare(client, model="tiny-sd3", guidance_scale=4.5)
    negative = compare(client, model="tiny-sd3", guidance_scale=4.5, negative_prompt="blue")
    for result in (plain, negative):
        images = [pixels(item) for item in result[0]]
        assert max(int(np.abs(image - images[0]).max()) for image in images) <= PIXEL_TOLERANCE
    assert np.abs(pixels(plain[0][0]) - pixels(negative[0][0])).max() > 0
    settings = json.loads(Image.open(negative[0][2]["image"]).text["tpu_demo"])
    assert settings["negative_prompt"] == "blue" and settings["mode"] == "compiled"


def test_compare_validates_like_generate_and_the_server_keeps_serving(launch_app):
    app, url = launch_app("--model", "tiny-flux", "--models", "tiny-flux", "--no-warmup")
    client = Client(url, verbose=False)
    for overrides, field in [({"prompt": "  "}, "prompt"), ({"negative_prompt": "blur"}, "negative_prompt"),
                             ({"resolution": "4096x4096"}, "resolution"), ({"num_inference_steps": 10**6},
                                                                            "num_inference_steps")]:
        with pytest.raises(AppError, match=field):
            compare(client, **overrides)
    assert len(compare(client)[0]) == 3


def test_compare_obeys_the_per_session_limit_of_generate(launch_app):
    """Compare is a generation: while this client's generate runs, its compare is refused (503 busy)."""
    app, url = launch_app("--model", "tiny-flux", "--models", "tiny-flux", "--no-warmup", "--max-per-ip", "1",
                          "--max-images", "16")
    client = Client(url, verbose=False)
    # 16 images of 50 steps at 128x128: seconds of work, stopped below once the checks are done
    running = client.submit(**request_fields(num_inference_steps=50, num_images=16, resolution="128x128",
                                             previews=False), api_name="/generate")
    deadline = time.monotonic() + 60
    while not app.engine.status().busy and time.monotonic() < deadline:
        time.sleep(0.05)
    # raw HTTP on the /call route from another session, same address: 503 naming the address limit
    body = json.dumps({"data": ["a red circle", "", "tiny-flux", "64x64", 2, 0.0, 1, "None", 1.0, False]}).encode()
    request = urllib.request.Request(url + "gradio_api/call/compare_modes", data=body,
                                     headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 503 and "address" in json.loads(refused.value.read())["detail"]
    # the same client through gradio_client: refused by its session's share
    with pytest.raises(Exception, match="(?i)queue is full|busy"):
        compare(client)
    assert not running.done(), "the generation ended before the checks: they proved nothing"
    client.predict(api_name="/stop")
    stopped_early(running, 16)  # a stopped generation ends with an error counting its finished images
    assert len(compare(client)[0]) == 3  # the device is free again: the same client compares


def test_gradio_server_name_and_port_are_honoured(cache_dir):
    """What Hugging Face Spaces sets: the app listens where GRADIO_SERVER_NAME/PORT say."""
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "TPU_DEMO_CACHE_DIR": str(cache_dir), "TPU_DEMO_NO_WARMUP": "1", "TPU_DEMO_MODELS": "tiny-flux"}
    env.pop("TPU_DEMO_PORT", None), env.pop("TPU_DEMO_HOST", None)
    process = subprocess.Popen([sys.executable, str(ROOT / "app.py")], env=env, cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, health = time.monotonic() + 120, None
        while health is None and time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    health = json.loads(response.read())
            except OSError:
                time.sleep(0.5)
        assert health is not None, "the app did not answer on GRADIO_SERVER_PORT"
    finally:
        process.terminate()
        process.wait(timeout=30)
