"""Tiny random-weight pipelines of the real architectures, built offline from configs.

No weights can be downloaded here (CI, laptops, this sandbox), so the embedded default and the
tests use pipelines of the same classes as FLUX.1, SD3.5 and FLUX.2, shrunk to a few hundred
kilobytes, saved with ``save_pretrained`` and loaded back through the real ``from_pretrained``
path. Building is deterministic: the same seed writes the same weights.
"""

from __future__ import annotations

import json
import os
import shutil
import string
from pathlib import Path
from typing import Callable

import torch

#: Characters the tiny tokenizers know; anything else maps to the unknown token.
_ALPHABET = string.ascii_lowercase + string.ascii_uppercase + string.digits + " .,;:!?'\"-()/&+#%*=<>@_"


def build_clip_tokenizer(max_length: int = 77):
    """A character-level CLIP BPE tokenizer (no merges): every character is one token."""
    from transformers import CLIPTokenizer

    vocab: dict[str, int] = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for char in _ALPHABET.lower().replace(" ", ""):
        for piece in (char, char + "</w>"):
            vocab.setdefault(piece, len(vocab))
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[], pad_token="<|endoftext|>")
    tokenizer.model_max_length = max_length
    return tokenizer


def build_t5_tokenizer(words: tuple[str, ...] = (), max_length: int = 256):
    """A Unigram T5 tokenizer over single characters, plus whole ``words`` when given."""
    from transformers import T5Tokenizer

    pieces: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(char, -5.0) for char in _ALPHABET if char != " "]
    pieces += [("\u2581" + char, -4.0) for char in _ALPHABET if char != " "]
    pieces += [("\u2581" + word, -1.0) for word in words]
    tokenizer = T5Tokenizer(vocab=pieces, extra_ids=0)
    tokenizer.model_max_length = max_length
    return tokenizer


_CHAT_TEMPLATE = (
    "{%- for message in messages -%}{%- if message['role'] == 'user' -%}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}{%- if part['type'] == 'text' -%}"
    "{{ part['text'] }}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endif -%}{%- endfor -%}"
)


def build_chat_tokenizer():
    """A byte-level Qwen2 BPE tokenizer with a chat template that renders only user text.

    The Flux2 pipeline calls only ``tokenizer.apply_chat_template``; leaving the long system
    message out keeps the user's prompt inside a short ``max_sequence_length``.
    """
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import Qwen2Tokenizer

    vocab = {"<|endoftext|>": 0}
    for char in sorted(ByteLevel.alphabet()):
        vocab.setdefault(char, len(vocab))
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = _CHAT_TEMPLATE
    return tokenizer


def _tiny_vae_kwargs(latent_channels: int) -> dict:
    """Four blocks, like the real VAEs, so ``vae_scale_factor`` is 8."""
    return dict(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 8, 8),
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=4,
        sample_size=64,
    )


def clip_config(projection: bool):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=32, intermediate_size=37,
        layer_norm_eps=1e-05, num_attention_heads=4, num_hidden_layers=2, vocab_size=256,
        hidden_act="gelu", projection_dim=32, max_position_embeddings=77,
    )


def _t5_encoder(d_model: int):
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=256, d_model=d_model, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )
    return T5EncoderModel(config)


