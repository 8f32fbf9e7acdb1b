"""Real resolutions and real token counts on CPU: the real architectures at reduced depth.

Every transformer and text-encoder width, head count and text length is the published one
(tests/helpers/reduced_models.py); only the number of repeated blocks is 1, and the VAE is narrowed
(same latent channels and scale factor; ``TPU_DEMO_REAL_VAE=1`` keeps the real one) because its
1024x1024 decode alone takes ten minutes here. Each model runs through the real engine in every
placement it supports, compiled (full compile when whole or resident, ``compile_repeated_blocks``
under offload, its buckets warmed first), with previews on, at its largest bucket (1024x1024:
4096 image tokens) and a non-square one (1344x768: 4032): the image has the bucket's size,
the requests compile nothing after warmup, and the previews have the real latent grid.

SD3.5 Medium (the lightest per token) whole on one chip, the source document's case, runs in every full run
at 1024x1024 (float32 where the CPU would emulate bf16; tiny models cover non-square buckets in every run);
its non-square bucket and its other placements (tiny models cover every placement), FLUX.1-schnell (every
placement, and tensor parallel over 2 gloo ranks) and FLUX.2-dev (width 6144, a 5120-wide Mistral: ~8 GB of bf16 weights at depth 1) run with ``TPU_DEMO_RUN_SLOW=1``.
"""

import os
import sys
import time
from pathlib import Path

import pytest

from conftest import request_fields

sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))
from reduced_models import REAL_BUCKETS, build_reduced_pipeline, reduced_id, reduced_spec  # noqa: E402

from tpu_demo.core.catalog import Placement  # noqa: E402

RUN_SLOW = os.environ.get("TPU_DEMO_RUN_SLOW") == "1"
slow = pytest.mark.skipif(not RUN_SLOW, reason="minutes per request on CPU: set TPU_DEMO_RUN_SLOW=1")

#: latent grid per pixel: FLUX packs 2x2 patches of an 8x VAE (16 px a token); SD3's grid is the VAE's (8 px)
PIXELS_PER_LATENT = {"flux.1-schnell": 16, "flux.2-dev": 16, "sd3.5-medium": 8}

#: SD3.5 whole on one chip runs everywhere (bf16 where the CPU has it natively, else float32:
#: reduced_models.reduced_dtype); its other placements compile the same shapes again (1.5 min each on
#: 2 cores), so they run with TPU_DEMO_RUN_SLOW=1, like the FLUX models.
CASES = [pytest.param("sd3.5-medium", Placement.WHOLE, id="sd3.5-medium-whole")]
CASES += [pytest.param(model, placement, id=f"{model}-{placement.value}", marks=slow)
          for model, placements in (("sd3.5-medium", (Placement.RESIDENT, Placement.OFFLOAD)),
                                    ("flux.1-schnell", (Placement.WHOLE, Placement.RESIDENT, Placement.OFFLOAD)),
                                    ("flux.2-dev", (Placement.RESIDENT,)))
          for placement in placements]


@pytest.fixture
def reduced_catalog(monkeypatch):
    """Register the reduced build of a real model as a catalog model for this test."""
    from types import MappingProxyType

    from tpu_demo.core import catalog
    from tpu_demo.models import tiny_models

    def register(model_id: str, buckets=REAL_BUCKETS):
        spec = reduced_spec(model_id, buckets=buckets)
        # the VAE is narrowed (see reduced_models.NARROW_VAE) unless TPU_DEMO_REAL_VAE=1
        narrow = os.environ.get("TPU_DEMO_REAL_VAE") != "1"
        monkeypatch.setitem(tiny_models.BUILDERS, reduced_id(model_id),
                            lambda: build_reduced_pipeline(model_id, narrow_vae=narrow))
        monkeypatch.setattr(catalog, "CATALOG", MappingProxyType({**catalog.CATALOG, spec.id: spec}))
        return spec

    return register


@pytest.mark.parametrize("model_id, placement", CASES)
def test_real_widths_at_real_buckets(model_id, placement, reduced_catalog, make_engine, record_property):
    from tpu_demo.core.events import ImageResult, StepProgress
    from tpu_demo.core.modes import ExecutionMode
    from tpu_demo.core.request import RequestLimits, validate_request

    # every full run: the largest bucket (a non-square one compiles and runs it all again: ~1.5 min here)
    buckets = REAL_BUCKETS if RUN_SLOW else REAL_BUCKETS[:1]
    spec = reduced_catalog(model_id, buckets)
    engine = make_engine(placement_override=placement, offered_models=(spec.id,), warmup_steps=1)
    started = time.perf_counter()
    statuses = engine.warmup(spec.id, ExecutionMode.COMPILED)
    assert [s.state.value for s in statuses] == ["warm"] * len(buckets), [s.error for s in statuses]
    warmup_seconds = time.perf_counter() - started
    compiles = engine.counter.count
    assert compiles >= len(buckets)  # a graph per bucket (per block under offload)

    limits = RequestLimits(offered_models=(spec.id,))
    for bucket in buckets:
        fields = request_fields(model=spec.id, mode="compiled", resolution=str(bucket), num_inference_steps=2,
                                guidance_scale=spec.default_guidance, previews=True,
                                prompt="a lighthouse on a cliff at sunset, oil painting")
        started = time.perf_counter()
        events = list(engine.generate(validate_request(fields, limits)))
        seconds = time.perf_counter() - started
        [image] = [e for e in events if isinstance(e, ImageResult)]
        assert image.image.size == (bucket.width, bucket.height)
        assert image.warm and image.timings["compiles"] == 0  # warmed: no recompile
        previews = [e.preview.render() for e in events if isinstance(e, StepProgress) and e.preview is not None]
        assert previews, "previews were on"
        cell = PIXELS_PER_LATENT[model_id]
        assert {p.size for p in previews} == {(bucket.width // cell, bucket.height // cell)}
        record_property(f"{bucket}_seconds", round(seconds, 1))
        print(f"{model_id} {placement.value} {bucket}: {seconds:.1f} s for 2 steps + decode", file=sys.stderr)
    assert engine.counter.count == compiles
    assert engine.pool.get(spec.id).placement is placement
    record_property("warmup_seconds", round(warmup_seconds, 1))


@slow
@pytest.mark.parametrize("model_id", ["flux.1-schnell"])
def test_tensor_parallel_over_two_gloo_ranks_at_real_buckets(model_id, cache_dir, tmp_path):
    """FLUX.1-schnell at real widths, sharded over 2 torchrun ranks (gloo), compiled: the image has the
    bucket's size, a repeat at a bucket compiles nothing, the latents are the real token grid."""
    import json
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    report_file = tmp_path / "report.json"
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "tests/helpers/tp_real_resolution.py", str(cache_dir / "models"), str(report_file), model_id],
        cwd=repo, env=env, capture_output=True, text=True, timeout=3600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(report_file.read_text())
    for call in report:
        width, height = (int(v) for v in call["bucket"].split("x"))
        assert call["size"] == [width, height]
        tokens = (width // 16) * (height // 16)
        assert all(shape[1] == tokens for shape in call["latents"])  # packed: (batch, tokens, channels)
        if call["repeat"] == 1:
            assert call["compiles"] == 0, call
    print(json.dumps(report), file=sys.stderr)
