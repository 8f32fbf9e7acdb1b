"""The VAE stage of ``scripts/train_tiny_model.py``: train the AutoencoderKL, polish its decoder, encode.

Kept apart from the transformer stage: both are called from the one training command, and a VAE
made here is what every later stage (and the shipped pipeline) sees through its encoder.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from tiny_shapes import dataset as shapes_dataset


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 ``(n, h, w, 3)`` images -> float ``(n, 3, h, w)`` in [-1, 1], as the pipeline's VAE sees them."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def lr_at(step: int, total: int, base: float, warmup: int = 100) -> float:
    """Linear warm-up, then cosine to zero: the schedule of every stage."""
    if step < warmup:
        return base * (step + 1) / warmup
    return base * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def object_pixel_mask(images: np.ndarray, scenes) -> np.ndarray:
    """uint8 ``(n, h, w)``: 1 on the pixels within 2 px of an object (differs from the scene's background)."""
    background = np.array([shapes_dataset.PALETTE[s.background] for s in scenes], dtype=np.int16)
    on_object = torch.from_numpy((images.astype(np.int16) != background[:, None, None, :]).any(-1))
    near = F.max_pool2d(on_object[:, None].float(), kernel_size=5, stride=1, padding=2)[:, 0]
    return near.to(torch.uint8).numpy()


def area_batch(base: int, height: int, width: int) -> int:
    """A whole-image batch that costs about as much as ``base`` 64x64 images (at least 4)."""
    return max(4, round(base * 64 * 64 / (height * width)))


def weighted_mse(recon: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Per-pixel squared error averaged with ``weight`` ``(n, 1, h, w)`` over pixels and channels."""
    return ((recon.float() - x) ** 2 * weight).sum() / (weight.sum() * x.shape[1])


def train_vae(vae, crop_sets: list[tuple[np.ndarray, np.ndarray]], full_sets: list[tuple[np.ndarray, np.ndarray]],
              args, log, gen: torch.Generator):
    """``*_sets``: (uint8 images, object pixel masks) per bucket. Crop steps take crops of the
    ``crop_sets`` buckets' images in turn (the VAE is convolutional: a 32x32 crop costs a quarter of
    a 64x64 image); full steps take whole images of the ``full_sets`` buckets in turn, the batch
    scaled by the image area (so each costs about as much as a 64x64 batch).

    The reconstruction loss weighs the pixels on and around objects ``--vae-object-weight`` times the
    background's: what tells a small circle from a small square is a few edge pixels, and a plain mean
    spends most of its gradient on flat background.
    """
    vae.train()
    opt = torch.optim.AdamW(vae.parameters(), lr=args.vae_lr, weight_decay=0.0)
    bar = tqdm(range(args.vae_steps), desc="vae", dynamic_ncols=True, mininterval=5)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.vae_steps, args.vae_lr)
        full = step >= args.vae_steps - args.vae_full_steps
        sets = full_sets if full else crop_sets
        bucket, mask = sets[step % len(sets)]
        height, width = bucket.shape[1:3]
        batch = area_batch(args.vae_batch_size, height, width) if full else args.vae_batch_size
        idx = torch.randint(0, len(bucket), (batch,), generator=gen)
        x = to_tensor(bucket[idx.numpy()])
        weight = 1.0 + args.vae_object_weight * torch.from_numpy(mask[idx.numpy()]).float()[:, None]
        if not full:
            top = int(torch.randint(0, height - args.vae_crop + 1, (1,), generator=gen))
            left = int(torch.randint(0, width - args.vae_crop + 1, (1,), generator=gen))
            x = x[:, :, top:top + args.vae_crop, left:left + args.vae_crop]
            weight = weight[:, :, top:top + args.vae_crop, left:left + args.vae_crop]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            posterior = vae.encode(x).latent_dist
            recon = vae.decode(posterior.sample(generator=gen)).sample
        mse = weighted_mse(recon, x, weight)
        kl = posterior.kl().float().mean() / posterior.mean[0].numel()
        loss = mse + 1e-4 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % args.log_every == 0 or step == args.vae_steps - 1:
            log(stage="vae", step=step, loss=loss.item(), mse=mse.item(), kl=kl.item(), full=full)
            bar.set_postfix(mse=f"{mse.item():.4f}")
    vae.eval()


def train_decoder(vae, full_sets: list[tuple[np.ndarray, np.ndarray]], args, log, gen: torch.Generator):
    """Fine-tune the decoder alone on whole images of every bucket in turn, the encoder frozen.

    GroupNorm and the mid-block attention span the whole canvas, so a VAE trained mostly on 64x64
    crops and scenes decoded small shapes on a large gray canvas with a halo (its own 128x128
    reconstructions judged right in 92.7%, below the 95% target for any model; 97.3% after 400 of
    these steps, commit 4097b95). The latents are
    the encoder's means, exactly what the transformer is trained on and which this phase leaves
    unchanged; the pixels on and next to objects weigh ``--vae-decoder-object-weight`` more.
    """
    vae.requires_grad_(False)
    vae.decoder.requires_grad_(True)
    opt = torch.optim.AdamW(vae.decoder.parameters(), lr=args.vae_decoder_lr, weight_decay=0.0)
    steps = args.vae_decoder_steps
    bar = tqdm(range(steps), desc="vae decoder", dynamic_ncols=True, mininterval=5)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, args.vae_decoder_lr, warmup=20)
        images, mask = full_sets[step % len(full_sets)]
        idx = torch.randint(0, len(images), (area_batch(args.vae_batch_size, *images.shape[1:3]),), generator=gen)
        x = to_tensor(images[idx.numpy()])
        weight = 1.0 + args.vae_decoder_object_weight * torch.from_numpy(mask[idx.numpy()]).float()[:, None]
        with torch.no_grad():
            latents = vae.encode(x).latent_dist.mean
        mse = weighted_mse(vae.decode(latents).sample, x, weight)
        opt.zero_grad(set_to_none=True)
        mse.backward()
        opt.step()
        if step % args.log_every == 0 or step == steps - 1:
            log(stage="vae_decoder", step=step, mse=mse.item(), bucket=f"{images.shape[2]}x{images.shape[1]}")
            bar.set_postfix(mse=f"{mse.item():.4f}")
    vae.requires_grad_(True)
    vae.eval()


@torch.no_grad()
def encode_images(vae, images: np.ndarray, batch: int = 256) -> torch.Tensor:
    """The latent means of ``images`` (what the transformer learns to make), in batches."""
    out = []
    for i in tqdm(range(0, len(images), batch), desc="encode images", dynamic_ncols=True):
        out.append(vae.encode(to_tensor(images[i:i + batch])).latent_dist.mean)
    return torch.cat(out)
