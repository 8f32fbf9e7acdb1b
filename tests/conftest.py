"""Shared fixtures: tiny models built once, engines, and a real app on a free loopback port."""

import os

# Before torch is imported: skip torch-tpu's autoload (no chips here; saves ~4 s per process)
# and keep every library off the network.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("PYTHONWARNINGS", "ignore:<TorchTpu/Performance/TcMalloc/")
# Every app process a test starts (``--threads``' environment twin): two pytest workers share the 2
# cores, so an app on torch's default of one thread per core would fight the other worker's tests
# for them (measured: the suite's slowest tests ran a third longer)
os.environ.setdefault("TPU_DEMO_THREADS", "1")

import json  # noqa: E402
import logging  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import tpu_demo  # noqa: E402,F401 - applies the offline environment defaults
import app_runner  # noqa: E402
import quick_tier  # noqa: E402
from app_runner import free_port, free_ports, stop_app  # noqa: E402,F401 - tests import them from here

torch.set_num_threads(1)  # tiny models run fastest on one thread; keeps the other core for servers
# autograd starts its device threads at a process's first backward, asking every registered backend how many
# devices it has; torch-tpu, once a test has loaded it on a host without a TPU, waits for ever on the TPU
# metadata server there. One backward now, before any test can load it, so the in-process training runs
# (tests/support.py: run_script_main) never ask.
torch.ones(1, requires_grad=True).sum().backward()


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config, items):
    """Mark the quick tier's tests (tests/quick_tier.py) ``quick``."""
    for item in items:
        if quick_tier.selects(item.nodeid):
            item.add_marker(pytest.mark.quick)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tpu-demo-cache")


@pytest.fixture(scope="session")
def models_dir(cache_dir) -> Path:
    return cache_dir / "models"


@pytest.fixture
def make_engine(models_dir):
    """Build engines on this machine's device; closed after the test."""
    from tpu_demo.device import detect_device
    from tpu_demo.engine.engine import Engine, EngineConfig

    engines = []

    def make(**overrides):
        # batch 1 unless a test asks (the product default, each model's catalog max_batch, triples every
        # warmup; tests/test_batching.py runs it)
        config = EngineConfig(**{"models_dir": models_dir, "cpu_compile_backend": "aot_eager", "max_batch": 1,
                                 **overrides})
        engine = Engine(config, detect_device())
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def start_app(cache_dir: Path, *flags: str):
    """The real app with the test suite's cache and the fast compile backend; returns (app, url). Batch 1
    unless the test's flags say otherwise (a later flag wins): the default, ``--max-batch auto``, warms
    every bucket at 1, 2 and 4, three times the suite's warmups; tests/test_batching.py runs it."""
    return app_runner.start_app("--cache-dir", str(cache_dir), "--compile-backend", "aot_eager", "--max-batch", "1",
                                *flags)


@pytest.fixture
def launch_app(cache_dir):
    """Start the real app from flags, as many as the test needs; each is closed after the test."""
    apps = []

    def start(*flags: str):
        app, url = start_app(cache_dir, *flags)
        apps.append(app)
        return app, url

    yield start
    for app in apps:
        stop_app(app)


@pytest.fixture(scope="module")
def served_app(cache_dir):
    """One app with default limits (no warmup) for a module's tests; each test leaves it as it found it."""
    app, url = start_app(cache_dir, "--no-warmup")
    yield app, url
    stop_app(app)


@pytest.fixture
def request_log(caplog):
    """The JSON lines the app wrote to the ``tpu_demo.requests`` logger during the test."""
    caplog.set_level(logging.INFO, logger="tpu_demo.requests")

    def lines():
        return [json.loads(r.getMessage()) for r in caplog.records if r.name == "tpu_demo.requests"]

    return lines


def engine_images(engine, **fields) -> list:
    """The ImageResult events of one validated request (``request_fields`` plus ``fields``)."""
    from tpu_demo.core.events import ImageResult
    from tpu_demo.core.request import validate_request

    request = validate_request(request_fields(**fields))
    return [event for event in engine.generate(request) if isinstance(event, ImageResult)]


def request_fields(**overrides):
    """A valid /generate request for the tiny FLUX model; override any field."""
    fields = dict(prompt="a red circle on a white background", model="tiny-flux", mode="eager",
                  resolution="64x64", num_inference_steps=2, guidance_scale=0.0, seed=7, num_images=1)
    fields.update(overrides)
    return fields
