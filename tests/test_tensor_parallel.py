"""Tensor-parallel serving: real torchrun ranks on CPU (gloo), driven through the real Gradio API.

Two ranks are started by scripts/serve_tp.sh exactly as an operator would; rank 0 serves the
page. The TP images are compared with single-process images of the same seed; a follower is
killed mid-run; SIGTERM on the launcher must leave no process behind.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest
from gradio_client import Client
from PIL import Image

from conftest import free_port, request_fields
from support import preview_caption

REPO = Path(__file__).resolve().parent.parent
TP_TIMEOUT_SECONDS = 10  # --tp-timeout of the test servers: how long a silent rank may lag
START_SECONDS = 240


class TensorParallelServer:
    """``scripts/serve_tp.sh 2 ...`` in its own session, with its log and process tree."""

    def __init__(self, cache_dir: Path, log_path: Path, *flags: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HF_HUB_OFFLINE": "1",
               "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1",
               "PYTHON": sys.executable}  # serve_tp.sh starts the ranks with the test run's interpreter
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.launcher = subprocess.Popen(
            ["bash", "scripts/serve_tp.sh", "2", "--device", "cpu", "--port", str(self.port), "--cache-dir",
             str(cache_dir), "--compile-backend", "aot_eager", "--no-warmup", "--threads", "1",
             "--tp-timeout", str(TP_TIMEOUT_SECONDS), *flags],
            cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes: list[psutil.Process] = []

    def wait_until_serving(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            assert self.launcher.poll() is None, f"launcher exited early:\n{self.log_text()[-3000:]}"
            try:
                urllib.request.urlopen(self.url, timeout=2).close()
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail(f"TP app did not start in {START_SECONDS}s:\n{self.log_text()[-3000:]}")
        self.processes = [psutil.Process(self.launcher.pid)] + psutil.Process(self.launcher.pid).children(recursive=True)

    def rank(self, rank: int) -> psutil.Process:
        ranks = [p for p in self.processes[1:] if p.environ().get("RANK") == str(rank)]
        assert len(ranks) == 1, [p.cmdline() for p in self.processes]
        return ranks[0]

    def alive(self) -> list[psutil.Process]:
        alive = []
        for process in self.processes:
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except psutil.NoSuchProcess:
                pass
        return alive

    def wait_all_gone(self, seconds: float) -> list[psutil.Process]:
        deadline = time.monotonic() + seconds
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.launcher.poll()  # reap the launcher, so it does not linger as a zombie
        return self.alive()

    def stop(self) -> None:
        """Kill whatever is left (the tests' own safety net, not what is being tested)."""
        if self.launcher.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.launcher.pid, signal.SIGKILL)
        for process in self.alive():
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        self.launcher.wait(timeout=30)
        self.log.close()

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")


def test_tensor_parallel_flags_and_environment():
    from tpu_demo.launch.config import parse_config

    config = parse_config(["--tensor-parallel", "--tp-timeout", "5"], environ={})
    assert config.tensor_parallel and config.tp_timeout == 5.0
    config = parse_config([], environ={"TPU_DEMO_TENSOR_PARALLEL": "1", "TPU_DEMO_TP_TIMEOUT": "7.5"})
    assert config.tensor_parallel and config.tp_timeout == 7.5
    assert not parse_config([], environ={}).tensor_parallel and parse_config([], environ={}).tp_timeout == 60.0


def _built(cache_dir: Path) -> None:
    """Build the tiny models here first, so no rank writes them while another reads."""
    from tpu_demo.models.tiny_models import ensure_tiny_pipeline

    for name in ("tiny-flux2", "tiny-flux"):
        ensure_tiny_pipeline(name, cache_dir / "models" / name)


@pytest.fixture(scope="module")
def tp_server(cache_dir, tmp_path_factory):
    _built(cache_dir)
    server = TensorParallelServer(cache_dir, tmp_path_factory.mktemp("tp") / "serve.log",
                                  "--models", "tiny-flux2,tiny-flux,tiny-shapes", "--preview-seconds", "0")
    try:
        server.wait_until_serving()
        yield server
    finally:
        server.stop()


def _wait_for_denoising(job, seconds: float = 60) -> None:
    """Until the server reports step progress: the request is mid-run on every rank."""
    deadline = time.monotonic() + seconds
    while job.status().code.name != "PROGRESS":
        assert time.monotonic() < deadline and not job.done(), job.status()
        time.sleep(0.05)


def _single_process_pixels(make_engine, **fields) -> np.ndarray:
    from tpu_demo.core.events import ImageResult
    from tpu_demo.core.request import validate_request

    engine = make_engine()
    request = validate_request(request_fields(**fields))
    return np.asarray([e for e in engine.generate(request) if isinstance(e, ImageResult)][0].image, dtype=np.int16)


