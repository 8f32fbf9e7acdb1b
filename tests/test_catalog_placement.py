"""Catalog, placement strategies and model switching, on the tiny stand-ins of the real models."""

import gc
import weakref

import psutil
import pytest
from gradio_client import Client

from tpu_demo.core.catalog import CATALOG, CatalogError, ModelSpec, Placement, REAL_MODEL_IDS, TINY_MODEL_IDS
from tpu_demo.device import DeviceInfo
from tpu_demo.core.events import ImageResult
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.models.placement import choose_placement
from tpu_demo.core.request import validate_request

from conftest import request_fields

GB = 1_000_000_000


def test_catalog_holds_the_source_document_models():
    schnell, sd35, flux2 = CATALOG["flux.1-schnell"], CATALOG["sd3.5-medium"], CATALOG["flux.2-dev"]
    assert (schnell.source, schnell.default_steps, schnell.default_guidance, schnell.guidance_fixed) == (
        "black-forest-labs/FLUX.1-schnell", 4, 0.0, True)
    assert (sd35.source, sd35.default_steps, sd35.default_guidance) == ("stabilityai/stable-diffusion-3.5-medium", 40, 4.5)
    assert (flux2.source, flux2.default_steps, flux2.placements) == ("black-forest-labs/FLUX.2-dev", 28,
                                                                     (Placement.TENSOR_PARALLEL, Placement.RESIDENT))
    assert all(CATALOG[m].accelerator_dtype == "bfloat16" for m in REAL_MODEL_IDS)
    assert set(TINY_MODEL_IDS) >= {"tiny-flux", "tiny-sd3", "tiny-flux2"}


def test_automatic_placement_matches_the_source_document_on_a_v6e():
    v6e = DeviceInfo(kind="tpu", count=1, name="TPU v6e", memory_bytes_per_device=32 * 1024**3)
    assert choose_placement(CATALOG["sd3.5-medium"], v6e) is Placement.WHOLE  # ~16 GB fits one chip
    # 34 GB: the seed offloads; the transformer and VAE (24 GB) fit, so they stay resident
    assert choose_placement(CATALOG["flux.1-schnell"], v6e) is Placement.RESIDENT
    assert choose_placement(CATALOG["flux.1-schnell"], v6e, override=Placement.OFFLOAD) is Placement.OFFLOAD
    assert choose_placement(CATALOG["flux.2-dev"], v6e) is Placement.TENSOR_PARALLEL  # 112 GB: shard
    v7 = DeviceInfo(kind="tpu", count=1, name="TPU v7", memory_bytes_per_device=96 * 1024**3)
    assert choose_placement(CATALOG["flux.1-schnell"], v7) is Placement.WHOLE


def test_catalog_validation_names_the_entry_and_field():
    good = CATALOG["tiny-flux"]
    from dataclasses import replace

    for bad, words in [
        (replace(good, id="x1", pipeline_class="NoSuchPipeline"), ["x1", "pipeline_class"]),
        (replace(good, id="x2", default_steps=99), ["x2", "steps"]),
        (replace(good, id="x3", buckets=()), ["x3", "buckets is empty"]),
        (replace(good, id="x4", placements=()), ["x4", "placements is empty"]),
        (replace(good, id="x5", source="not a repo"), ["x5", "source"]),
        (replace(good, id="x6", guidance_range=(1.0, 2.0), default_guidance=5.0), ["x6", "default_guidance"]),
    ]:
        with pytest.raises(CatalogError) as error:
            bad.validate()
        assert all(word in str(error.value) for word in words), str(error.value)


COMBINATIONS = [(model, placement) for model in ("tiny-flux", "tiny-sd3", "tiny-flux2")
                for placement in (Placement.WHOLE, Placement.OFFLOAD)]


