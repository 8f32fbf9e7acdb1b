"""The transformer stage of ``scripts/train_tiny_model.py``: caption tokens, training batches, the
rectified-flow loss and the training loop (the VAE stage is :mod:`tiny_shapes.vae_training`).

The transformer learns the velocity ``noise - x0`` at ``x_t = (1 - s) x0 + s noise`` on every bucket
at once, together with both text encoders unless they are frozen; an exponential moving average of
the weights is what gets saved.
"""

from __future__ import annotations

import copy
import random
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from tiny_shapes import dataset as shapes_dataset
from tiny_shapes.coupling import FREE, coupled_noise, layout_alternatives, nearest_noise
from tiny_shapes.vae_training import lr_at


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


def sample_sigmas(kind: str, table: torch.Tensor, batch: int, gen: torch.Generator) -> torch.Tensor:
    """Noise levels of one batch: ``uniform`` over the scheduler's training sigmas ``table``, or SD3's
    ``logit-normal`` (sigmoid of a standard normal: most samples at mid noise, few near 0 or 1;
    commit 5fd955b, measures what it buys)."""
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
                      gen: torch.Generator, on_checkpoint: Callable[[Trainable, int], None] | None = None) -> Trainable:
    """``buckets``: per canvas, ``packed`` latents, ``token_weights``, caption ``rows``, ``img_ids``,
    ``batch`` size and ``weight``. ``--bucket-mixing sum`` (default): each step a batch of every bucket,
    one loss summed with ``weight`` as shares, so every update pulls the shared weights towards all
    canvases at once; ``draw``: each step draws one bucket (``weight``: share of the steps), then a batch of it.
    Every ``--checkpoint-every`` steps ``on_checkpoint(ema, steps done)`` is called (the script saves one)."""
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
        if on_checkpoint and args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and step + 1 < args.steps:
            on_checkpoint(ema, step + 1)
    return ema
