"""Noise that chooses what a caption leaves out: a fixed coupling of the starting noise and the
left-out attributes, for training on visitors' words.

Trained with independent noise, a caption that leaves the position out ("a red circle") has five
right answers for every starting noise, and the rectified-flow target is their average: the tiny
transformer learned to draw two to four faint copies at once and sharpen them all
(commit e91b607). Here each training sample's noise is drawn so that a
simple statistic of it names the scene's left-out values (rejection sampling: the noise stays an
exact standard normal draw, only conditioned). The answer is then one function of the noise the
model can read at the first step, and at inference the seed's noise picks one layout, with
nothing in the pipeline changed. The same idea as minibatch optimal-transport couplings in flow
matching (Tong et al. 2023; Pooladian et al. 2023), in a form a 1.8 M model reads at once.

The statistics, on the packed noise of one image (``(tokens, 16)``, the token grid of the canvas):

- **position:** the five regions of the grid (the four quadrants without the centre, and the
  centre: the tokens whose middle lies in the middle quarter of both axes) each sum channel 0,
  scaled to unit variance; an object left without a position goes to the highest region not taken
  by a named position or an earlier object;
- **size** (only where the scene left it free: one object, or two with none in the centre): the
  sign of channel 1 summed over the object's region, positive = large;
- **background:** of the backgrounds no object's colour rules out, the one whose channel (2, 3 or
  4, summed over the whole grid) is highest.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import torch

from tiny_shapes.dataset import BACKGROUNDS, POSITION_NAMES, SIZES, Scene

#: -1 in a code: not left out (the text decides, the noise is free)
FREE = -1
#: per image: position, size for two objects (FREE where named or absent), background, background mask
CODE_LENGTH = 6


def region_masks(rows: int, cols: int) -> torch.Tensor:
    """``(5, rows * cols)`` booleans: each position's tokens, in ``POSITION_NAMES`` order."""
    y = (torch.arange(rows).float() + 0.5) / rows
    x = (torch.arange(cols).float() + 0.5) / cols
    yy, xx = torch.meshgrid(y, x, indexing="ij")
    centre = ((yy - 0.5).abs() < 0.125 + 1e-6) & ((xx - 0.5).abs() < 0.125 + 1e-6)
    if not centre.any():  # a grid too coarse for a middle quarter: its middle token(s)
        centre = ((yy - 0.5).abs() <= 0.5 / rows + 1e-6) & ((xx - 0.5).abs() <= 0.5 / cols + 1e-6)
    top, left = yy < 0.5, xx < 0.5
    quadrants = {"top left": top & left, "top right": top & ~left, "bottom left": ~top & left,
                 "bottom right": ~top & ~left}
    masks = [quadrants[name] & ~centre if name != "center" else centre for name in POSITION_NAMES]
    return torch.stack([m.flatten() for m in masks])


def left_out_code(scene: Scene, named: tuple[frozenset[str], ...], background_named: bool) -> np.ndarray:
    """What the noise must name for one training image: ``CODE_LENGTH`` ints (``FREE`` = not coupled).

    ``[position 1, position 2, size 1, size 2, background, allowed backgrounds bit mask]``; a named
    position is stored as ``-2 - index`` (it is not coupled, but a left-out one must avoid it).
    """
    code = np.full(CODE_LENGTH, FREE, dtype=np.int64)
    size_free = len(scene.objects) == 1 or all(o.position != "center" for o in scene.objects)
    for i, (obj, names) in enumerate(zip(scene.objects, named)):
        index = POSITION_NAMES.index(obj.position)
        code[i] = index if "position" not in names else -2 - index
        if "size" not in names and size_free:
            code[2 + i] = SIZES.index(obj.size)
    if not background_named:
        code[4] = BACKGROUNDS.index(scene.background)
        colours = {o.colour for o in scene.objects}
        code[5] = sum(1 << k for k, name in enumerate(BACKGROUNDS) if name not in colours)
    return code


def read_noise(noise: torch.Tensor, code: torch.Tensor, regions: torch.Tensor) -> torch.Tensor:
    """Whether each of ``noise`` ``(n, tokens, 16)`` names what ``code`` asks (``(n,)`` booleans)."""
    n = noise.shape[0]
    counts = regions.sum(1).float()
    region_sums = torch.einsum("nt,rt->nr", noise[..., 0], regions.float()) / counts.sqrt()
    size_sums = torch.einsum("nt,rt->nr", noise[..., 1], regions.float())
    background_sums = noise[..., 2:5].sum(1)
    ok = torch.ones(n, dtype=torch.bool)
    taken = torch.zeros(n, 5, dtype=torch.bool)
    for i in range(2):  # named positions are taken before any left-out one is chosen
        if code[i] <= -2:
            taken[:, -2 - code[i]] = True
    for i in range(2):
        if code[i] >= 0:
            chosen = region_sums.masked_fill(taken, float("-inf")).argmax(1)
            ok &= chosen == code[i]
            taken[torch.arange(n), chosen] = True
        if code[2 + i] >= 0:
            position = code[i] if code[i] >= 0 else -2 - code[i]
            ok &= (size_sums[:, position] > 0) == bool(code[2 + i] == SIZES.index("large"))
    if code[4] >= 0:
        allowed = torch.tensor([bool(code[5] >> k & 1) for k in range(len(BACKGROUNDS))])
        ok &= background_sums.masked_fill(~allowed, float("-inf")).argmax(1) == code[4]
    return ok


def coupled_noise(codes: torch.Tensor, shape: tuple[int, int], regions: torch.Tensor,
                  generator: torch.Generator, candidates: int = 256) -> torch.Tensor:
    """Standard normal noise ``(len(codes), *shape)``, each row conditioned on naming its code."""
    out = torch.empty(len(codes), *shape)
    for row, code in enumerate(codes):
        if (code[:5] < 0).all():  # nothing left out (FREE, or a named position): plain noise
            out[row] = torch.randn(*shape, generator=generator)
            continue
        while True:
            draws = torch.randn(candidates, *shape, generator=generator)
            hits = torch.nonzero(read_noise(draws, code, regions))
            if len(hits):
                out[row] = draws[hits[0, 0]]
                break
    return out


# --- The nearest-layout coupling (the twelfth attempt) ---------------------------------------------
#
# The statistic above is a direction of the noise that has nothing to do with the image: at mid
# noise the drawing's own latent adds to channel 0 and can point elsewhere. Minibatch optimal
# transport pairs noise with the data point it is nearest to, so noise and image agree on the
# layout at every noise level, and the model's first prediction at pure noise is one layout, not
# their average. Here the candidates are the training scene with its left-out positions and sizes
# set to every other layout the training scenes allow (rendered and encoded like the scene itself;
# a random few when there are many), and the noise is drawn from the part of the Gaussian that
# points towards the scene (:func:`nearest_noise`). The background stays on plain noise: with the
# layout named, the seed already chooses it.


def _sizes_allowed(positions: tuple[str, ...], sizes: tuple[str, ...]) -> bool:
    """``tiny_shapes.dataset.sample_scene``'s rule: two shapes with one in the centre are both small."""
    return len(positions) == 1 or "center" not in positions or all(s == "small" for s in sizes)


def layout_alternatives(scene: Scene, named: tuple[frozenset[str], ...], rng, limit: int = 9) -> list[Scene]:
    """``scene`` with its left-out positions and sizes set to each other layout a training scene
    could have (at most ``limit``, drawn with ``rng`` when there are more); [] when all are named."""
    choices = []  # per object: the (position, size) pairs its caption leaves open
    for obj, names in zip(scene.objects, named):
        positions = (obj.position,) if "position" in names else POSITION_NAMES
        sizes = (obj.size,) if "size" in names else SIZES
        choices.append([(p, s) for p in positions for s in sizes])
    actual = tuple((o.position, o.size) for o in scene.objects)
    out = []
    for layout in itertools.product(*choices):
        positions, sizes = tuple(p for p, _ in layout), tuple(s for _, s in layout)
        if layout == actual or len(set(positions)) < len(positions) or not _sizes_allowed(positions, sizes):
            continue
        out.append(Scene(scene.background, tuple(replace(o, position=p, size=s)
                                                 for o, (p, s) in zip(scene.objects, layout))))
    return out if len(out) <= limit else rng.sample(out, limit)


def nearest_noise(candidates: torch.Tensor, generator: torch.Generator, draws: int = 64) -> torch.Tensor:
    """Standard normal noise of ``candidates[0]``'s shape (the training latent; the other rows are its
    alternative layouts), conditioned on pointing towards it more than towards any other.

    "Towards" is the noise's projection on each candidate's unit direction from their mean. Plain L2
    nearness would favour the layouts of smaller norm (a small shape's cell holds 0.20 of the noise,
    a large one's 0.02, measured on the shipped VAE), so the noise the model trains on would differ
    from a seed's; the unit directions give every layout about the same share (0.09-0.11 for the
    ten layouts of one shape), and the noise stays close to a standard normal draw overall.
    """
    while True:
        noise = torch.randn(draws, *candidates.shape[1:], generator=generator)
        hits = torch.nonzero(pointed_layout(noise, candidates) == 0)
        if len(hits):
            return noise[hits[0, 0]]


def pointed_layout(noise: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """For each of ``noise`` ``(n, *shape)``, the index of the candidate ``(k, *shape)`` it points
    towards most (see :func:`nearest_noise`)."""
    centred = candidates.flatten(1) - candidates.flatten(1).mean(0)
    directions = centred / centred.norm(dim=1, keepdim=True).clamp_min(1e-6)
    return (noise.flatten(1) @ directions.T).argmax(1)


__all__ = ["CODE_LENGTH", "FREE", "coupled_noise", "layout_alternatives", "left_out_code", "nearest_noise",
           "pointed_layout", "read_noise", "region_masks"]