@pytest.mark.parametrize("model, placement", COMBINATIONS, ids=[f"{m}-{p.value}" for m, p in COMBINATIONS])
def test_every_valid_combination_generates(make_engine, model, placement):
    engine = make_engine(placement_override=placement)
    for mode in ("eager", "compiled"):
        request = validate_request(request_fields(model=model, mode=mode, resolution="96x64",
                                                  guidance_scale=CATALOG[model].default_guidance))
        results = [e for e in engine.generate(request) if isinstance(e, ImageResult)]
        assert [r.image.size for r in results] == [(96, 64)], (model, placement, mode)
    assert engine.placement_for(model) is placement
    if placement is Placement.OFFLOAD:
        assert engine.counter.count >= 1  # repeated blocks were compiled under the offload hooks
        assert "only while it runs" in engine.placement_description(model)


def test_switching_models_frees_the_previous_one(make_engine):
    engine = make_engine()
    process = psutil.Process()

    def load(model_id):
        return weakref.ref(engine.load(model_id))

    flux = load("tiny-flux")
    load("tiny-sd3")
    gc.collect()
    assert flux() is None, "the previous pipeline is still alive after a switch"
    assert set(engine.status().models) == {"tiny-sd3"}
    baseline = process.memory_info().rss
    for _ in range(4):
        load("tiny-flux")
        load("tiny-sd3")
    growth = process.memory_info().rss - baseline
    assert growth < 60e6, f"RSS grew by {growth / 1e6:.0f} MB over 8 switches: memory is not released"


def test_memory_budget_keeps_both_models(make_engine):
    engine = make_engine(memory_budget_gb=1.0)
    engine.load("tiny-flux")
    engine.load("tiny-sd3")
    assert set(engine.status().models) == {"tiny-flux", "tiny-sd3"}


def test_unlisted_missing_and_tp_only_models_get_clear_errors(launch_app, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    app, url = launch_app("--no-warmup", "--models", "tiny-flux,flux.1-schnell,flux.2-dev")
    client = Client(url, verbose=False)
    with pytest.raises(Exception) as unlisted:
        client.predict(**request_fields(model="tiny-sd3"), api_name="/generate")
    assert "'tiny-sd3' is not offered here" in str(unlisted.value)
    with pytest.raises(Exception) as missing:
        client.predict(**request_fields(model="flux.1-schnell", resolution="1024x1024", num_inference_steps=4),
                       api_name="/generate")
    # the command huggingface_hub 2.x installs (`hf`), with the catalog's patterns
    assert ("hf download black-forest-labs/FLUX.1-schnell --exclude 'flux1-schnell.safetensors' "
            "--exclude 'ae.safetensors'") in str(missing.value)
    with pytest.raises(Exception) as sharded:
        client.predict(**request_fields(model="flux.2-dev", resolution="1024x1024", num_inference_steps=4),
                       api_name="/generate")
    assert "needs tensor parallelism" in str(sharded.value) and "serve_tp.sh" in str(sharded.value)
    # nothing else is affected: the tiny model still serves
    result, _ = client.predict(**request_fields(previews=False), api_name="/generate")
    assert len(result) == 1


def test_per_model_defaults_in_the_ui(launch_app):
    app, _ = launch_app("--no-warmup", "--models", "tiny-flux,tiny-sd3")
    resolution, steps, guidance, header, details, upsample = app.ui.switch_model("tiny-sd3", "eager")
    assert upsample["visible"] is False  # tiny-sd3 declares no prompt upsampler
    spec = CATALOG["tiny-sd3"]
    assert resolution["value"] == str(spec.buckets[0])
    assert (steps["value"], steps["maximum"]) == (spec.default_steps, spec.max_steps)
    assert guidance["value"] == 4.5 and guidance["interactive"] is True
    *_, header, details, upsample = app.ui.switch_model("tiny-flux", "eager")
    guidance = app.ui.switch_model("tiny-flux", "eager")[2]
    assert guidance["interactive"] is False and guidance["value"] == 0.0  # fixed, shown but not editable
    assert "Placement" in details and "whole on device" in details