def build_tiny_flux():
    """FluxPipeline (CLIP + T5 + FluxTransformer2DModel + AutoencoderKL), random weights."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8], guidance_embeds=False,
    )
    vae = AutoencoderKL(**_tiny_vae_kwargs(4), use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.0609, scaling_factor=1.5035)
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False),
        vae=vae,
        text_encoder=CLIPTextModel(clip_config(projection=False)),
        tokenizer=build_clip_tokenizer(),
        text_encoder_2=_t5_encoder(d_model=32),
        tokenizer_2=build_t5_tokenizer(),
        transformer=transformer,
    )


def build_tiny_sd3():
    """StableDiffusion3Pipeline (2 CLIP + T5 + SD3Transformer2DModel + AutoencoderKL), random weights."""
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel,
                           StableDiffusion3Pipeline)
    from transformers import CLIPTextModelWithProjection

    transformer = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
        num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=64,
        pooled_projection_dim=64, out_channels=4,
    )
    vae = AutoencoderKL(**_tiny_vae_kwargs(4), use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.0609, scaling_factor=1.5035)
    return StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae,
        text_encoder=CLIPTextModelWithProjection(clip_config(projection=True)),
        tokenizer=build_clip_tokenizer(),
        text_encoder_2=CLIPTextModelWithProjection(clip_config(projection=True)),
        tokenizer_2=build_clip_tokenizer(),
        text_encoder_3=_t5_encoder(d_model=64),
        tokenizer_3=build_t5_tokenizer(),
        transformer=transformer,
    )


def build_tiny_flux2():
    """Flux2Pipeline (Mistral3 text encoder + Flux2Transformer2DModel + AutoencoderKLFlux2), random weights.

    The text encoder has 30 layers because the pipeline reads hidden states (10, 20, 30) by default.
    """
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Pipeline, Flux2Transformer2DModel
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    text_hidden = 16
    transformer = Flux2Transformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=3 * text_hidden, timestep_guidance_channels=256,
        axes_dims_rope=[4, 4, 4, 4],
    )
    config = Mistral3Config(
        text_config={
            "model_type": "mistral", "vocab_size": 300, "hidden_size": text_hidden, "intermediate_size": 32,
            "max_position_embeddings": 512, "num_attention_heads": 4, "num_hidden_layers": 30,
            "num_key_value_heads": 2, "head_dim": 4, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
            "sliding_window": None, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
        },
        vision_config={
            "model_type": "pixtral", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 4,
            "intermediate_size": 32, "image_size": 30, "patch_size": 6, "num_channels": 3,
        },
        bos_token_id=0, eos_token_id=0, pad_token_id=0, image_seq_length=4, vision_feature_layer=-1,
        image_token_index=299,
    )
    vae = AutoencoderKLFlux2(**_tiny_vae_kwargs(4), use_quant_conv=False, use_post_quant_conv=False)
    text_encoder = Mistral3ForConditionalGeneration(config)
    # upsample_prompt asks for up to 512 new tokens, and random weights never say end of text: here any of
    # every 8th token ends a rewrite after at least 8 (~16 tokens, 0.3 s, not 11 s for 512 of noise)
    text_encoder.generation_config.eos_token_id = list(range(0, 296, 8))
    text_encoder.generation_config.min_new_tokens = 8
    return Flux2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=False),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=build_chat_tokenizer(),
        transformer=transformer,
    )


#: Builders of the random-weight stand-ins, by the catalog's ``builder`` name.
BUILDERS: dict[str, Callable[[], object]] = {
    "tiny-flux": build_tiny_flux,
    "tiny-sd3": build_tiny_sd3,
    "tiny-flux2": build_tiny_flux2,
}


def ensure_tiny_pipeline(name: str, directory: Path, seed: int = 0) -> Path:
    """Build and ``save_pretrained`` the named tiny pipeline into ``directory`` unless it is there."""
    directory = Path(directory)
    if (directory / "model_index.json").is_file():
        return directory
    torch.manual_seed(seed)
    pipeline = BUILDERS[name]()
    # per process: engines started together on one host (--chips) share the cache and may build at once
    tmp = directory.with_name(f"{directory.name}.partial-{os.getpid()}")
    pipeline.save_pretrained(tmp, safe_serialization=True)
    (tmp / "tiny_model.json").write_text(json.dumps({"builder": name, "seed": seed}))
    try:
        tmp.replace(directory)
    except OSError:  # another process finished first: same seed, same weights; keep its copy
        if not (directory / "model_index.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return directory
