"""Helpers the hardening tests share: pixels, references, hooks on real pipeline parts, raw calls.

The running app comes from conftest's fixtures (``launch_app``, ``served_app``); this module holds no fixtures.
"""

import base64
import html
import io
import json
import re
import time

import httpx
import numpy as np
from gradio_client import Client
from PIL import Image

from tpu_demo.core.events import ImageResult
from tpu_demo.core.request import validate_request

from conftest import request_fields

# 2 steps at 64x64 on the tiny FLUX: a fraction of a second; every input given, in the handler's order,
# so positional raw-HTTP bodies are complete
GOOD = dict(previews=False, negative_prompt="", style="None", style_scale=1.0, upsample_prompt=False)


def pixels(item) -> np.ndarray:
    with Image.open(item["image"]) as image:
        return np.asarray(image.convert("RGB"))


def reference(app, **fields) -> np.ndarray:
    """The image the engine makes for these fields, generated in-process (no HTTP)."""
    (result,) = [e for e in app.engine.generate(validate_request(request_fields(**fields)))
                 if isinstance(e, ImageResult)]
    return np.asarray(result.image.convert("RGB"))


def good_request_works(client, app, seed=7) -> None:
    (item,), _ = client.predict(**request_fields(seed=seed, **GOOD), api_name="/generate")
    assert np.array_equal(pixels(item), reference(app, seed=seed))


class Hook:
    """A forward pre-hook on a real pipeline component, removed when the test ends."""

    def __init__(self, module, fn, with_kwargs=False):
        self.handle = module.register_forward_pre_hook(fn, with_kwargs=with_kwargs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def slow_steps(app, seconds=0.05):
    """Each denoising step sleeps ``seconds``; returns the list of step times and the hook."""
    steps: list[float] = []

    def slow(module, args):
        time.sleep(seconds)
        steps.append(time.monotonic())

    return steps, Hook(app.engine.load("tiny-flux").transformer, slow)


def wait_until(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()




def raw_call(url: str, body: str) -> str:
    """POST a raw JSON body to the ``/call/generate`` API; the event stream of its answer, as text."""
    with httpx.Client(base_url=url, timeout=30) as http:
        posted = http.post("gradio_api/call/generate", content=body.encode(), headers={"content-type": "application/json"})
        if posted.status_code != 200:
            return f"error {posted.status_code} {posted.text}"
        return http.get(f"gradio_api/call/generate/{posted.json()['event_id']}").text



def queue_call(http: httpx.Client, fn_index: int, data: list, session_hash: str) -> dict:
    """One event through Gradio's queue as the page runs it (join, then the session's stream): its
    ``process_completed`` message (``success``, ``output``: the ``data`` or the ``error``, and its title)."""
    joined = http.post("gradio_api/queue/join", json={"data": data, "fn_index": fn_index, "session_hash": session_hash})
    assert joined.status_code == 200, joined.text
    with http.stream("GET", "gradio_api/queue/data", params={"session_hash": session_hash}) as stream:
        for line in stream.iter_lines():
            message = json.loads(line[len("data:"):]) if line.startswith("data:") else {}
            if message.get("msg") == "process_completed":
                return message
    raise AssertionError("the stream closed before the event completed")


def generate_fn_index(url: str) -> int:
    config = httpx.get(url + "config").json()
    return next(dep["id"] for dep in config["dependencies"] if dep.get("api_name") == "generate")


# ---- 3. failure recovery -------------------------------------------------------------------
def raising_once(error: BaseException):
    """A forward pre-hook that raises ``error`` on its first call only, and the list that records it."""
    raised: list[int] = []

    def fail_once(module, args):
        if not raised:
            raised.append(1)
            raise error

    return fail_once, raised



def preview_caption(preview_html: str) -> str:
    """``preview · image i · step s/N`` from the live preview output (web/outputs.py's figure)."""
    match = re.search(r"<figcaption>(.*?)</figcaption>", preview_html)
    assert match, preview_html
    return html.unescape(match.group(1))


def preview_image(preview_html: str) -> Image.Image:
    """The live preview's pixels, decoded from its inline ``data:`` URL."""
    match = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', preview_html)
    assert match, preview_html
    return Image.open(io.BytesIO(base64.b64decode(match.group(1))))


def stopped_early(job, total: int) -> int:
    """A job that was stopped: it ends with an error saying how many of its ``total`` images were
    finished (never a success with a short gallery); returns that number, checked against the
    finished images it streamed."""

    from gradio_client.exceptions import AppError

    try:
        job.result()
    except AppError as error:
        match = re.search(rf"(\d+) of {total} images finished", str(error))
        assert match, str(error)
    else:
        raise AssertionError("a stopped request returned success")
    finished = int(match.group(1))
    streamed, preview = job.outputs()[-1] if job.outputs() else ([], "")
    assert finished < total and len(streamed) == finished and not preview
    return finished


def run_script_main(script: str, *argv: str) -> None:
    """``scripts/<script>.py``'s ``main(argv)`` in this process: a new process per run would pay the torch and
    diffusers imports again (most of a miniature run). The global RNG, thread count and determinism setting
    the script changes are put back; a test that means a user's own run starts a process."""
    import importlib
    import sys
    from pathlib import Path

    import torch

    scripts = str(Path(__file__).resolve().parents[1] / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    module = importlib.import_module(script)
    threads = torch.get_num_threads()
    deterministic, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        with torch.random.fork_rng(devices=[]):
            module.main(list(argv))
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
