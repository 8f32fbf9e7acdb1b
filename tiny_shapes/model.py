"""Architecture of the tiny-shapes FluxPipeline (the trained default in ``assets/models/tiny-shapes``).

The same builder makes the untrained (random-weight) baseline of the evaluation. The T5
tokenizer has one whole-word piece per word of the training captions (other words are spelled in
character pieces) and lowercases, so letter case never reaches the model; the CLIP tokenizer is
character-level (and lowercases too, as CLIP's does). Both text encoders start from a seeded
random initialisation and are trained together with the transformer (scripts/train_tiny_model.py).

Two wordings: :data:`GRAMMAR`, the one sentence per scene of the shipped weights, and
:data:`VARIED`, people's words from :mod:`tiny_shapes.captions` (longer captions, punctuation as
pieces; commit 99bd8be). :data:`EXTENDED` is the grammar's tokenizer with whole
pieces for people's words appended, for fine-tuning grammar-trained weights on them
(:func:`extend_vocabulary`; "Tenth attempt").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tiny_shapes import captions, dataset
from tpu_demo.models.tiny_models import clip_config, build_clip_tokenizer, build_t5_tokenizer


@dataclass(frozen=True)
class Wording:
    """What the text side of a model is built for."""

    words: tuple[str, ...]
    #: punctuation as pieces of its own ("top-left," -> "top - left ,"); the grammar writes "top-left" as one word
    split_punctuation: bool
    #: T5 pieces the pipeline is called with (``max_sequence_length``; demo_defaults.json)
    max_sequence_length: int
    #: characters the CLIP tokenizer keeps, so its pooled vector sees the whole caption (at CLIP's
    #: usual 77 it saw only the first object of a two-shape caption)
    clip_max_length: int


#: The grammar's 26 words; its longest two-shape caption is 112 characters, 23 pieces.
GRAMMAR = Wording(dataset.VOCABULARY, False, 24, 128)
#: The caption generator's words and marks; its longest captions are 31 pieces.
VARIED = Wording(captions.WORDS + captions.PUNCTUATION, True, 32, 160)
#: People's words added to the grammar's as whole pieces after its own (so every grammar piece keeps its
#: id and trained embedding), each with the grammar word whose embedding it starts from (None: the row's
#: own random start). Punctuation stays as the grammar has it: "top-left," is "top-left" and ",".
SYNONYM_OF: dict[str, str | None] = {
    **{word: None for word in captions.WORDS if word not in dataset.VOCABULARY},
    "little": "small", "tiny": "small", "big": "large", "grey": "gray", "backdrop": "background",
    "centre": "center", "middle": "center", "centered": "center", "centred": "center",
    "upper-left": "top-left", "upper-right": "top-right", "lower-left": "bottom-left", "lower-right": "bottom-right",
}
#: The grammar's pieces plus :data:`SYNONYM_OF`'s: the shipped weights fine-tuned on people's words.
EXTENDED = Wording(dataset.VOCABULARY + tuple(SYNONYM_OF), False, 32, 128)
WORDINGS = {"grammar": GRAMMAR, "varied": VARIED}
#: The shipped weights' call length (demo_defaults.json, the catalog's call_kwargs).
MAX_SEQUENCE_LENGTH = GRAMMAR.max_sequence_length


def build_t5_word_tokenizer(wording: Wording = GRAMMAR):
    """The T5 tokenizer of the model: one Unigram piece per word of ``wording``, character pieces
    for the rest, and a normaliser that lowercases (NFKC first, as SentencePiece's ``nmt_nfkc_cf``
    rule does). For lower-case text its ids are those of the plain ``build_t5_tokenizer``.

    ``T5Tokenizer.from_pretrained`` rebuilds its normaliser and pre-tokenizer from scratch, so the
    pipeline keeps this one as a plain ``PreTrainedTokenizerFast``: ``from_pretrained`` then loads
    ``tokenizer.json`` as saved, and lowercasing needs no code in the app.
    """
    from tokenizers import normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = build_t5_tokenizer(words=wording.words, max_length=wording.max_sequence_length).backend_tokenizer
    backend.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    split = [pre_tokenizers.WhitespaceSplit()] + ([pre_tokenizers.Punctuation("isolated")]
                                                   if wording.split_punctuation else [])
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        split + [pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=wording.max_sequence_length)


def extend_vocabulary(pipe) -> None:
    """Give a pipeline trained on the grammar the tokenizer of :data:`EXTENDED`: the same ids for the
    grammar's pieces, a whole piece for each of people's words (which the grammar's tokenizer spelled in
    characters), its T5 embedding started from its synonym's. The T5 table has room (256 rows)."""
    old = pipe.tokenizer_2.get_vocab()
    tokenizer = build_t5_word_tokenizer(EXTENDED)
    new = tokenizer.get_vocab()
    assert all(new[piece] == i for piece, i in old.items()), "the grammar's pieces must keep their ids"
    table = pipe.text_encoder_2.get_input_embeddings().weight
    assert len(new) <= table.shape[0], f"{len(new)} pieces, {table.shape[0]} embedding rows"
    with torch.no_grad():
        for word, synonym in SYNONYM_OF.items():
            if synonym is not None:
                table[new["\u2581" + word]] = table[old["\u2581" + synonym]]
    pipe.tokenizer_2 = tokenizer


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


def build_text_encoders(text_dim: int = 64, clip_max_length: int = GRAMMAR.clip_max_length):
    from transformers import CLIPTextModel, T5Config, T5EncoderModel

    config = clip_config(projection=False)
    config.max_position_embeddings = clip_max_length
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


def build_shapes_pipeline(seed: int = 0, vae_blocks=(16, 32, 64), latent_channels: int = 4,
                          wording: Wording = GRAMMAR, **transformer_kwargs):
    """A random-weight FluxPipeline of the tiny-shapes architecture, deterministic from ``seed``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    torch.manual_seed(seed)
    clip, t5 = build_text_encoders(clip_max_length=wording.clip_max_length)
    vae = build_vae(vae_blocks, latent_channels)
    transformer = build_transformer(latent_channels, **transformer_kwargs)
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False),
        vae=vae, text_encoder=clip, tokenizer=build_clip_tokenizer(max_length=wording.clip_max_length),
        text_encoder_2=t5, tokenizer_2=build_t5_word_tokenizer(wording),
        transformer=transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe
