#!/usr/bin/env python
"""Train one tiny style adapter (LoRA on the transformer) for the tiny-shapes default, on CPU.

    python scripts/train_tiny_style.py --style outline --seed 0
    python scripts/train_tiny_style.py --style shaded --seed 0
    python scripts/train_tiny_style.py --style striped --seed 1 --object-weight 8 --neighbour-weight 4 \
        --balance-pairs --two-shape-share 0.8 --lora-dropout 0.1

The base weights (``assets/models/tiny-shapes``) stay frozen, text encoders and VAE included: the
adapter sees the base model's own captions with scenes drawn in the style
(:mod:`tiny_shapes.styles`), encoded by the base VAE, and learns the rectified-flow target of the
base training (``scripts/train_tiny_model.py``) on every bucket at once. The LoRA targets the
same linear layers in every style and has the same rank, so the app can hot-swap one for another
on a compiled transformer (``enable_lora_hotswap``). Deterministic from ``--seed``; writes
``<output>/<style>.safetensors`` (diffusers' LoRA format, ``FluxPipeline.save_lora_weights``) and
``<style>.json`` (the arguments, timings and, with ``--evaluate``, the judge's figures:
:func:`evaluate_style`). ``--vae-ceiling`` records what the judge reads of the exact styled drawings
after the VAE alone (:func:`vae_ceiling`): the most an adapter can reach through this decoder.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from tiny_shapes import dataset as shapes_dataset  # noqa: E402
from tiny_shapes.styles import STYLES, generate_styled, judge_styled, render_styled  # noqa: E402
from tiny_shapes.vae_training import encode_images, lr_at  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "assets" / "models" / "tiny-shapes"
#: every style adapts these linear layers of every block (the same set, so styles hot-swap)
TARGET_MODULES = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
                  "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2", "proj_mlp", "proj_out"]
#: the layers of the double-stream blocks that see only the caption's tokens (``--layers image`` leaves them out)
CAPTION_ONLY_MODULES = {"add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "ff_context.net.0.proj", "ff_context.net.2"}
#: the per-token feed-forward layers that see image tokens (``--layers ff``): no attention, no caption-only layer
FEED_FORWARD_MODULES = {"ff.net.0.proj", "ff.net.2", "proj_mlp", "proj_out"}
#: ``--layers``: which of TARGET_MODULES an adapter trains (each a subset, so every adapter hot-swaps on one slot)
LAYER_SETS = {"all": set(TARGET_MODULES), "image": set(TARGET_MODULES) - CAPTION_ONLY_MODULES, "ff": FEED_FORWARD_MODULES}


#: ``--low-noise-share``'s samples have noise levels below this (the last 5 of the app's 12 steps)
LOW_NOISE = 0.4


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--style", choices=STYLES, required=True)
    parser.add_argument("--output", type=Path, default=BASE / "styles")
    parser.add_argument("--base", type=Path, default=BASE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads (the same bytes with 1 or 2; 2 for the command alone on 2 cores, 1 when other "
                             "processes share them: a second thread's spin-waits then cost several times the work)")
    parser.add_argument("--buckets", default="64x64,96x64,64x96,128x128",
                        help="canvases trained on (sizes are pixels: 128x128 shows the same shapes, spaced wider)")
    parser.add_argument("--images", type=int, default=1200, help="training scenes per bucket")
    parser.add_argument("--two-shape-share", type=float, default=0.6,
                        help="share of training scenes with two shapes (the harder half: a small shape beside another)")
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch", default="4",
                        help="images per bucket per step: one number, or one per --buckets entry (e.g. 4,3,3,6)")
    parser.add_argument("--balance-pairs", action="store_true",
                        help="draw every (colour, shape) pair equally often: by default a pair that trains at 2 "
                             "positions of 5 (white circles, blue triangles, ...) is 2.5 times rarer "
                             "(tiny_shapes.dataset.sample_scene)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--save-dtype", choices=("float32", "float16"), default="float32",
                        help="the saved adapter's dtype: float16 halves the file, so rank 32 fits the 1 MB budget "
                             "(trained in float32 either way; the app loads it in the transformer's dtype)")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--layers", choices=tuple(LAYER_SETS), default="all",
                        help="the linear layers adapted: all, all but the double-stream blocks' caption-only ones "
                             "(image), or the image tokens' feed-forward layers only (ff); each a subset of 'all', so "
                             "the adapters still hot-swap on one slot")
    parser.add_argument("--lora-dropout", type=float, default=0.0,
                        help="dropout on the adapter's input in training (PEFT's lora_dropout): a regulariser against "
                             "learning the trained colour-shape-position triples")
    parser.add_argument("--object-weight", type=float, default=4.0)
    parser.add_argument("--neighbour-weight", type=float, default=1.0,
                        help="loss weight of the background tokens next to an object's (an extra band or a border "
                             "drawn past the shape's edge lands there); object tokens weigh --object-weight, the rest 1")
    parser.add_argument("--ema-decay", type=float, default=0.0,
                        help="keep an exponential moving average of the adapter's weights (diffusers' EMAModel) and "
                             "save it instead of the last step's; 0: off")
    parser.add_argument("--low-noise-share", type=float, default=0.0,
                        help="share of training samples whose noise level is drawn below 0.4 (where a style's "
                             "fine detail is drawn) instead of over the whole range")
    parser.add_argument("--caption-dropout", type=float, default=0.1,
                        help="share of samples trained on the empty prompt (a styled scene as the target), as in the base "
                             "training: true CFG's unconditional call runs through the adapter too, and one it never "
                             "trained pulls the colours off (docs/tiny-shapes.md, 'Styles')")
    parser.add_argument("--evaluate", action="store_true", help="judge the adapter on held-out prompts after training")
    parser.add_argument("--vae-ceiling", action="store_true",
                        help="judge the exact styled drawings of the held-out prompts after the VAE alone (no "
                             "adapter, no transformer; no training) and record it: what an adapter can reach through this decoder")
    parser.add_argument("--evaluate-only", action="store_true",
                        help="judge the adapter already in --output (no training); its record gets the figures")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="the adapter's strength in the evaluation (the catalog's default_scale for this style)")
    parser.add_argument("--prompts", choices=("held-out", "tuning"), default="held-out",
                        help="the evaluation's prompts: held-out triples (the figures), or trained ones (to choose a "
                             "setting such as --scale without looking at the held-out figures); recorded under "
                             "'evaluation' or 'tuning_evaluation'")
    args = parser.parse_args(argv)
    batch = [int(b) for b in args.batch.split(",")]
    buckets = len(args.buckets.split(","))
    if len(batch) not in (1, buckets):
        parser.error(f"--batch: one number, or one per --buckets entry ({buckets}); got {args.batch!r}")
    args.batch = batch * buckets if len(batch) == 1 else batch
    if args.scale != 1.0 and not args.evaluate_only:
        parser.error("--scale: only with --evaluate-only (a run's own --evaluate judges the adapter as trained, at 1.0)")
    return args


def load_base(path: Path):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(path, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def prepare_buckets(pipe, style: str, images: int, seed: int, canvases: list[tuple[int, int]],
                    object_weight: float = 4.0, two_shape_share: float = 0.6, neighbour_weight: float = 1.0,
                    balanced: bool = False) -> tuple[list[dict], torch.Tensor, torch.Tensor]:
    """Per canvas: packed normalised latents, caption rows, object token weights, image ids; and the
    T5 embeddings and pooled CLIP vectors of every unique caption (row 0: the empty caption)."""
    data = [generate_styled(images, style, seed + k, size, two_shape_share, balanced) for k, size in enumerate(canvases)]
    unique = [""] + sorted({caption for bucket in data for _, caption, _ in bucket})
    index = {caption: i for i, caption in enumerate(unique)}
    with torch.no_grad():
        embeds, pooled, _ = pipe.encode_prompt(unique, prompt_2=None, max_sequence_length=pipe.tokenizer_2.model_max_length)
        shift, scale = pipe.vae.config.shift_factor, pipe.vae.config.scaling_factor
        token_pixels = pipe.vae_scale_factor * 2
        buckets = []
        for (width, height), bucket in zip(canvases, data):
            pixels = np.stack([image for image, _, _ in bucket])
            latents = (encode_images(pipe.vae, pixels) - shift) * scale
            b, c, h, w = latents.shape
            background = np.array([shapes_dataset.PALETTE[s.background] for _, _, s in bucket], dtype=np.int16)
            on_object = (pixels.astype(np.int16) != background[:, None, None, :]).any(-1)
            cells = on_object.reshape(b, h * 4 // token_pixels, token_pixels, w * 4 // token_pixels, token_pixels)
            tokens = cells.any((2, 4))  # (b, token rows, token columns): a token with object pixels
            # an object token and its 8 neighbours: where a band or border drawn past a shape's edge lands
            around = torch.nn.functional.max_pool2d(torch.from_numpy(tokens).float(), 3, stride=1, padding=1).numpy() > 0
            weights = np.where(tokens, object_weight, np.where(around, neighbour_weight, 1.0))
            weights = weights.reshape(b, -1).astype(np.float32)
            buckets.append(dict(packed=pipe._pack_latents(latents, b, c, h, w), weights=torch.from_numpy(weights),
                                rows=torch.tensor([index[caption] for _, caption, _ in bucket]),
                                img_ids=pipe._prepare_latent_image_ids(b, h // 2, w // 2, "cpu", torch.float32)))
    return buckets, embeds, pooled


def train(pipe, buckets: list[dict], embeds: torch.Tensor, pooled: torch.Tensor, args: argparse.Namespace) -> dict:
    """Train the LoRA; returns its state dict (PEFT keys) and the loss curve's ends."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    torch.manual_seed(args.seed)
    transformer = pipe.transformer
    transformer.requires_grad_(False)
    transformer.add_adapter(LoraConfig(r=args.rank, lora_alpha=args.rank, init_lora_weights="gaussian",
                                       lora_dropout=args.lora_dropout,
                                       target_modules=[m for m in TARGET_MODULES if m in LAYER_SETS[args.layers]]))
    transformer.train()
    params = [p for p in transformer.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    ema = None
    if args.ema_decay > 0:
        from diffusers.training_utils import EMAModel

        ema = EMAModel(params, decay=args.ema_decay)
    scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
    sigmas_table = scheduler.sigmas[: scheduler.config.num_train_timesteps].clone()
    gen = torch.Generator().manual_seed(args.seed)
    txt_ids = torch.zeros(embeds.shape[1], 3)
    losses = []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, warmup=50)
        loss = 0.0
        for bucket, batch in zip(buckets, args.batch):
            idx = torch.randint(0, len(bucket["packed"]), (batch,), generator=gen)
            sigma = sigmas_table[torch.randint(0, len(sigmas_table), (batch,), generator=gen)]
            if args.low_noise_share > 0:  # no extra draws otherwise: earlier adapters stay reproducible
                low = torch.rand(batch, generator=gen) < args.low_noise_share
                sigma = torch.where(low, sigma * LOW_NOISE, sigma)
            x0 = bucket["packed"][idx]
            noise = torch.randn(x0.shape, generator=gen)
            s = sigma.view(-1, 1, 1)
            rows = bucket["rows"][idx]
            rows = torch.where(torch.rand(batch, generator=gen) < args.caption_dropout, 0, rows)  # row 0: ""
            pred = transformer(hidden_states=(1 - s) * x0 + s * noise, timestep=sigma, pooled_projections=pooled[rows],
                               encoder_hidden_states=embeds[rows], txt_ids=txt_ids, img_ids=bucket["img_ids"],
                               return_dict=False)[0]
            weights = bucket["weights"][idx]
            loss = loss + ((pred - (noise - x0)) ** 2).mean(-1).mul(weights).sum() / weights.sum() / len(buckets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if ema is not None:
            ema.step(params)
        losses.append(loss.item())
        if step % 50 == 0 or step == args.steps - 1:
            print(json.dumps({"step": step, "loss": round(float(np.mean(losses[-50:])), 5)}), flush=True)
    transformer.eval()
    if ema is not None:
        ema.copy_to(params)
    return {"state_dict": get_peft_model_state_dict(transformer),
            "loss_first_50": float(np.mean(losses[:50])), "loss_last_50": float(np.mean(losses[-50:]))}


#: the evaluation's prompt sets: (single-shape, two-shape) scenes, and the key of the record that keeps their figures
PROMPT_SETS = {"held-out": (shapes_dataset.held_out_prompts, shapes_dataset.held_out_two_shape_prompts),
               "tuning": (shapes_dataset.tuning_prompts, shapes_dataset.tuning_two_shape_prompts)}
RECORD_KEY = {"held-out": "evaluation", "tuning": "tuning_evaluation"}


def evaluate_styles(pipe, styles: tuple[str, ...], seed: int = 0, canvases=shapes_dataset.CANVASES,
                    every: int = 1, prompts: str = "held-out") -> dict[str, dict]:
    """Judge ``pipe`` as it is (an adapter loaded or none) on the held-out prompts (or the tuning
    ones; ``every``-th of them), on ``canvases``: single-shape (110) and two-shape (100) scenes, 12
    steps, true CFG 3.0 as the app runs them, each image drawn once and read as each of ``styles``.
    Per style, bucket and kind: the share with the style applied, with every base attribute right,
    and with both."""
    defaults = json.loads((BASE / "demo_defaults.json").read_text())
    figures: dict[str, dict] = {style: {} for style in styles}
    singles, pairs = PROMPT_SETS[prompts]
    for width, height in canvases:
        for kind, scenes in (("single", singles()[::every]), ("two", pairs()[::every])):
            verdicts: dict[str, list] = {style: [] for style in styles}
            for i in range(0, len(scenes), 32):
                chunk = scenes[i:i + 32]
                generators = [torch.Generator("cpu").manual_seed(seed + i + j) for j in range(len(chunk))]
                with torch.no_grad():
                    images = pipe(prompt=[s.caption for s in chunk], negative_prompt=[""] * len(chunk),
                                  generator=generators, width=width, height=height,
                                  num_inference_steps=defaults.get("num_inference_steps", 12),
                                  true_cfg_scale=defaults.get("true_cfg_scale", 3.0),
                                  max_sequence_length=pipe.tokenizer_2.model_max_length).images
                for style in styles:
                    verdicts[style] += [judge_styled(scene, image, style) for scene, image in zip(chunk, images)]
            for style, read in verdicts.items():
                figures[style][f"{width}x{height} {kind}"] = figure = {
                    "n": len(read), "style": float(np.mean([v["style"] for v in read])),
                    "base_all": float(np.mean([v["all"] for v in read])),
                    "both": float(np.mean([v["style"] and v["all"] for v in read]))}
                print(json.dumps({style: {f"{width}x{height} {kind}": figure}}), flush=True)
    return figures


def evaluate_style(pipe, style: str, seed: int = 0, canvases=shapes_dataset.CANVASES, every: int = 1,
                   prompts: str = "held-out") -> dict:
    """:func:`evaluate_styles` for the one ``style`` whose adapter ``pipe`` has loaded."""
    return evaluate_styles(pipe, (style,), seed, canvases, every, prompts)[style]


def vae_ceiling(vae, style: str, canvases=shapes_dataset.CANVASES, every: int = 1) -> dict[str, dict]:
    """The judge on the held-out prompts' exact ``style`` drawings after ``vae`` encodes and decodes them:
    the figures an adapter would reach if it drew every latent perfectly. Per bucket and kind, as
    :func:`evaluate_styles` reports them."""
    figures = {}
    for width, height in canvases:
        for kind, scenes in (("single", shapes_dataset.held_out_prompts()[::every]),
                             ("two", shapes_dataset.held_out_two_shape_prompts()[::every])):
            read = []
            for i in range(0, len(scenes), 32):
                chunk = scenes[i:i + 32]
                # (batch, 3, height, width) in [-1, 1], as the pipeline's image processor hands the VAE
                drawn = torch.stack([torch.from_numpy(np.asarray(render_styled(scene, style, (width, height))))
                                     .permute(2, 0, 1).float() / 127.5 - 1 for scene in chunk])
                with torch.no_grad():
                    decoded = vae.decode(vae.encode(drawn).latent_dist.mode()).sample
                images = [Image.fromarray(((x.permute(1, 2, 0).numpy() + 1) * 127.5).clip(0, 255).astype(np.uint8))
                          for x in decoded]
                read += [judge_styled(scene, image, style) for scene, image in zip(chunk, images)]
            figures[f"{width}x{height} {kind}"] = {
                "n": len(read), "style": float(np.mean([v["style"] for v in read])),
                "base_all": float(np.mean([v["all"] for v in read])),
                "both": float(np.mean([v["style"] and v["all"] for v in read]))}
    return figures


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    started = time.perf_counter()
    pipe = load_base(args.base)
    if args.evaluate_only or args.vae_ceiling:
        record_path = args.output / f"{args.style}.json"
        record = json.loads(record_path.read_text()) if record_path.is_file() else {}
        if args.vae_ceiling:
            record["vae_ceiling"] = vae_ceiling(pipe.vae, args.style)
            print(json.dumps(record["vae_ceiling"]), flush=True)
        if args.evaluate_only:
            pipe.load_lora_weights(str(args.output / f"{args.style}.safetensors"), adapter_name=args.style)
            pipe.set_adapters([args.style], [args.scale])
            record[RECORD_KEY[args.prompts]] = {"scale": args.scale,
                                                **evaluate_style(pipe, args.style, prompts=args.prompts)}
        record_path.write_text(json.dumps(record, indent=1) + "\n")
        return
    canvases = [tuple(int(v) for v in label.split("x")) for label in args.buckets.split(",")]
    buckets, embeds, pooled = prepare_buckets(pipe, args.style, args.images, args.seed, canvases, args.object_weight,
                                              args.two_shape_share, args.neighbour_weight, args.balance_pairs)
    prepared = time.perf_counter()
    trained = train(pipe, buckets, embeds, pooled, args)
    args.output.mkdir(parents=True, exist_ok=True)
    save_dtype = getattr(torch, args.save_dtype)
    state_dict = {key: value.to(save_dtype) for key, value in trained["state_dict"].items()}
    type(pipe).save_lora_weights(args.output, transformer_lora_layers=state_dict,
                                 weight_name=f"{args.style}.safetensors")
    finished = time.perf_counter()
    record = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "timings": {"data_s": round(prepared - started, 1), "train_s": round(finished - prepared, 1),
                          "total_s": round(finished - started, 1)},
              "loss_first_50": trained["loss_first_50"], "loss_last_50": trained["loss_last_50"],
              "bytes": (args.output / f"{args.style}.safetensors").stat().st_size, "torch": torch.__version__}
    print(json.dumps(record["timings"]), flush=True)
    (args.output / f"{args.style}.json").write_text(json.dumps(record, indent=1) + "\n")
    if args.evaluate:  # judge what was saved: the float16 file's rounding included
        with torch.no_grad():
            for name, param in pipe.transformer.named_parameters():
                if ".lora_" in name:
                    param.copy_(param.to(save_dtype))
        record[RECORD_KEY[args.prompts]] = {"scale": 1.0, **evaluate_style(pipe, args.style, prompts=args.prompts)}
        (args.output / f"{args.style}.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
