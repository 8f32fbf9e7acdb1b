"""The real models' architectures as data: each component's class and its published configuration.

Values are the repositories' own ``config.json`` (FLUX.1-schnell, SD3.5 Medium, FLUX.2-dev), as published;
the catalog's ``component_gb`` must equal what ``models/sizing.py`` counts from them on the meta device.
``depth_keys`` name the only fields a reduced-depth test may shrink. Plain data: no torch, no weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class ComponentArchitecture:
    """One pipeline component: ``library`` ("diffusers" or "transformers"), class and config."""

    library: str
    class_name: str
    config: Mapping[str, object]
    #: config fields that count repeated blocks (set to 1 or 2 for reduced-depth runs);
    #: "text_config.num_hidden_layers" reaches into a nested config
    depth_keys: tuple[str, ...] = ()
    #: a transformers configuration class when ``config`` is not the class's own (CLIP text models)
    config_class: str = ""
    #: sharded over the chips under tensor parallelism (diffusers' or transformers' TP plan)
    tensor_parallel: bool = False


@dataclass(frozen=True)
class Architecture:
    """A whole pipeline: its components by pipeline attribute name, and its real text lengths."""

    components: Mapping[str, ComponentArchitecture]
    #: token counts the text encoders produce per prompt (what the transformer attends to)
    text_tokens: Mapping[str, int] = field(default_factory=dict)
    #: text tokens in the transformer's joint sequence (SD3 joins CLIP-L|G along channels, then T5)
    joint_text_tokens: int = 0


_CLIP_L = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
               max_position_embeddings=77, projection_dim=768, hidden_act="quick_gelu")
_CLIP_G = dict(vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
               num_attention_heads=20, max_position_embeddings=77, projection_dim=1280, hidden_act="gelu")
_T5_XXL = dict(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
               relative_attention_num_buckets=32, feed_forward_proj="gated-gelu", is_encoder_decoder=False)
_VAE_16 = dict(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512),
               layers_per_block=2, down_block_types=("DownEncoderBlock2D",) * 4,
               up_block_types=("UpDecoderBlock2D",) * 4, use_quant_conv=False, use_post_quant_conv=False)

_FLUX1_SCHNELL = Architecture(
    components={
        "transformer": ComponentArchitecture(
            "diffusers", "FluxTransformer2DModel",
            dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                 num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=False,
                 axes_dims_rope=(16, 56, 56)),
            depth_keys=("num_layers", "num_single_layers"), tensor_parallel=True),
        "text_encoder": ComponentArchitecture("transformers", "CLIPTextModel", _CLIP_L, ("num_hidden_layers",),
                                              config_class="CLIPTextConfig"),
        "text_encoder_2": ComponentArchitecture("transformers", "T5EncoderModel", _T5_XXL, ("num_layers",)),
        "vae": ComponentArchitecture("diffusers", "AutoencoderKL",
                                     dict(_VAE_16, scaling_factor=0.3611, shift_factor=0.1159)),
    },
    text_tokens={"text_encoder": 77, "text_encoder_2": 256},  # schnell: max_sequence_length 256
    joint_text_tokens=256,  # T5 only; CLIP gives the pooled vector
)

_SD35_MEDIUM = Architecture(
    components={
        "transformer": ComponentArchitecture(
            "diffusers", "SD3Transformer2DModel",
            dict(sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24, attention_head_dim=64,
                 num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536,
                 pooled_projection_dim=2048, pos_embed_max_size=384, qk_norm="rms_norm",
                 dual_attention_layers=tuple(range(13))),
            depth_keys=("num_layers",)),
        "text_encoder": ComponentArchitecture("transformers", "CLIPTextModelWithProjection", _CLIP_L,
                                              ("num_hidden_layers",), config_class="CLIPTextConfig"),
        "text_encoder_2": ComponentArchitecture("transformers", "CLIPTextModelWithProjection", _CLIP_G,
                                                ("num_hidden_layers",), config_class="CLIPTextConfig"),
        "text_encoder_3": ComponentArchitecture("transformers", "T5EncoderModel", _T5_XXL, ("num_layers",)),
        "vae": ComponentArchitecture("diffusers", "AutoencoderKL",
                                     dict(_VAE_16, scaling_factor=1.5305, shift_factor=0.0609)),
    },
    text_tokens={"text_encoder": 77, "text_encoder_2": 77, "text_encoder_3": 256},
    joint_text_tokens=77 + 256,
)

_FLUX2_DEV = Architecture(
    components={
        "transformer": ComponentArchitecture(
            "diffusers", "Flux2Transformer2DModel",
            dict(patch_size=1, in_channels=128, num_layers=8, num_single_layers=48, attention_head_dim=128,
                 num_attention_heads=48, joint_attention_dim=15360, timestep_guidance_channels=256, mlp_ratio=3.0,
                 axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, guidance_embeds=True),
            depth_keys=("num_layers", "num_single_layers"), tensor_parallel=True),
        # Mistral Small 3.1 (24B): the pipeline stacks hidden states 10, 20, 30 -> 3 x 5120 = 15360
        "text_encoder": ComponentArchitecture(
            "transformers", "Mistral3ForConditionalGeneration",
            dict(text_config=dict(model_type="mistral", vocab_size=131072, hidden_size=5120, intermediate_size=32768,
                                  num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                  max_position_embeddings=131072, rms_norm_eps=1e-05, rope_theta=1000000000.0,
                                  sliding_window=None, tie_word_embeddings=False),
                 vision_config=dict(model_type="pixtral", hidden_size=1024, intermediate_size=4096,
                                    num_hidden_layers=24, num_attention_heads=16, head_dim=64, image_size=1540,
                                    patch_size=14, num_channels=3, rope_theta=10000.0),
                 spatial_merge_size=2, multimodal_projector_bias=False, projector_hidden_act="gelu",
                 image_token_index=10, vision_feature_layer=-1, tie_word_embeddings=False),
            depth_keys=("text_config.num_hidden_layers", "vision_config.num_hidden_layers"),
            config_class="Mistral3Config", tensor_parallel=True),
        "vae": ComponentArchitecture(
            "diffusers", "AutoencoderKLFlux2",
            dict(in_channels=3, out_channels=3, latent_channels=32, block_out_channels=(128, 256, 512, 512),
                 layers_per_block=2, down_block_types=("DownEncoderBlock2D",) * 4,
                 up_block_types=("UpDecoderBlock2D",) * 4, use_quant_conv=True, use_post_quant_conv=True)),
    },
    text_tokens={"text_encoder": 512},
    joint_text_tokens=512,
)

#: Real architectures by catalog model id. Read-only.
ARCHITECTURES: Mapping[str, Architecture] = MappingProxyType({
    "flux.1-schnell": _FLUX1_SCHNELL,
    "sd3.5-medium": _SD35_MEDIUM,
    "flux.2-dev": _FLUX2_DEV,
})