def _tp_pixels(client: Client, **fields) -> np.ndarray:
    gallery, _ = client.predict(**request_fields(**fields), api_name="/generate")
    return np.asarray(Image.open(gallery[0]["image"]), dtype=np.int16)


# upsample on: FLUX.2's text encoder writes the prompt on every rank in lockstep, seeded alike
@pytest.mark.parametrize("model, guidance, upsample", [("tiny-flux2", 4.0, False), ("tiny-flux2", 4.0, True),
                                                       ("tiny-flux", 0.0, False)])
def test_tensor_parallel_image_matches_single_process(tp_server, make_engine, model, guidance, upsample):
    fields = dict(model=model, guidance_scale=guidance, seed=11, upsample_prompt=upsample)
    tp = _tp_pixels(Client(tp_server.url, verbose=False), **fields)
    single = _single_process_pixels(make_engine, **fields)
    assert tp.shape == single.shape == (64, 64, 3)
    assert np.abs(tp - single).max() <= 1  # same float image up to rounding into uint8
    assert tp.std() > 5  # a real picture, not a blank both sides agree on


def test_previews_stream_from_rank_zero_without_changing_the_image(tp_server, make_engine):
    """The preview stream (projection on the device, copy picked up when landed) works on a sharded run."""
    client = Client(tp_server.url, verbose=False)
    fields = dict(model="tiny-flux", num_inference_steps=6, seed=21, previews=True)
    job = client.submit(**request_fields(**fields), api_name="/generate")
    captions = [preview_caption(preview) for _, preview in job if preview]
    assert [caption.split("step ")[1] for caption in captions] == ["1/6", "2/6", "3/6", "4/6", "5/6"]
    (final,), _ = job.outputs()[-1]
    tp = np.asarray(Image.open(final["image"]), dtype=np.int16)
    assert np.abs(tp - _single_process_pixels(make_engine, **{**fields, "previews": False})).max() <= 1


def test_a_style_is_refused_under_tensor_parallel_and_the_server_keeps_serving(tp_server):
    """tiny-shapes offers styles, but not sharded (docs/models.md): the API names the placement and
    the way out, and the next request is served."""
    from gradio_client.exceptions import AppError

    client = Client(tp_server.url, verbose=False)
    styled = request_fields(model="tiny-shapes", prompt="a large red circle in the center on a white background",
                            guidance_scale=3.0, style="outline", style_scale=1.0)
    with pytest.raises(AppError, match="not available for tiny-shapes under the tensor-parallel placement"):
        client.predict(**styled, api_name="/generate")
    assert _tp_pixels(client, **{**styled, "style": "None"}).std() > 5


def test_consecutive_requests_with_different_buckets(tp_server):
    client = Client(tp_server.url, verbose=False)
    first = _tp_pixels(client, model="tiny-flux2", guidance_scale=4.0, resolution="64x64")
    second = _tp_pixels(client, model="tiny-flux2", guidance_scale=4.0, resolution="96x64")
    assert first.shape == (64, 64, 3) and second.shape == (64, 96, 3)


def test_compare_modes_runs_on_every_rank(tp_server, make_engine):
    """Compare modes under tensor parallelism: three modes (compiled included) match the single process."""
    client = Client(tp_server.url, verbose=False)
    gallery, _, figures = client.predict("a red circle on a white background", "", "tiny-flux", "64x64", 2, 0.0, 5,
                                         api_name="/compare_modes")
    assert [m["mode"] for m in figures["modes"]] == ["eager", "eager-fused", "compiled"]
    single = _single_process_pixels(make_engine, model="tiny-flux", seed=5)
    for item in gallery:
        assert np.abs(np.asarray(Image.open(item["image"]), dtype=np.int16) - single).max() <= 2


def test_stop_reaches_every_rank(tp_server, make_engine):
    """Stop mid-request, then the next request still matches: every rank skipped the same steps."""
    client = Client(tp_server.url, verbose=False)
    job = client.submit(**request_fields(model="tiny-flux", num_inference_steps=50, num_images=4),
                        api_name="/generate")
    _wait_for_denoising(job)
    started = time.monotonic()
    client.predict(api_name="/stop")
    while not job.done() and time.monotonic() - started < 30:
        time.sleep(0.1)
    assert job.done(), "the stopped request did not end"
    assert all(len(gallery or []) < 4 for gallery, _ in job.outputs())  # stopped before all four images
    after = _tp_pixels(client, model="tiny-flux", seed=3)
    assert np.abs(after - _single_process_pixels(make_engine, model="tiny-flux", seed=3)).max() <= 1


