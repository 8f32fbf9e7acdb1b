#!/usr/bin/env python
"""Train the tiny-shapes FluxPipeline on CPU: a small VAE, then a small Flux transformer.

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 python scripts/train_tiny_model.py --output assets/models/tiny-shapes --seed 0

The defaults are the four-bucket recipe that made the shipped weights
(commits 5717782 for the VAE stage, 93d0a69 for one summed loss
over the four buckets per transformer step, 531ac6c for training scenes whose objects
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
   (``--binding-weight``), keeping an EMA of the weights, which is what gets saved (tiny_shapes.flow_training);
   ``--freeze-text-encoders`` keeps the text encoders at their random initialisation;
5. ``save_pretrained(..., safe_serialization=True)`` the whole pipeline plus ``demo_defaults.json`` and
   ``vocabulary.json`` (the words it was trained on, which the page reads to say what it cannot).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tiny_shapes import captions as shapes_captions, dataset as shapes_dataset  # noqa: E402
from tiny_shapes.coupling import left_out_code, region_masks  # noqa: E402
from tiny_shapes.flow_training import (binding_labels, object_token_weights, pipeline_with,  # noqa: E402
                                       render_alternatives, tokenize_captions, train_transformer)
from tiny_shapes.model import WORDINGS, build_shapes_pipeline, extend_vocabulary  # noqa: E402
from tiny_shapes.styles import render_styled  # noqa: E402
from tiny_shapes.vae_training import encode_images, object_pixel_mask, train_decoder, train_vae  # noqa: E402

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
                        "(commit 99bd8be: measured, not shipped)")
    p.add_argument("--full-share", type=float, default=0.4,
                   help="varied captions: share that names every attribute (the rest leave some out)")
    p.add_argument("--couple-left-out", nargs="?", const="statistic", choices=("statistic", "nearest"), default=None,
                   help="varied captions: draw each sample's noise so that it names the scene's left-out attributes "
                        "(tiny_shapes.coupling), so the seed chooses them instead of the model drawing their average; "
                        "statistic (the eleventh attempt): a fixed statistic of the noise names position, size and "
                        "background; nearest: the noise points towards the scene's latent more than towards the scene "
                        "with its left-out positions and sizes set any other way (an optimal-transport pairing; "
                        "commit 0ba5597: measured, not shipped)")
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
                        "400 lift the VAE's 128x128 ceiling above 95%% (commit 4097b95), and "
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
                        "commit e91b607)")
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
    def save_checkpoint(ema, steps: int) -> None:
        ckpt = args.output.with_name(args.output.name + ".ckpt")
        save_pipeline(pipeline_with(pipe, ema), ckpt)
        log(stage="checkpoint", step=steps, path=str(ckpt))

    ema = train_transformer(pipe, buckets, clip_ids, t5_ids, txt_ids, labels, args, log, transformer_gen,
                            on_checkpoint=save_checkpoint)
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
