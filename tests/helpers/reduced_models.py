"""The real architectures at reduced depth: every width, head count and text length real, one block.

Built from ``tpu_demo.core.architectures`` (the published configs) with each repeated-block
count set to ``depth``, random weights, the offline character tokenizers with the real maximum
lengths (CLIP 77, T5 256, Mistral 512). Registered as a builtin model ("reduced-<id>") so the
real engine loads it through ``from_pretrained`` like any catalog model.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from tpu_demo.core.architectures import ARCHITECTURES
from tpu_demo.core.buckets import Bucket
from tpu_demo.core.catalog import CATALOG, ModelSpec

#: The largest real bucket and a non-square one, per model.
REAL_BUCKETS = (Bucket(1024, 1024), Bucket(1344, 768))
#: FLUX.2 reads hidden states (10, 20, 30) of a 40-layer Mistral; at depth 1 read layer 1 three times
_EXTRA_CALL_KWARGS = {"flux.2-dev": {"text_encoder_out_layers": (1, 1, 1)}}


def reduced_id(model_id: str) -> str:
    return f"reduced-{model_id}"


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX (oneDNN's ``_is_mkldnn_bf16_supported`` says yes on any AVX512 CPU, and emulates)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def reduced_dtype() -> torch.dtype:
    """bf16, the real models' dtype, where the CPU multiplies it natively (weights half the size, its
    fastest matmuls); float32 where bf16 is emulated (a compiled 1024x1024 warmup took over 10 minutes).
    What these builds test (widths, token counts, bucket shapes, no recompile) does not depend on it."""
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def reduced_spec(model_id: str, depth: int = 1, buckets: tuple[Bucket, ...] = REAL_BUCKETS) -> ModelSpec:
    """The catalog entry of the real model, pointing at the reduced build, in ``reduced_dtype()`` on CPU."""
    real = CATALOG[model_id]
    cpu_dtype = str(reduced_dtype()).removeprefix("torch.")
    return replace(real, id=reduced_id(model_id), source=f"builtin:{reduced_id(model_id)}", cpu_dtype=cpu_dtype,
                   buckets=buckets, component_gb={}, min_steps=1, default_steps=1,
                   call_kwargs={**real.call_kwargs, **_EXTRA_CALL_KWARGS.get(model_id, {})})


#: The VAE narrowed for CI: same latent channels and 8x scale factor, 32 channels per level instead of
#: 128-512. Its decode at 1024x1024 is a fixed ~4 TFLOP conv stack that says nothing about buckets or
#: tokens and takes ten minutes on two shared cores (TPU_DEMO_REAL_VAE=1 keeps the real one).
NARROW_VAE = dict(block_out_channels=(32, 32, 32, 32), layers_per_block=1)


def build_reduced_pipeline(model_id: str, depth: int = 1, narrow_vae: bool = False):
    """The diffusers pipeline of ``model_id`` at ``depth`` blocks per stack, random weights in ``reduced_dtype()``."""
    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler

    from tpu_demo.models.sizing import build_component
    from tpu_demo.models.tiny_models import build_chat_tokenizer, build_clip_tokenizer, build_t5_tokenizer

    architecture = ARCHITECTURES[model_id]
    spec = CATALOG[model_id]
    torch.manual_seed(0)
    components = {}
    for name, component in architecture.components.items():
        if name == "vae" and narrow_vae:
            component = replace(component, config={**component.config, **NARROW_VAE})
        components[name] = build_component(component, depth=depth if component.depth_keys else None, device="cpu",
                                           dtype=reduced_dtype())
    for name, tokens in architecture.text_tokens.items():
        tokenizer_name = name.replace("text_encoder", "tokenizer")
        class_name = architecture.components[name].class_name
        if class_name.startswith("CLIP"):
            components[tokenizer_name] = build_clip_tokenizer(max_length=tokens)
        elif class_name.startswith("T5"):
            components[tokenizer_name] = build_t5_tokenizer(max_length=tokens)
        else:
            components[tokenizer_name] = build_chat_tokenizer()
    shift = dict(shift=1.0 if spec.pipeline_class == "FluxPipeline" else 3.0, use_dynamic_shifting=False)
    components["scheduler"] = FlowMatchEulerDiscreteScheduler(**shift)
    return getattr(diffusers, spec.pipeline_class)(**components)
