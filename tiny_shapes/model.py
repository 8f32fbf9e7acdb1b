"""Architecture of the tiny-shapes FluxPipeline (the trained default in ``assets/models/tiny-shapes``).

The same builder makes the untrained (random-weight) baseline of the evaluation. The T5
tokenizer has whole-word pieces for the caption grammar's vocabulary (each word is one token)
and the CLIP tokenizer is character-level; both text encoders start from a seeded random
initialisation and are trained together with the transformer (scripts/train_tiny_model.py).
"""

from __future__ import annotations

import torch

from tiny_shapes.dataset import VOCABULARY
from tpu_demo.models.tiny_models import clip_config, build_clip_tokenizer, build_t5_tokenizer

#: Pipeline call arguments the model was trained for (also written to demo_defaults.json).
MAX_SEQUENCE_LENGTH = 24
#: Characters the CLIP tokenizer keeps: the longest two-shape caption of the grammar is 112, so its
#: pooled vector sees the whole caption (at CLIP's usual 77 it saw only the first object).
CLIP_MAX_LENGTH = 128


def build_vae(block_out_channels=(16, 32, 64), latent_channels: int = 4):
    from diffusers import AutoencoderKL

    n = len(block_out_channels)
    return AutoencoderKL(
        in_channels=3, out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * n, up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=tuple(block_out_channels), layers_per_block=1, latent_channels=latent_channels,
        norm_num_groups=8, sample_size=64, use_quant_conv=False, use_post_quant_conv=False,
        shift_factor=0.0, scaling_factor=1.0,
    )


def build_transformer(latent_channels: int = 4, heads: int = 4, head_dim: int = 32, layers: int = 2,
                      single_layers: int = 2, text_dim: int = 64, pooled_dim: int = 32):
    from diffusers import FluxTransformer2DModel

    k = (3 * head_dim // 8) // 2 * 2  # RoPE axes (index, y, x); each must be even
    rope = [head_dim - 2 * k, k, k]
    return FluxTransformer2DModel(
        patch_size=1, in_channels=4 * latent_channels, num_layers=layers, num_single_layers=single_layers,
        attention_head_dim=head_dim, num_attention_heads=heads, joint_attention_dim=text_dim,
        pooled_projection_dim=pooled_dim, axes_dims_rope=rope, guidance_embeds=False,
    )


def build_text_encoders(text_dim: int = 64):
    from transformers import CLIPTextModel, T5Config, T5EncoderModel

    config = clip_config(projection=False)
    config.max_position_embeddings = CLIP_MAX_LENGTH
    clip = CLIPTextModel(config)
    # 32 relative-position buckets (T5's default) tell apart every distance up to 7 words in each
    # direction, the length of one object's phrase; with 8, distances 2-15 shared one bucket and
    # "top left" could not be told which colour and shape words were its own (two-shape binding).
    t5 = T5EncoderModel(T5Config(
        vocab_size=256, d_model=text_dim, d_kv=16, d_ff=256, num_layers=3, num_heads=4,
        relative_attention_num_buckets=32, relative_attention_max_distance=64,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    ))
    return clip, t5


def build_shapes_pipeline(seed: int = 0, vae_blocks=(16, 32, 64), latent_channels: int = 4, **transformer_kwargs):
    """A random-weight FluxPipeline of the tiny-shapes architecture, deterministic from ``seed``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    torch.manual_seed(seed)
    clip, t5 = build_text_encoders()
    vae = build_vae(vae_blocks, latent_channels)
    transformer = build_transformer(latent_channels, **transformer_kwargs)
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False),
        vae=vae, text_encoder=clip, tokenizer=build_clip_tokenizer(max_length=CLIP_MAX_LENGTH),
        text_encoder_2=t5, tokenizer_2=build_t5_tokenizer(words=VOCABULARY, max_length=MAX_SEQUENCE_LENGTH),
        transformer=transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe
