"""Style adapters (LoRA) hot-swapped on the warm graph: zero recompiles, same pixels, placements.

Real diffusers pipelines and real adapters: random adapters made here for tiny FLUX with PEFT and
saved in diffusers' LoRA format, as an operator's file would be.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from tpu_demo.core.buckets import Bucket
from tpu_demo.core.catalog import CATALOG, Placement
from tpu_demo.core.errors import EngineError
from tpu_demo.core.events import ImageResult
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.request import RequestError, validate_request
from tpu_demo.core.styles import StyleSpec

from conftest import request_fields

SHAPES = "tiny-shapes"
SHAPE_PROMPT = "a large red square in the center on a white background"


def make_flux_styles(directory: Path, names=("ink", "wash"), rank: int = 4) -> tuple[StyleSpec, ...]:
    """Random LoRA adapters for tiny FLUX's transformer, saved as diffusers' LoRA files (one per name;
    the second adapts a subset of the first's layers at a smaller rank, as real adapters differ)."""
    from diffusers import FluxPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from tpu_demo.models.tiny_models import build_tiny_flux

    styles = []
    for k, name in enumerate(names):
        transformer = build_tiny_flux().transformer
        targets = ["to_q", "to_k", "to_v", "to_out.0"] if k == 0 else ["to_q", "to_v"]
        transformer.add_adapter(LoraConfig(r=rank if k == 0 else rank // 2, lora_alpha=rank, target_modules=targets))
        generator = torch.Generator().manual_seed(100 + k)
        with torch.no_grad():
            for param_name, param in transformer.named_parameters():
                if "lora_" in param_name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
        FluxPipeline.save_lora_weights(directory, transformer_lora_layers=get_peft_model_state_dict(transformer),
                                       weight_name=f"{name}.safetensors")
        styles.append(StyleSpec(name, name.title(), str(directory / f"{name}.safetensors")))
    return tuple(styles)


def styled(fields: dict, style: str = "", scale: float = 1.0):
    """A validated request (catalog model), then given a style the test's engine serves."""
    return replace(validate_request(fields), style=style, style_scale=scale)


def image(engine, request) -> np.ndarray:
    """The first image of ``request``, all of its images having arrived."""
    results = [e for e in engine.generate(request) if isinstance(e, ImageResult)]
    assert len(results) == request.num_images
    return np.asarray(results[0].image)


#: the styled models: tiny-shapes with its trained styles (catalog), tiny FLUX with adapters made here
#: (different ranks and layers, as an operator's files may be)
STYLED_MODELS = ["tiny-flux"]


@pytest.fixture
def styled_engine(make_engine, tmp_path):
    """An engine serving ``model`` with its styles; returns (engine, style names, request maker)."""

    def make(model: str, **config):
        overrides = {} if CATALOG[model].styles else {model: make_flux_styles(tmp_path)}
        engine = make_engine(offered_models=(model,), style_overrides=overrides, **config)
        names = [style.name for style in engine.spec(model).styles]
        fields = (dict(prompt=SHAPE_PROMPT, model=SHAPES, guidance_scale=3.0) if model == SHAPES
                  else dict(model=model))

        def request(style: str = "", scale: float = 1.0, **overrides):
            return styled(request_fields(**{"mode": "compiled", "num_inference_steps": 4, "seed": 1, **fields,
                                            **overrides}), style, scale)

        return engine, names, request

    return make


@pytest.mark.parametrize("model", STYLED_MODELS)
def test_switching_styles_and_scales_compiles_nothing_on_any_bucket(styled_engine, model):
    engine, (first, second), request = styled_engine(model)
    buckets = engine.spec(model).buckets
    engine.warmup(model, ExecutionMode.COMPILED)
    after_warmup = engine.counter.count
    assert after_warmup > 0
    sequence = [(first, 1.0), ("", 1.0), (second, 1.0), (first, 0.5), (second, 1.5), ("", 0.0)]
    seen = {}
    for bucket in buckets:
        for style, scale in sequence:
            results = [e for e in engine.generate(request(style, scale, resolution=str(bucket)))
                       if isinstance(e, ImageResult)]
            assert results[0].warm and results[0].timings["compiles"] == 0
            seen[(str(bucket), style, scale)] = np.asarray(results[0].image)
    assert engine.counter.count == after_warmup  # every bucket, every style, every scale: 0 graphs compiled
    assert engine.pool.get(model).styles.swaps >= len(buckets) * len(sequence) - 1
    # the styles do change the image (else "no recompile" would prove nothing)
    plain, styled_image = seen[("64x64", "", 1.0)], seen[("64x64", first, 1.0)]
    assert np.abs(plain.astype(int) - styled_image.astype(int)).max() > 30


@pytest.mark.parametrize("model", STYLED_MODELS)
def test_same_pixels_whatever_came_before(styled_engine, model):
    one_bucket = {model: (Bucket(64, 64),)}
    engine, (first, second), request = styled_engine(model, bucket_overrides=one_bucket)
    none_before = image(engine, request())
    first_alone = image(engine, request(first))
    image(engine, request(second))
    first_again = image(engine, request(first))
    none_after = image(engine, request())
    assert np.array_equal(first_alone, first_again)  # A after B after A equals A
    assert np.array_equal(none_before, none_after)  # None after A equals None before any style
    assert not np.array_equal(none_before, first_alone)
    # A alone, in an engine that never held another style
    fresh, _, fresh_request = styled_engine(model, bucket_overrides=one_bucket)
    assert np.array_equal(image(fresh, fresh_request(first)), first_alone)


@pytest.mark.parametrize("placement", [Placement.RESIDENT, Placement.OFFLOAD])
def test_resident_and_offload_swap_without_recompiling(make_engine, tmp_path, placement, monkeypatch):
    """Offload needs an accelerator: it runs on the torch-tpu stand-in (the host as a TPU v6e; compiled
    mode then compiles the repeated blocks with the "tpu" backend, run by aot_eager and counted)."""
    if placement is Placement.OFFLOAD:
        from tpu_standin import TpuStandIn

        TpuStandIn(chips=1, name="TPU v6e", hbm_bytes=32 * 10**9).install(monkeypatch)
    styles = make_flux_styles(tmp_path)
    engine = make_engine(offered_models=("tiny-flux",), placement_override=placement,
                         bucket_overrides={"tiny-flux": (Bucket(64, 64),)}, style_overrides={"tiny-flux": styles})
    fields = request_fields(mode="compiled")
    base = image(engine, styled(fields))
    compiled_after_first = engine.counter.count
    ink = image(engine, styled(fields, "ink"))
    wash = image(engine, styled(fields, "wash", 0.7))
    ink_again = image(engine, styled(fields, "ink"))
    assert np.array_equal(image(engine, styled(fields)), base)
    assert engine.counter.count == compiled_after_first
    assert np.array_equal(ink, ink_again) and not np.array_equal(ink, base) and not np.array_equal(wash, ink)


def test_an_adapter_of_other_layers_is_refused_at_load(make_engine, tmp_path):
    first = make_flux_styles(tmp_path / "a", names=("narrow",))[0]  # to_q, to_k, to_v, to_out.0
    from diffusers import FluxPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from tpu_demo.models.tiny_models import build_tiny_flux

    transformer = build_tiny_flux().transformer
    transformer.add_adapter(LoraConfig(r=2, target_modules=["ff.net.2"]))
    FluxPipeline.save_lora_weights(tmp_path, transformer_lora_layers=get_peft_model_state_dict(transformer),
                                   weight_name="other.safetensors")
    other = StyleSpec("other", "Other", str(tmp_path / "other.safetensors"))
    engine = make_engine(offered_models=("tiny-flux",), style_overrides={"tiny-flux": (first, other)})
    with pytest.raises(EngineError, match="adapts layers that style"):
        image(engine, styled(request_fields(), "other"))
