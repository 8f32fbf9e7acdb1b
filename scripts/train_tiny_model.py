#!/usr/bin/env python
"""Train the tiny-shapes FluxPipeline on CPU: a small VAE, then a small Flux transformer.

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 python scripts/train_tiny_model.py --output assets/models/tiny-shapes --seed 0

The defaults are the four-bucket recipe of issue #19 that made the shipped weights
(docs/tiny-shapes.md, "Fourth attempt" for the VAE stage, "Sixth attempt" for one summed loss
over the four buckets per transformer step, "Eighth attempt" for training scenes whose objects
stand exactly at their positions, ``--jitter 0``).
Stages (each with a tqdm bar; losses go to ``<output>/train_log.jsonl``):

1. render ``--num-images`` captioned scenes per bucket (tiny_shapes.dataset; held-out triples never appear);
2. train the AutoencoderKL (MSE + a small KL term; random crops of the ``--vae-buckets`` scenes
   first, whole ``--vae-full-buckets`` images last; tiny_shapes.vae_training), then its decoder
   alone on whole images of every bucket, plain and drawn in the tiny styles (``--vae-decoder-steps``,
   ``--vae-decoder-styles``; the latents unchanged), then set its ``shift_factor``/``scaling_factor``
   from the latent statistics of every bucket;
3. encode every image once (latent mean, ``_pack_latents``) and tokenize every caption once with
   the pipeline's own tokenizers (CLIP char-level, T5 with whole-word pieces);
4. train the FluxTransformer2DModel together with both text encoders (CLIP pooled output + T5
   hidden states, computed exactly as ``FluxPipeline.encode_prompt`` does) with the
   flow-matching loss on sigmas drawn from the pipeline's FlowMatchEulerDiscreteScheduler
   (x_t = (1 - s) x0 + s noise, target noise - x0), weighted towards the tokens that show an
   object, with caption dropout for true CFG, plus the auxiliary binding loss on T5's states
   (``--binding-weight``), keeping an EMA of the weights, which is what gets saved;
   ``--freeze-text-encoders`` keeps the text encoders at their random initialisation;
5. ``save_pretrained(..., safe_serialization=True)`` the whole pipeline plus ``demo_defaults.json`` and
   ``vocabulary.json`` (the words it was trained on, which the page reads to say what it cannot).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from tiny_shapes import captions as shapes_captions, dataset as shapes_dataset  # noqa: E402
from tiny_shapes.coupling import (FREE, coupled_noise, left_out_code, nearest_noise,  # noqa: E402
                                  layout_alternatives, region_masks)  # noqa: E402
from tiny_shapes.model import WORDINGS, build_shapes_pipeline, extend_vocabulary  # noqa: E402
from tiny_shapes.styles import render_styled  # noqa: E402
from tiny_shapes.vae_training import encode_images, lr_at, object_pixel_mask, train_decoder, train_vae  # noqa: E402

#: Inference defaults recorded beside the weights (measured best; see docs/tiny-shapes.md).
#: ``true_cfg_scale`` guides against the empty prompt, which caption dropout trained.
#: ``max_sequence_length`` is the T5 tokenizer's (tiny_shapes.model.Wording), added when saving.
DEMO_DEFAULTS = {"height": 64, "width": 64, "num_inference_steps": 12, "true_cfg_scale": 3.0, "negative_prompt": ""}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", type=Path, default=Path("assets/models/tiny-shapes"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--buckets", type=str, default="64x64,128x128,96x64,64x96",
                   help="canvases WIDTHxHEIGHT to train on (the catalog's buckets; the first is the default)")
    p.add_argument("--num-images", type=str, default="12000,4000,6000,6000",
                   help="scenes rendered per bucket (one number for every bucket, or one per bucket)")
    p.add_argument("--bucket-weights", type=str, default="0.25,0.25,0.25,0.25",
                   help="each bucket's share of the summed loss (--bucket-mixing sum) or of the steps (draw)")
    p.add_argument("--bucket-mixing", choices=("draw", "sum"), default="sum",
                   help="sum: each transformer step takes one batch of every bucket and sums their losses weighted by "
                        "--bucket-weights (one direction for the shared weights per step); draw: each step trains "
                        "one bucket, drawn with --bucket-weights (the recipe up to the fifth attempt)")
    p.add_argument("--jitter", type=str, default=",".join(map(str, shapes_dataset.TRAINING_JITTER)),
                   help="offsets (pixels, each axis) an object's centre is moved by at random in the training scenes "
                        "(default 0: every object exactly at its position; the recipe up to the seventh attempt "
                        "was -2,-1,0,1,2)")
    p.add_argument("--captions", choices=tuple(WORDINGS), default="grammar",
                   help="grammar: the one sentence per scene of the shipped weights; varied: people's words from "
                        "tiny_shapes.captions.describe (synonyms, word orders, left-out attributes drawn by the scene, "
                        "stray words; the held-out phrasings never), with the text side built for them "
                        "(docs/tiny-shapes.md, 'Ninth attempt': measured, not shipped)")
    p.add_argument("--full-share", type=float, default=0.4,
                   help="varied captions: share that names every attribute (the rest leave some out)")
    p.add_argument("--couple-left-out", nargs="?", const="statistic", choices=("statistic", "nearest"), default=None,
                   help="varied captions: draw each sample's noise so that it names the scene's left-out attributes "
                        "(tiny_shapes.coupling), so the seed chooses them instead of the model drawing their average; "
                        "statistic (the eleventh attempt): a fixed statistic of the noise names position, size and "
                        "background; nearest: the noise points towards the scene's latent more than towards the scene "
                        "with its left-out positions and sizes set any other way (an optimal-transport pairing; "
                        "docs/tiny-shapes.md, 'Twelfth attempt': measured, not shipped)")
    p.add_argument("--alternatives", type=int, default=9,
                   help="--couple-left-out nearest: at most this many other layouts per scene (one object with "
                        "position and size left out has 9; two objects more, of which this many are drawn)")
    p.add_argument("--self-pairs", type=Path, action="append", default=[],
                   help="varied captions: a file of scripts/make_self_pairs.py (the model's own starting noise and "
                        "the scene it drew from it, judged right), added to its bucket's scenes and trained with that "
                        "noise (reflow filtered by the judge: tiny_shapes/self_pairs.py); may be given per bucket")
    p.add_argument("--self-pair-repeat", type=int, default=1, help="--self-pairs: each pair this many times among the scenes")
    p.add_argument("--stray-word", type=float, default=0.08,
                   help="varied captions: share with one made-up word the vocabulary does not know")
    p.add_argument("--two-shape-prob", type=float, default=0.5, help="share of training scenes with two shapes")
    p.add_argument("--vae-steps", type=int, default=2200, help="VAE steps in all (crops first, then full images)")
    p.add_argument("--vae-buckets", type=str, default="64x64",
                   help="the buckets whose scenes the VAE's crop steps see (sizes are pixels, so a shape looks alike "
                        "on every canvas and crops of 64x64 scenes teach the convolutions every shape)")
    p.add_argument("--vae-full-steps", type=int, default=400,
                   help="the last N VAE steps see whole images of --vae-full-buckets (in turn, batch scaled by "
                        "area); the ones before see --vae-crop crops")
    p.add_argument("--vae-full-buckets", type=str, default="64x64,128x128",
                   help="the buckets whose whole scenes the last VAE steps see: GroupNorm and the mid-block "
                        "attention see the whole canvas, and a VAE that saw only 64x64 ones draws 128x128 scenes worse")
    p.add_argument("--vae-crop", type=int, default=32, help="side of the random crops of the first VAE steps")
    p.add_argument("--vae-batch-size", type=int, default=32)
    p.add_argument("--vae-lr", type=float, default=2e-3)
    p.add_argument("--vae-object-weight", type=float, default=0.0,
                   help="reconstruction loss weight of the pixels on or next to an object (background: 1)")
    p.add_argument("--vae-decoder-steps", type=int, default=800,
                   help="then steps of the decoder alone (encoder frozen) on whole images of every bucket in turn; "
                        "400 lift the VAE's 128x128 ceiling above 95%% (docs/tiny-shapes.md, 'Seventh attempt'), and "
                        "with --vae-decoder-styles they let the style adapters' borders and bands through ('Styles')")
    p.add_argument("--vae-decoder-lr", type=float, default=5e-4)
    p.add_argument("--vae-decoder-object-weight", type=float, default=4.0,
                   help="decoder steps: extra loss weight of the pixels on or next to an object")
    p.add_argument("--vae-decoder-styles", default="outline,striped",
                   help="decoder steps also see every scene drawn in these tiny_shapes.styles (comma list; '' for none), "
                        "so the decoder draws the style adapters' 3-4 px borders and bands (docs/tiny-shapes.md, 'Styles')")
    p.add_argument("--decoder-only", action="store_true",
                   help="with --init-from: only the decoder steps on that pipeline's VAE, everything else saved as "
                        "loaded (how the shipped decoder was polished for the styles: the same stage a run from "
                        "scratch ends its VAE with)")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start from a saved tiny-shapes pipeline (e.g. the shipped one) instead of random weights: "
                        "its VAE (and latent shift/scale) is kept as is, the transformer and text encoders are trained on")
    p.add_argument("--extend-vocabulary", action="store_true",
                   help="with --init-from a grammar-trained pipeline and --captions varied: whole T5 pieces for "
                        "people's words, each started from its synonym's embedding (tiny_shapes.model.extend_vocabulary; "
                        "docs/tiny-shapes.md, 'Tenth attempt')")
    p.add_argument("--vae-blocks", type=str, default="16,32,64",
                   help="VAE block_out_channels; n blocks make vae_scale_factor 2**(n-1)")
    p.add_argument("--latent-channels", type=int, default=4,
                   help="VAE latent channels (the transformer takes 4x as many)")
    p.add_argument("--vae-only", action="store_true", help="development: stop after the VAE stage and its latent statistics; save it to <output>/vae")
    p.add_argument("--bf16", action="store_true",
                   help="train the VAE under bfloat16 autocast (1.5x faster on AVX512-BF16 CPUs, much slower on AVX2 ones)")
    p.add_argument("--steps", type=int, default=5000, help="transformer steps (the ninth attempt: 5600)")
    p.add_argument("--batch-sizes", type=str, default="12,6,8,8",
                   help="transformer batch size per bucket (one number for every bucket, or one per bucket)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ema", type=float, default=0.998)
    p.add_argument("--object-weight", type=float, default=4.0,
                   help="loss weight of the latent tokens that cover an object (background tokens: 1)")
    p.add_argument("--caption-dropout", type=float, default=0.1,
                   help="share of transformer samples trained on the empty prompt (enables true CFG)")
    p.add_argument("--binding-weight", type=float, default=0.2,
                   help="weight of the auxiliary binding loss: linear heads (discarded after training) read each "
                        "object's colour, shape, size and position off every T5 state of its phrase")
    p.add_argument("--timestep-sampling", choices=("uniform", "logit-normal"), default="uniform",
                   help="sigma of each transformer sample: uniform over the scheduler's sigmas, or SD3's "
                        "logit-normal (sigmoid of a standard normal: most samples at mid noise)")
    p.add_argument("--freeze-text-encoders", action="store_true",
                   help="train only the transformer (the text encoders stay at their seeded random weights)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="every N transformer steps, save the pipeline with the EMA weights to <output>.ckpt")
    p.add_argument("--save-vae", type=Path, default=None,
                   help="also save the VAE's state dict here, after its training steps and before the decoder steps")
    p.add_argument("--load-vae", type=Path, default=None,
                   help="development shortcut: load a VAE state dict (from --save-vae) instead of training one; "
                        "the decoder steps still run")
    return p.parse_args(argv)


class Logger:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("w")

    def __call__(self, **record):
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()


def per_bucket(text: str, count: int, kind=int) -> list:
    """"12000" or "12000,6000,..." -> one value per bucket."""
    values = [kind(v) for v in str(text).split(",") if v.strip()]
    if len(values) == 1:
        values *= count
    if len(values) != count:
        raise SystemExit(f"expected 1 or {count} comma-separated values, got {text!r}")
    return values


def object_token_weights(images: np.ndarray, scenes, token_pixels: int, weight: float) -> torch.Tensor:
    """Per packed latent token, ``weight`` where its pixels show any object, else 1.

    Objects cover 5-16% of a scene, and what tells a circle from a square is a few edge pixels:
    with a plain mean the loss is mostly background, and shape is the last thing learned.
    """
    background = np.array([shapes_dataset.PALETTE[s.background] for s in scenes], dtype=np.int16)
    on_object = (images.astype(np.int16) != background[:, None, None, :]).any(-1)
    n, h, w = on_object.shape
    cells = on_object.reshape(n, h // token_pixels, token_pixels, w // token_pixels, token_pixels).any((2, 4))
    return torch.from_numpy(np.where(cells.reshape(n, -1), weight, 1.0).astype(np.float32))


def tokenize_captions(pipe, captions: list[str]):
    """Token ids of each unique caption for both tokenizers, as ``FluxPipeline.encode_prompt`` makes them.

    Row 0 is the empty prompt (caption dropout; the pipeline's ``negative_prompt=""``).
    """
    unique = [""] + sorted(set(captions) - {""})
    clip_ids = pipe.tokenizer(unique, padding="max_length", max_length=pipe.tokenizer_max_length,
                              truncation=True, return_tensors="pt").input_ids
    t5_ids = pipe.tokenizer_2(unique, padding="max_length", max_length=pipe.tokenizer_2.model_max_length,
                              truncation=True, return_tensors="pt").input_ids
    index = {c: i for i, c in enumerate(unique)}
    return unique, clip_ids, t5_ids, torch.tensor([index[c] for c in captions])


def binding_labels(pipe, unique: list[str], prompts: dict) -> torch.Tensor:
    """``(captions, max_sequence_length, attributes)`` long: per T5 token inside an object's phrase
    (``Prompt.spans``, matched through the tokenizer's character offsets), the index of each
    attribute of that object the caption names; -100 (ignored) for the attributes it leaves out
    and for every token outside a phrase (prefix, "and", background, stray words)."""
    length = pipe.tokenizer_2.model_max_length
    labels = torch.full((len(unique), length, len(shapes_dataset.ATTRIBUTES)), -100)
    for row, caption in enumerate(unique):
        if not caption:
            continue
        prompt = prompts[caption]
        offsets = pipe.tokenizer_2(caption, return_offsets_mapping=True, truncation=True,
                                   max_length=length)["offset_mapping"]
        for i, (start, end) in enumerate(offsets):
            owner = next((k for k, (a, b) in enumerate(prompt.spans) if a <= start < b and end > start), None)
            if owner is None:
                continue
            obj = prompt.scene.objects[owner]
            for k, (attribute, table) in enumerate(shapes_dataset.ATTRIBUTES.items()):
                if prompt.names(owner, attribute):
                    labels[row, i, k] = table.index(getattr(obj, attribute))
    return labels


class BindingProbe(torch.nn.Module):
    """One linear head per attribute on the T5 hidden states; only for the auxiliary loss (not saved)."""

    def __init__(self, width: int):
        super().__init__()
        self.heads = torch.nn.ModuleList(torch.nn.Linear(width, len(v)) for v in shapes_dataset.ATTRIBUTES.values())

    def forward(self, embeds: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        losses = [F.cross_entropy(head(embeds).flatten(0, 1), labels[..., k].flatten(), ignore_index=-100)
                  for k, head in enumerate(self.heads)]
        return torch.stack(losses).mean()


class Conditioning(torch.nn.Module):
    """Both text encoders, called the way ``FluxPipeline._get_clip_prompt_embeds`` / ``_get_t5_prompt_embeds`` do."""

    def __init__(self, text_encoder, text_encoder_2):
        super().__init__()
        self.text_encoder, self.text_encoder_2 = text_encoder, text_encoder_2

    def forward(self, clip_ids: torch.Tensor, t5_ids: torch.Tensor):
        pooled = self.text_encoder(clip_ids, output_hidden_states=False).pooler_output
        embeds = self.text_encoder_2(t5_ids, output_hidden_states=False)[0]
        return embeds, pooled


class Trainable(torch.nn.Module):
    """What the optimiser and the EMA see: the transformer, plus the text encoders unless frozen."""

    def __init__(self, transformer, conditioning: Conditioning):
        super().__init__()
        self.transformer, self.conditioning = transformer, conditioning


def pipeline_with(pipe, weights: Trainable):
    """``pipe`` with the trained (EMA) transformer and text encoders swapped in."""
    return type(pipe)(**{**pipe.components, "transformer": weights.transformer,
                         "text_encoder": weights.conditioning.text_encoder,
                         "text_encoder_2": weights.conditioning.text_encoder_2})


def save_pipeline(pipe, path: Path) -> None:
    """``save_pretrained`` (safetensors) plus the inference defaults the app and the evaluation use."""
    pipe.save_pretrained(path, safe_serialization=True)
    defaults = {**DEMO_DEFAULTS, "max_sequence_length": pipe.tokenizer_2.model_max_length}
    (path / "demo_defaults.json").write_text(json.dumps(defaults, indent=2) + "\n")
    record = shapes_captions.vocabulary_record(pipe.tokenizer_2.model_max_length == WORDINGS["varied"].max_sequence_length)
    (path / "vocabulary.json").write_text(json.dumps(record, indent=1) + "\n")


def with_styles(sets: list[tuple[np.ndarray, np.ndarray]], data: list, sizes: list[tuple[int, int]],
                styles: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The decoder's (images, object masks) per bucket, plus every bucket's scenes drawn in each of
    ``styles`` at their layout positions: a decoder that only saw filled shapes blurs a 3 px border
    shut and turns a red band olive (docs/tiny-shapes.md, "Styles")."""
    out = []
    for (images, mask), (_, _, scenes), size in zip(sets, data, sizes):
        styled = [np.stack([np.asarray(render_styled(scene, style, size)) for scene in scenes]) for style in styles]
        out.append((np.concatenate([images, *styled]),
                    np.concatenate([mask, *(object_pixel_mask(drawn, scenes) for drawn in styled)])))
    return out


def args_record(args: argparse.Namespace) -> dict:
    """The run's arguments as JSON-ready values (paths as strings), for ``training.json``."""
    def plain(value):
        return str(value) if isinstance(value, Path) else [plain(v) for v in value] if isinstance(value, list) else value

    return {k: plain(v) for k, v in vars(args).items()}


def save_decoder_polish(pipe, args, timings: dict) -> None:
    """--decoder-only: the pipeline (only its decoder changed) and its record: the loaded pipeline's
    ``training.json`` with this run's arguments under ``decoder_polish`` (a polish of a polished
    decoder keeps the ones before it under ``earlier_decoder_polishes``, oldest first)."""
    save_pipeline(pipe, args.output)
    source = args.init_from / "training.json"
    record = json.loads(source.read_text()) if source.is_file() else {}
    if "decoder_polish" in record:
        record["earlier_decoder_polishes"] = [*record.get("earlier_decoder_polishes", []), record["decoder_polish"]]
    record["decoder_polish"] = {"args": args_record(args), "timings": timings, "torch": torch.__version__}
    (args.output / "training.json").write_text(json.dumps(record, indent=2) + "\n")


def sample_sigmas(kind: str, table: torch.Tensor, batch: int, gen: torch.Generator) -> torch.Tensor:
    """Noise levels of one batch: ``uniform`` over the scheduler's training sigmas ``table``, or SD3's
    ``logit-normal`` (sigmoid of a standard normal: most samples at mid noise, few near 0 or 1;
    docs/tiny-shapes.md, "Learning rate and noise levels", measures what it buys)."""
    if kind == "logit-normal":
        return torch.sigmoid(torch.randn(batch, generator=gen))
    return table[torch.randint(0, len(table), (batch,), generator=gen)]


def render_alternatives(rendered: list, size: tuple[int, int], limit: int,
                        seed: int, padding: int = 0) -> tuple[np.ndarray, torch.Tensor]:
    """For ``--couple-left-out nearest``: each training scene drawn in its other layouts
    (``tiny_shapes.coupling.layout_alternatives``), as one uint8 array, and per scene the
    ``(start, count)`` of its rows in it; ``padding`` more scenes (self-pairs) get none."""
    rng = random.Random(seed)
    images, spans = [], []
    for _, prompt in rendered:
        others = layout_alternatives(prompt.scene, prompt.named, rng, limit)
        spans.append((len(images), len(others)))
        images += [np.asarray(shapes_dataset.render(scene, None, size)) for scene in others]
    spans += [(len(images), 0)] * padding
    empty = np.zeros((0, size[1], size[0], 3), np.uint8)
    return (np.stack(images) if images else empty), torch.tensor(spans, dtype=torch.long)


def bucket_batch(bucket: dict, args, sigmas_table: torch.Tensor, gen: torch.Generator) -> dict:
    """One training batch of ``bucket``: clean latents ``x0``, caption ``rows`` (0, the empty caption,
    at ``--caption-dropout``), noise levels, noise and the per-token loss weights."""
    batch = bucket["batch"]
    idx = torch.randint(0, len(bucket["packed"]), (batch,), generator=gen)
    rows = torch.where(torch.rand(batch, generator=gen) < args.caption_dropout, 0, bucket["rows"][idx])
    sigma = sample_sigmas(args.timestep_sampling, sigmas_table, batch, gen)
    x0 = bucket["packed"][idx]
    if "codes" in bucket:  # --couple-left-out: the noise names the left-out attributes (not for the empty caption)
        codes = bucket["codes"][idx].masked_fill((rows == 0)[:, None], FREE)
        noise = coupled_noise(codes, tuple(x0.shape[1:]), bucket["regions"], gen)
    else:
        noise = torch.randn(x0.shape, generator=gen)
    if "alternatives" in bucket:  # --couple-left-out nearest: noise that points to the scene, not its other layouts
        for row, (i, caption_row) in enumerate(zip(idx.tolist(), rows.tolist())):
            start, count = bucket["alternative_spans"][i].tolist()
            if count and caption_row:
                others = bucket["alternatives"][start:start + count]
                noise[row] = nearest_noise(torch.cat([x0[row:row + 1], others]), gen)
    if "fixed_noise" in bucket:  # --self-pairs: the noise the model drew this scene from (not for the empty caption)
        first = bucket["fixed_from"]
        for row, (i, caption_row) in enumerate(zip(idx.tolist(), rows.tolist())):
            if i >= first and caption_row:
                noise[row] = bucket["fixed_noise"][i - first]
    return dict(x0=x0, rows=rows, sigma=sigma, noise=noise, token_weights=bucket["token_weights"][idx],
                img_ids=bucket["img_ids"])


def flow_matching_loss(transformer, mb: dict, embeds: torch.Tensor, pooled: torch.Tensor,
                       txt_ids: torch.Tensor) -> torch.Tensor:
    """Rectified-flow loss of one batch: x_t = (1 - s) x0 + s noise, target noise - x0, averaged
    over tokens weighted towards the ones that show an object."""
    s = mb["sigma"].view(-1, 1, 1)
    xt = (1 - s) * mb["x0"] + s * mb["noise"]
    pred = transformer(hidden_states=xt, timestep=mb["sigma"], pooled_projections=pooled,
                       encoder_hidden_states=embeds, txt_ids=txt_ids, img_ids=mb["img_ids"], return_dict=False)[0]
    weights = mb["token_weights"]
    return ((pred - (mb["noise"] - mb["x0"])) ** 2).mean(-1).mul(weights).sum() / weights.sum()


def train_transformer(pipe, buckets: list[dict], clip_ids, t5_ids, txt_ids, labels, args, log,
                      gen: torch.Generator) -> Trainable:
    """``buckets``: per canvas, ``packed`` latents, ``token_weights``, caption ``rows``, ``img_ids``,
    ``batch`` size and ``weight``. ``--bucket-mixing sum`` (default): each step a batch of every bucket,
    one loss summed with ``weight`` as shares, so every update pulls the shared weights towards all
    canvases at once; ``draw``: each step draws one bucket (``weight``: share of the steps), then a batch of it."""
    model = Trainable(pipe.transformer, Conditioning(pipe.text_encoder, pipe.text_encoder_2))
    model.train()
    model.conditioning.eval()  # no dropout in T5: the conditioning is deterministic, as at inference
    model.conditioning.requires_grad_(not args.freeze_text_encoders)
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    probe = BindingProbe(pipe.text_encoder_2.config.d_model) if args.binding_weight else None
    if probe is not None:
        params += list(probe.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    # Sigmas of the pipeline's own scheduler (its 1000 training timesteps, shift applied).
    scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
    sigmas_table = scheduler.sigmas[: scheduler.config.num_train_timesteps].clone()
    bucket_p = torch.tensor([b["weight"] for b in buckets], dtype=torch.float64)
    loss_shares = (bucket_p / bucket_p.sum()).tolist()  # --bucket-mixing sum: the same every step
    bar = tqdm(range(args.steps), desc="transformer", dynamic_ncols=True, mininterval=5)
    running = None
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr)
        if args.bucket_mixing == "sum":
            chosen, shares = buckets, loss_shares
        else:
            chosen, shares = [buckets[int(torch.multinomial(bucket_p, 1, generator=gen))]], [1.0]
        batches = [bucket_batch(bucket, args, sigmas_table, gen) for bucket in chosen]
        rows = torch.cat([mb["rows"] for mb in batches])
        with torch.set_grad_enabled(not args.freeze_text_encoders):
            embeds, pooled = model.conditioning(clip_ids[rows], t5_ids[rows])  # every bucket's captions at once
        loss, start = 0.0, 0
        for share, mb in zip(shares, batches):
            part = slice(start, start + len(mb["rows"]))
            start = part.stop
            loss = loss + share * flow_matching_loss(model.transformer, mb, embeds[part], pooled[part], txt_ids)
        binding = probe(embeds, labels[rows]) if probe is not None and (rows > 0).any() else None
        if binding is not None:
            loss = loss + args.binding_weight * binding
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for pe, pt in zip(ema.parameters(), model.parameters()):
                pe.lerp_(pt, 1 - decay)
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % args.log_every == 0 or step == args.steps - 1:
            log(stage="transformer", step=step, loss=loss.item(), loss_smooth=running, lr=opt.param_groups[0]["lr"],
                bucket="+".join(b["name"] for b in chosen),
                **({} if binding is None else {"binding": binding.item()}))
            bar.set_postfix(loss=f"{running:.4f}")
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and step + 1 < args.steps:
            ckpt = args.output.with_name(args.output.name + ".ckpt")
            save_pipeline(pipeline_with(pipe, ema), ckpt)
            log(stage="checkpoint", step=step + 1, path=str(ckpt))
    return ema


def main(argv=None):
    args = parse_args(argv)
    if args.decoder_only and not args.init_from:  # refused before any training, not after
        raise SystemExit("--decoder-only polishes the decoder of an --init-from pipeline")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    # One generator per stage, so --load-vae continues exactly like a full run would.
    vae_gen = torch.Generator().manual_seed(args.seed)
    transformer_gen = torch.Generator().manual_seed(args.seed + 1)
    decoder_gen = torch.Generator().manual_seed(args.seed + 2)
    args.output.mkdir(parents=True, exist_ok=True)
    log = Logger(args.output / "train_log.jsonl")
    timings = {}
    t0 = time.perf_counter()

    if args.init_from:
        from diffusers import FluxPipeline

        pipe = FluxPipeline.from_pretrained(args.init_from, dtype=torch.float32, local_files_only=True)
        pipe.set_progress_bar_config(disable=True)
        if args.extend_vocabulary:
            extend_vocabulary(pipe)
    else:
        pipe = build_shapes_pipeline(seed=args.seed, vae_blocks=tuple(int(c) for c in args.vae_blocks.split(",")),
                                     latent_channels=args.latent_channels, wording=WORDINGS[args.captions])
    bucket_labels = [label.strip().lower() for label in args.buckets.split(",") if label.strip()]
    sizes = [tuple(int(v) for v in label.split("x")) for label in bucket_labels]
    counts = per_bucket(args.num_images, len(sizes))
    batches = per_bucket(args.batch_sizes, len(sizes))
    shares = per_bucket(args.bucket_weights, len(sizes), float)
    jitter = tuple(int(v) for v in args.jitter.split(","))
    data = []  # per bucket: (uint8 images, captions, scenes); bucket i renders from seed + 1000 i
    prompts = {}  # caption -> tiny_shapes.captions.Prompt (what it names, where each object's phrase is)
    codes = []  # --couple-left-out statistic: per bucket, what each image's noise must name (tiny_shapes.coupling)
    alternatives = []  # --couple-left-out nearest: per bucket, (images of the other layouts, (start, count) per image)
    fixed_noise = []  # --self-pairs: per bucket, None or (index of the first pair, each pair's noise)
    self_pairs = {}
    for path in args.self_pairs:
        record = torch.load(path, weights_only=False)  # our own file: tensors and tiny_shapes.captions.Prompt
        size = tuple(record["size"])
        if size in self_pairs:  # several files for one bucket (rounds of pairs): all of them
            record = {"prompts": self_pairs[size]["prompts"] + record["prompts"],
                      "noise": torch.cat([self_pairs[size]["noise"], record["noise"]])}
        self_pairs[size] = record
    for i, (size, count) in enumerate(zip(sizes, counts)):
        if args.captions == "grammar":
            rendered = [(image, shapes_captions.describe_grammar(scene)) for image, _, scene in shapes_dataset.generate(
                count, seed=args.seed + 1000 * i, two_shape_prob=args.two_shape_prob, size=size, jitter=jitter)]
        else:
            rendered = shapes_captions.generate(count, seed=args.seed + 1000 * i, two_shape_prob=args.two_shape_prob,
                                                size=size, jitter=jitter, full_share=args.full_share,
                                                stray_word=args.stray_word)
        regular = len(rendered)
        pairs = self_pairs.get(size)
        if pairs is not None:  # --self-pairs: after the regular scenes, each with its own noise
            rendered = rendered + [(np.asarray(shapes_dataset.render(p.scene, None, size)), p)
                                   for p in pairs["prompts"]] * args.self_pair_repeat
            fixed_noise.append((regular, pairs["noise"].repeat(args.self_pair_repeat, 1, 1)))
        else:
            fixed_noise.append(None)
        prompts.update((prompt.text, prompt) for _, prompt in rendered)
        data.append((np.stack([d[0] for d in rendered]), [d[1].text for d in rendered], [d[1].scene for d in rendered]))
        if args.couple_left_out == "statistic":
            codes.append(torch.from_numpy(np.stack([left_out_code(p.scene, p.named, p.background_named)
                                                    for _, p in rendered])))
        if args.couple_left_out == "nearest":
            alternatives.append(render_alternatives(rendered[:regular], size, args.alternatives, args.seed + 7919 + i,
                                                    padding=len(rendered) - regular))
    timings["dataset_s"] = time.perf_counter() - t0

    t = time.perf_counter()
    masks: dict[str, np.ndarray] = {}  # per bucket, made once however many VAE phases use it

    def object_sets(option: str, value: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """(uint8 images, object pixel masks) of the buckets ``value`` names."""
        chosen = []
        for label, (images, _, scenes) in zip(bucket_labels, data):
            if label in value.lower().split(","):
                if label not in masks:
                    masks[label] = object_pixel_mask(images, scenes)
                chosen.append((images, masks[label]))
        if not chosen:
            raise SystemExit(f"{option} {value!r} names none of --buckets {args.buckets!r}")
        return chosen

    if args.load_vae:
        pipe.vae.load_state_dict(torch.load(args.load_vae))
        pipe.vae.eval()
    elif args.init_from:
        pipe.vae.eval()
    else:
        train_vae(pipe.vae, object_sets("--vae-buckets", args.vae_buckets),
                  object_sets("--vae-full-buckets", args.vae_full_buckets), args, log, vae_gen)
    if args.save_vae:
        torch.save(pipe.vae.state_dict(), args.save_vae)
    # --init-from keeps its VAE as it is, unless only its decoder is to be polished
    if args.vae_decoder_steps and (args.load_vae or not args.init_from or args.decoder_only):
        styles = [name for name in args.vae_decoder_styles.split(",") if name]
        train_decoder(pipe.vae, with_styles(object_sets("--buckets", args.buckets), data, sizes, styles),
                      args, log, decoder_gen)
    timings["vae_s"] = time.perf_counter() - t
    if args.decoder_only:
        save_decoder_polish(pipe, args, timings)
        return
    t = time.perf_counter()
    latents = [encode_images(pipe.vae, images) for images, _, _ in data]
    flat = torch.cat([lat.flatten() for lat in latents])
    shift, scale = flat.mean().item(), 1.0 / flat.std().item()
    if args.init_from and not args.load_vae:  # the transformer learned the VAE's existing normalisation
        shift, scale = pipe.vae.config.shift_factor, pipe.vae.config.scaling_factor
    pipe.vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    if args.vae_only:
        pipe.vae.save_pretrained(args.output / "vae", safe_serialization=True)
        print(json.dumps(timings))
        return
    unique, clip_ids, t5_ids, rows = tokenize_captions(pipe, [c for _, captions, _ in data for c in captions])
    token_pixels = pipe.vae_scale_factor * 2  # a packed token is 2x2 latent pixels
    buckets, offset = [], 0
    for (width, height), (images, captions, scenes), lat, batch, share in zip(sizes, data, latents, batches, shares):
        lat = (lat - shift) * scale
        b, c, h, w = lat.shape
        buckets.append(dict(
            name=f"{width}x{height}", packed=pipe._pack_latents(lat, b, c, h, w),
            token_weights=object_token_weights(images, scenes, token_pixels, args.object_weight),
            img_ids=pipe._prepare_latent_image_ids(b, h // 2, w // 2, "cpu", torch.float32),
            rows=rows[offset:offset + b], batch=batch, weight=share))
        if codes:
            buckets[-1].update(codes=codes[len(buckets) - 1], regions=region_masks(h // 2, w // 2))
        if fixed_noise[len(buckets) - 1] is not None:
            buckets[-1]["fixed_from"], buckets[-1]["fixed_noise"] = fixed_noise[len(buckets) - 1]
        if alternatives and len(alternatives[len(buckets) - 1][0]):
            images_alt, spans = alternatives[len(buckets) - 1]
            alt = (encode_images(pipe.vae, images_alt) - shift) * scale
            buckets[-1].update(alternatives=pipe._pack_latents(alt, *alt.shape), alternative_spans=spans)
        offset += b
    del data, latents
    txt_ids = torch.zeros(pipe.tokenizer_2.model_max_length, 3)
    timings["encode_s"] = time.perf_counter() - t
    log(stage="latents", shift_factor=shift, scaling_factor=scale, buckets=[b["name"] for b in buckets],
        tokens=[b["packed"].shape[1] for b in buckets], unique_captions=len(unique))

    t = time.perf_counter()
    labels = binding_labels(pipe, unique, prompts) if args.binding_weight else None
    ema = train_transformer(pipe, buckets, clip_ids, t5_ids, txt_ids, labels, args, log, transformer_gen)
    pipe = pipeline_with(pipe, ema)
    pipe.set_progress_bar_config(disable=True)
    timings["transformer_s"] = time.perf_counter() - t
    # The pipeline must condition exactly as training did.
    with torch.no_grad():
        embeds, pooled = ema.conditioning(clip_ids[:3], t5_ids[:3])
        e, p, _ = pipe.encode_prompt(unique[:3], prompt_2=None, max_sequence_length=pipe.tokenizer_2.model_max_length)
    assert torch.allclose(e, embeds, atol=1e-5) and torch.allclose(p, pooled, atol=1e-5)

    save_pipeline(pipe, args.output)
    timings["total_s"] = time.perf_counter() - t0
    info = {"args": args_record(args), "timings": timings,
            "torch": torch.__version__, "shift_factor": shift, "scaling_factor": scale}
    (args.output / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    log(stage="done", **timings)
    print(json.dumps(timings, indent=2))


if __name__ == "__main__":
    main()
