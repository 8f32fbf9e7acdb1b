"""Deterministic pixel analysis of single-shape scenes, and the evaluation of a pipeline with it.

:func:`analyze` reads back from an image what a single-shape caption claims: the background
colour (majority of the border pixels, nearest named colour), the object's colour (majority of
the non-background pixels, nearest named colour), its position (centre of the bounding box of
the largest connected blob of that colour: centre or one of four quadrants), its size (bounding
box side) and its shape (fill ratio of the bounding box: square ~1.0, circle ~0.785,
triangle ~0.5).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from tiny_shapes.dataset import BACKGROUNDS, IMAGE_SIZE, OBJECT_COLOURS, PALETTE, Scene

METRICS = ("background", "colour", "position", "shape", "size")
#: Accuracy targets on the held-out prompts (size is reported, not targeted).
TARGETS = {"background": 0.95, "colour": 0.90, "position": 0.80, "shape": 0.70}

def largest_blob(mask: np.ndarray) -> np.ndarray:
    """The largest 4-connected region of a boolean mask (a flood fill; the masks are at most 128x128)."""
    seen = np.zeros_like(mask, dtype=bool)
    best: list[tuple[int, int]] = []
    height, width = mask.shape
    for start in zip(*np.nonzero(mask)):
        if seen[start]:
            continue
        seen[start] = True
        region, frontier = [start], [start]
        while frontier:
            y, x = frontier.pop()
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < height and 0 <= nx < width and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    region.append((ny, nx))
                    frontier.append((ny, nx))
        if len(region) > len(best):
            best = region
    largest = np.zeros_like(mask, dtype=bool)
    if best:
        ys, xs = zip(*best)
        largest[list(ys), list(xs)] = True
    return largest


_OBJECT_RGB = np.array([PALETTE[c] for c in OBJECT_COLOURS], dtype=np.float32)
_BACKGROUND_RGB = np.array([PALETTE[c] for c in BACKGROUNDS], dtype=np.float32)


def _nearest(pixels: np.ndarray, table: np.ndarray) -> np.ndarray:
    d = ((pixels[..., None, :].astype(np.float32) - table) ** 2).sum(-1)
    return d.argmin(-1)


@dataclass
class Analysis:
    background: str
    colour: str | None
    position: str | None
    shape: str | None
    size: str | None
    fill_ratio: float


def analyze(image) -> Analysis:
    """What a 64x64 single-shape image shows (see the module docstring)."""
    pixels = np.asarray(image.convert("RGB") if hasattr(image, "convert") else image)[..., :3].astype(np.float32)
    h, w, _ = pixels.shape
    border = np.concatenate([pixels[:2].reshape(-1, 3), pixels[-2:].reshape(-1, 3),
                             pixels[:, :2].reshape(-1, 3), pixels[:, -2:].reshape(-1, 3)])
    background = BACKGROUNDS[np.bincount(_nearest(border, _BACKGROUND_RGB), minlength=len(BACKGROUNDS)).argmax()]
    bg_rgb = np.array(PALETTE[background], dtype=np.float32)
    # Object pixels: clearly away from the background colour, labelled with the nearest object colour.
    far = np.sqrt(((pixels.astype(np.float32) - bg_rgb) ** 2).sum(-1)) > 60
    labels = _nearest(pixels, _OBJECT_RGB)
    if far.sum() < 4:
        return Analysis(background, None, None, None, None, 0.0)
    counts = np.bincount(labels[far], minlength=len(OBJECT_COLOURS))
    colour_index = counts.argmax()
    colour = OBJECT_COLOURS[colour_index]
    # The object's pixels: nearer to its colour than to the background (a halfway threshold, so
    # blurred edges count the same for every shape).
    fg_rgb = _OBJECT_RGB[colour_index]
    mask = ((pixels - fg_rgb) ** 2).sum(-1) < ((pixels - bg_rgb) ** 2).sum(-1)
    if not mask.any():
        return Analysis(background, colour, None, None, None, 0.0)
    mask = largest_blob(mask)
    ys, xs = np.nonzero(mask)
    x0, x1, y0, y1 = xs.min(), xs.max(), ys.min(), ys.max()
    bw, bh = x1 - x0 + 1, y1 - y0 + 1
    fill = float(mask.sum()) / float(bw * bh)
    cx, cy = (x0 + x1) / 2 * IMAGE_SIZE / w, (y0 + y1) / 2 * IMAGE_SIZE / h
    half = IMAGE_SIZE / 2
    if abs(cx - half) < 8 and abs(cy - half) < 8:
        position = "center"
    else:
        position = ("top " if cy < half else "bottom ") + ("left" if cx < half else "right")
    shape = "triangle" if fill < 0.64 else "circle" if fill < 0.89 else "square"
    size = "large" if max(bw, bh) * IMAGE_SIZE / w > 20 else "small"
    return Analysis(background, colour, position, shape, size, fill)


def score(scene: Scene, analysis: Analysis) -> dict[str, bool]:
    """Per-metric correctness of ``analysis`` against a single-shape ``scene``."""
    obj = scene.objects[0]
    return {
        "background": analysis.background == scene.background,
        "colour": analysis.colour == obj.colour,
        "position": analysis.position == obj.position,
        "shape": analysis.shape == obj.shape,
        "size": analysis.size == obj.size,
    }


def evaluate_pipeline(pipe, scenes: list[Scene], seed: int = 0, batch_size: int = 16, **call_kwargs) -> dict:
    """Generate one image per scene caption (seeded per prompt) and return accuracies per metric."""
    import torch

    kwargs = dict(height=IMAGE_SIZE, width=IMAGE_SIZE)
    kwargs.update(call_kwargs)
    results, images = [], []
    start = time.perf_counter()
    for i in range(0, len(scenes), batch_size):
        chunk = scenes[i:i + batch_size]
        generators = [torch.Generator("cpu").manual_seed(seed + i + j) for j in range(len(chunk))]
        call = dict(kwargs)
        if isinstance(call.get("negative_prompt"), str):  # one per prompt of the batch
            call["negative_prompt"] = [call["negative_prompt"]] * len(chunk)
        out = pipe(prompt=[s.caption for s in chunk], generator=generators, **call).images
        for scene, image in zip(chunk, out):
            results.append(score(scene, analyze(image)))
            images.append(image)
    accuracy = {m: float(np.mean([r[m] for r in results])) for m in METRICS}
    return {"accuracy": accuracy, "n": len(scenes), "seconds": time.perf_counter() - start, "images": images,
            "results": results}


def markdown_table(rows: dict[str, dict[str, float]], n: int) -> str:
    """A markdown table of accuracies, one row per named model, with the targets as the last row."""
    lines = [f"| model (n={n}) | " + " | ".join(METRICS) + " |", "|---" * (len(METRICS) + 1) + "|"]
    for name, acc in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{100 * acc[m]:.1f}%" for m in METRICS) + " |")
    lines.append("| target | " + " | ".join(f">= {100 * TARGETS[m]:.0f}%" if m in TARGETS else "-" for m in METRICS) + " |")
    return "\n".join(lines)