def test_stuck_follower_times_out_then_requests_are_refused(tp_server):
    """Next to last on the module's server: a follower that stops answering fails the group."""
    client = Client(tp_server.url, verbose=False)
    _tp_pixels(client, model="tiny-flux")  # this shape's step time is known
    job = client.submit(**request_fields(model="tiny-flux", num_inference_steps=50, num_images=4),
                        api_name="/generate")
    _wait_for_denoising(job)
    follower = tp_server.rank(1)
    follower.suspend()  # SIGSTOP: alive but silent, so only a timeout can tell
    try:
        stuck_at = time.monotonic()
        with pytest.raises(Exception) as failure:  # noqa: B017 - the gradio_client error type varies
            job.result(timeout=TP_TIMEOUT_SECONDS + 30)
        assert TP_TIMEOUT_SECONDS - 1 < time.monotonic() - stuck_at < TP_TIMEOUT_SECONDS + 30
        assert "Tensor-parallel serving stopped" in str(failure.value), str(failure.value)
        refused_at = time.monotonic()
        with pytest.raises(Exception) as refusal:  # noqa: B017
            _tp_pixels(client, model="tiny-flux", seed=1)
        assert "no longer accepts requests" in str(refusal.value)
        assert time.monotonic() - refused_at < 5  # refused at once, not after another timeout
    finally:
        follower.resume()


def test_sigterm_on_launcher_stops_every_rank(tp_server):
    """Last test of the module: SIGTERM to the launcher (what Ctrl-C does) stops all ranks."""
    # the stuck-follower test before this one failed the group, so a rank may already be leaving
    assert tp_server.launcher.poll() is None and len(tp_server.alive()) >= 2
    tp_server.launcher.send_signal(signal.SIGTERM)
    left = tp_server.wait_all_gone(45)
    assert not left, [p.cmdline() for p in left]


def test_killed_follower_gives_a_clear_error_in_bounded_time(cache_dir, tmp_path):
    _built(cache_dir)
    server = TensorParallelServer(cache_dir, tmp_path / "serve.log", "--models", "tiny-flux")
    try:
        server.wait_until_serving()
        client = Client(server.url, verbose=False)
        _tp_pixels(client, model="tiny-flux")  # loaded and in lockstep
        job = client.submit(**request_fields(model="tiny-flux", num_inference_steps=50, num_images=4),
                            api_name="/generate")
        _wait_for_denoising(job)
        server.rank(1).kill()  # SIGKILL: the follower is gone mid-run
        killed_at = time.monotonic()
        with pytest.raises(Exception) as failure:  # noqa: B017 - the gradio_client error type varies
            job.result(timeout=TP_TIMEOUT_SECONDS + 30)
        assert time.monotonic() - killed_at < TP_TIMEOUT_SECONDS + 30
        assert "Tensor-parallel serving stopped" in str(failure.value), str(failure.value)
        left = server.wait_all_gone(45)  # torchrun stops the group: nothing is left behind
        assert not left, [p.cmdline() for p in left]
        assert server.launcher.returncode != 0
    finally:
        server.stop()


def test_float_output_matches_single_process(cache_dir, tmp_path):
    """Both ranks' float images (output_type="np") equal the single-process one within 1e-4."""
    import torch

    from tpu_demo.core.catalog import get_spec
    from tpu_demo.device import detect_device
    from tpu_demo.models.loading import load_pipeline

    sys.path.insert(0, str(REPO / "tests" / "helpers"))
    from tp_float_output import FLOAT_CALL

    _built(cache_dir)
    models = ["tiny-flux2", "tiny-flux"]
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "tests/helpers/tp_float_output.py", str(cache_dir / "models"), str(tmp_path), *models],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    for model_id in models:
        spec = get_spec(model_id)
        pipeline = load_pipeline(spec, detect_device("cpu"), cache_dir / "models")
        with torch.inference_mode():
            single = pipeline(**FLOAT_CALL, **spec.pipeline_kwargs(spec.default_guidance),
                              generator=torch.Generator("cpu").manual_seed(7)).images[0]
        for rank in (0, 1):
            tp = np.load(tmp_path / f"{model_id}.rank{rank}.npy")
            assert tp.shape == single.shape
            assert np.abs(tp - single).max() <= 1e-4, (model_id, rank)
        sharded = (tmp_path / f"{model_id}.sharded.txt").read_text().split()
        assert "transformer" in sharded
        assert ("text_encoder" in sharded) == (model_id == "tiny-flux2")  # Mistral3 has a TP plan, CLIP/T5 not
