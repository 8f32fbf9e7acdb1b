#!/usr/bin/env python
"""Train the tiny-shapes FluxPipeline on CPU: a small VAE, then a small Flux transformer.

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 python scripts/train_tiny_model.py --output assets/models/tiny-shapes --seed 0

Stages (each with a tqdm bar; losses go to ``<output>/train_log.jsonl``):

1. render ``--num-images`` captioned scenes (tpu_demo.shapes_dataset; held-out triples never appear);
2. train the AutoencoderKL (MSE + a small KL term), then set its ``shift_factor``/``scaling_factor``
   from the latent statistics;
3. encode every image (latent mean) and every caption once, with the pipeline's own
   ``encode_prompt`` (frozen random CLIP + T5 with whole-word pieces) and ``_pack_latents``;
4. train the FluxTransformer2DModel with the flow-matching loss on sigmas drawn from the
   pipeline's FlowMatchEulerDiscreteScheduler (x_t = (1 - s) x0 + s noise, target noise - x0),
   keeping an EMA of its weights, which is what gets saved;
5. ``save_pretrained(..., safe_serialization=True)`` the whole pipeline plus ``demo_defaults.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from tpu_demo import shapes_dataset  # noqa: E402
from tpu_demo.shapes_model import MAX_SEQUENCE_LENGTH, build_shapes_pipeline  # noqa: E402

#: Inference defaults recorded beside the weights (measured best; see docs/tiny-shapes.md).
DEMO_DEFAULTS = {"height": 64, "width": 64, "num_inference_steps": 12, "guidance_scale": 1.0,
                 "max_sequence_length": MAX_SEQUENCE_LENGTH}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", type=Path, default=Path("assets/models/tiny-shapes"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--num-images", type=int, default=24000)
    p.add_argument("--vae-steps", type=int, default=1500)
    p.add_argument("--vae-batch-size", type=int, default=32)
    p.add_argument("--vae-lr", type=float, default=2e-3)
    p.add_argument("--steps", type=int, default=3000, help="transformer steps")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ema", type=float, default=0.999)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="every N transformer steps, save the pipeline with the EMA weights to <output>.ckpt")
    p.add_argument("--init-transformer", type=Path, default=None,
                   help="continue training: start the transformer from this saved pipeline's transformer")
    p.add_argument("--save-vae", type=Path, default=None, help="also save the trained VAE's state dict here")
    p.add_argument("--load-vae", type=Path, default=None,
                   help="development shortcut: load a VAE state dict (from --save-vae) instead of training one")
    return p.parse_args(argv)


def to_tensor(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def lr_at(step: int, total: int, base: float, warmup: int = 100) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    return base * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


class Logger:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("w")

    def __call__(self, **record):
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()


def train_vae(vae, images: np.ndarray, args, log, gen: torch.Generator):
    vae.train()
    opt = torch.optim.AdamW(vae.parameters(), lr=args.vae_lr, weight_decay=0.0)
    bar = tqdm(range(args.vae_steps), desc="vae", dynamic_ncols=True)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.vae_steps, args.vae_lr)
        idx = torch.randint(0, len(images), (args.vae_batch_size,), generator=gen)
        x = to_tensor(images[idx.numpy()])
        posterior = vae.encode(x).latent_dist
        recon = vae.decode(posterior.sample(generator=gen)).sample
        mse = F.mse_loss(recon, x)
        kl = posterior.kl().mean() / posterior.mean[0].numel()
        loss = mse + 1e-4 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % args.log_every == 0 or step == args.vae_steps - 1:
            log(stage="vae", step=step, loss=loss.item(), mse=mse.item(), kl=kl.item())
            bar.set_postfix(mse=f"{mse.item():.4f}")
    vae.eval()


@torch.no_grad()
def encode_images(vae, images: np.ndarray, batch: int = 256) -> torch.Tensor:
    out = []
    for i in tqdm(range(0, len(images), batch), desc="encode images", dynamic_ncols=True):
        out.append(vae.encode(to_tensor(images[i:i + batch])).latent_dist.mean)
    return torch.cat(out)


@torch.no_grad()
def encode_captions(pipe, captions: list[str], batch: int = 512):
    unique = sorted(set(captions))
    embeds, pooled = [], []
    for i in tqdm(range(0, len(unique), batch), desc="encode captions", dynamic_ncols=True):
        e, p, _ = pipe.encode_prompt(unique[i:i + batch], prompt_2=None, max_sequence_length=MAX_SEQUENCE_LENGTH)
        embeds.append(e)
        pooled.append(p)
    index = {c: i for i, c in enumerate(unique)}
    rows = torch.tensor([index[c] for c in captions])
    return torch.cat(embeds), torch.cat(pooled), rows


def train_transformer(pipe, packed: torch.Tensor, embeds, pooled, rows, img_ids, txt_ids, args, log,
                      gen: torch.Generator):
    transformer = pipe.transformer
    transformer.train()
    ema = copy.deepcopy(transformer).eval().requires_grad_(False)
    opt = torch.optim.AdamW(transformer.parameters(), lr=args.lr, weight_decay=0.01)
    # Sigmas of the pipeline's own scheduler (its 1000 training timesteps, shift applied).
    scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
    sigmas_table = scheduler.sigmas[: scheduler.config.num_train_timesteps].clone()
    bar = tqdm(range(args.steps), desc="transformer", dynamic_ncols=True)
    running = None
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr)
        idx = torch.randint(0, len(packed), (args.batch_size,), generator=gen)
        x0 = packed[idx]
        r = rows[idx]
        sigma = sigmas_table[torch.randint(0, len(sigmas_table), (args.batch_size,), generator=gen)]
        noise = torch.randn(x0.shape, generator=gen)
        s = sigma.view(-1, 1, 1)
        xt = (1 - s) * x0 + s * noise
        pred = transformer(hidden_states=xt, timestep=sigma, pooled_projections=pooled[r],
                           encoder_hidden_states=embeds[r], txt_ids=txt_ids, img_ids=img_ids,
                           return_dict=False)[0]
        loss = F.mse_loss(pred, noise - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(transformer.parameters(), 1.0)
        opt.step()
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for pe, pt in zip(ema.parameters(), transformer.parameters()):
                pe.lerp_(pt, 1 - decay)
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % args.log_every == 0 or step == args.steps - 1:
            log(stage="transformer", step=step, loss=loss.item(), loss_smooth=running, lr=opt.param_groups[0]["lr"])
            bar.set_postfix(loss=f"{running:.4f}")
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and step + 1 < args.steps:
            ckpt = args.output.with_name(args.output.name + ".ckpt")
            type(pipe)(**{**pipe.components, "transformer": ema}).save_pretrained(ckpt, safe_serialization=True)
            (ckpt / "demo_defaults.json").write_text(json.dumps(DEMO_DEFAULTS, indent=2) + "\n")
            log(stage="checkpoint", step=step + 1, path=str(ckpt))
    return ema


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    # One generator per stage, so --load-vae continues exactly like a full run would.
    vae_gen = torch.Generator().manual_seed(args.seed)
    transformer_gen = torch.Generator().manual_seed(args.seed + 1)
    args.output.mkdir(parents=True, exist_ok=True)
    log = Logger(args.output / "train_log.jsonl")
    timings = {}
    t0 = time.perf_counter()

    pipe = build_shapes_pipeline(seed=args.seed)
    data = shapes_dataset.generate(args.num_images, seed=args.seed)
    images = np.stack([d[0] for d in data])
    captions = [d[1] for d in data]
    timings["dataset_s"] = time.perf_counter() - t0

    t = time.perf_counter()
    if args.load_vae:
        pipe.vae.load_state_dict(torch.load(args.load_vae))
        pipe.vae.eval()
    else:
        train_vae(pipe.vae, images, args, log, vae_gen)
    if args.save_vae:
        torch.save(pipe.vae.state_dict(), args.save_vae)
    timings["vae_s"] = time.perf_counter() - t

    t = time.perf_counter()
    latents = encode_images(pipe.vae, images)
    shift, scale = latents.mean().item(), 1.0 / latents.std().item()
    pipe.vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    latents = (latents - shift) * scale
    b, c, h, w = latents.shape
    packed = pipe._pack_latents(latents, b, c, h, w)
    img_ids = pipe._prepare_latent_image_ids(b, h // 2, w // 2, "cpu", torch.float32)
    embeds, pooled, rows = encode_captions(pipe, captions)
    txt_ids = torch.zeros(embeds.shape[1], 3)
    timings["encode_s"] = time.perf_counter() - t
    log(stage="latents", shift_factor=shift, scaling_factor=scale, shape=list(latents.shape),
        unique_captions=len(embeds))

    t = time.perf_counter()
    if args.init_transformer:
        from diffusers import FluxTransformer2DModel

        start = FluxTransformer2DModel.from_pretrained(args.init_transformer, subfolder="transformer")
        pipe.transformer.load_state_dict(start.state_dict())
    ema = train_transformer(pipe, packed, embeds, pooled, rows, img_ids, txt_ids, args, log, transformer_gen)
    pipe.transformer.load_state_dict(ema.state_dict())
    pipe.transformer.eval()
    timings["transformer_s"] = time.perf_counter() - t

    pipe.save_pretrained(args.output, safe_serialization=True)
    (args.output / "demo_defaults.json").write_text(json.dumps(DEMO_DEFAULTS, indent=2) + "\n")
    timings["total_s"] = time.perf_counter() - t0
    info = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "timings": timings,
            "torch": torch.__version__, "shift_factor": shift, "scaling_factor": scale}
    (args.output / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    log(stage="done", **timings)
    print(json.dumps(timings, indent=2))


if __name__ == "__main__":
    main()
