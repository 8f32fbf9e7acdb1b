"""Tiny styles for tiny-shapes: how a styled scene is drawn, and the judge that reads a style back.

A style changes how every shape is filled and nothing else (colour, shape, position, size and
background stay as the caption says), so the style adapters (LoRA on the transformer,
scripts/train_tiny_style.py) are trained on the same captions as the base weights:

- ``outline``: only a border of each shape is drawn (3 px on a small shape, 4 px on a large one);
  its inside shows the background;
- ``striped``: horizontal bands of background cut across each shape (4 px bands on a large
  shape, one 5 px band through a small one, the shape's top and bottom rows kept, so its outline
  is the plain shape's);
- ``shaded``: each shape lit from above, every row of it a mix of its colour with white at the top
  and with black at the bottom (:data:`SHADE` of white on the first row, of black on the last),
  so it reads as a solid shape with light falling on it.

The judge (:func:`judge_styled`) answers two questions of a generated image. It first finds the
scene's objects: regions of pixels clearly off the background (striped: a column's bands joined),
each named by the object colour most of its pixels are nearest to, the largest as many as the
caption names. *Style applied*: ``outline``: the inside of each object (its silhouette shrunk by
the border) is mostly background; ``striped``: some inner row of each object is mostly background
while rows above and below it are drawn; ``shaded``: the object's top third is lighter than its bottom
third by :data:`SHADED_MIN_STEP`. *Base attributes*: the image is restored to a plain
scene (each object's silhouette, the convex hull of its pixels, painted in its colour: circles,
squares and triangles are convex, and a ring's breaks or a band's blurred ends do not move the
hull; for ``striped``, the shape whose exact striped drawing the pixels match, when one does) and
read by the strict judge of the base model (:func:`tiny_shapes.judge.judge_image`).
"""

from __future__ import annotations

import random

import numpy as np
from PIL import Image, ImageDraw

from tiny_shapes.dataset import IMAGE_SIZE, OBJECT_COLOURS, PALETTE, SIDE, Scene, layout, sample_scene
from tiny_shapes.judge import _OBJECT_RGB, _dilate, _nearest, _pixels_and_background, blobs, judge_image

STYLES = ("outline", "striped", "shaded")
#: outline: border width in pixels per shape side: the inside of a small shape must stay wide enough
#: (10 px) for the VAE to keep it open
BORDER = {14: 3, 26: 4}
#: striped: band height per shape side (pixels); chosen so that the first and last rows are drawn
BAND = {14: 5, 26: 4}
#: striped: the judge joins bands at most this many rows apart in a column into one object
MAX_STRIPE_GAP = 6
#: the judge's closing (pixels) of a drawing's silhouette: the VAE's blur breaks thin lines
CLOSING = 2
#: striped: a drawing this close (IoU) to one shape's exact striped drawing is that shape. Above the
#: 0.77 at which two shapes' striped drawings in one box overlap (a circle in a square), so one match
#: never names two shapes (tested)
STRIPED_MIN_IOU = 0.85
#: shaded: the share of white mixed into a shape's first row and of black into its last (rows between
#: linear). 0.25 keeps every row of every colour at least 74 RGB units from each background it is drawn
#: on (a green shape lit on gray is the closest, then purple and black on gray): the judge's object
#: pixels are those 60 units off the background
SHADE = 0.25
#: shaded: the judge's least luminance step from an object's top third to its bottom third (the
#: exact drawing's is about 37 on every colour; a plain shape through the VAE shows a few units)
SHADED_MIN_STEP = 15.0


def shape_mask(shape: str, box: tuple[int, int, int, int], size: tuple[int, int]) -> np.ndarray:
    """The plain shape's pixels (boolean, ``(height, width)``), drawn as ``dataset.render`` draws it."""
    image = Image.new("1", size, 0)
    draw = ImageDraw.Draw(image)
    x0, y0, x1, y1 = box
    if shape == "circle":
        draw.ellipse(box, fill=1)
    elif shape == "square":
        draw.rectangle(box, fill=1)
    else:
        draw.polygon(((x0 + x1) / 2, y0, x1, y1, x0, y1), fill=1)
    return np.asarray(image, dtype=bool)


def _erode(mask: np.ndarray, steps: int) -> np.ndarray:
    out = mask.copy()
    for _ in range(steps):
        shrunk = out.copy()
        shrunk[1:] &= out[:-1]
        shrunk[:-1] &= out[1:]
        shrunk[:, 1:] &= out[:, :-1]
        shrunk[:, :-1] &= out[:, 1:]
        shrunk[0], shrunk[-1], shrunk[:, 0], shrunk[:, -1] = False, False, False, False
        out = shrunk
    return out


def styled_mask(style: str, mask: np.ndarray, top: int, side: int) -> np.ndarray:
    """What of a shape's ``mask`` the ``style`` draws (its bounding box starts at row ``top``)."""
    if style == "outline":
        return mask & ~_erode(mask, BORDER.get(side, 3))
    if style == "striped":
        band = BAND.get(side, 4)
        rows = ((np.arange(mask.shape[0]) - top) // band) % 2 == 0
        return mask & rows[:, None]
    raise ValueError(f"unknown style {style!r}; one of {STYLES}")


def render_styled(scene: Scene, style: str, size: tuple[int, int] = (IMAGE_SIZE, IMAGE_SIZE)) -> Image.Image:
    """``scene`` drawn in ``style`` on a ``(width, height)`` canvas (objects exactly at their positions)."""
    width, height = size
    pixels = np.empty((height, width, 3), dtype=np.uint8)
    pixels[:] = PALETTE[scene.background]
    for obj in scene.objects:
        cx, cy, side = layout(obj.position, obj.size, size)
        x0, y0 = cx - side // 2, cy - side // 2
        mask = shape_mask(obj.shape, (x0, y0, x0 + side - 1, y0 + side - 1), size)
        if style == "shaded":
            rows = shaded_rows(PALETTE[obj.colour], y0, side, height)  # (height, 3): each row's colour
            pixels[mask] = np.broadcast_to(rows[:, None], pixels.shape)[mask]
        else:
            pixels[styled_mask(style, mask, y0, side)] = PALETTE[obj.colour]
    return Image.fromarray(pixels)


def shade(rgb, amount) -> np.ndarray:
    """``rgb`` mixed with white by ``amount`` (> 0) or with black by ``-amount`` (< 0); broadcasts."""
    rgb, amount = np.asarray(rgb, dtype=np.float32), np.asarray(amount, dtype=np.float32)[..., None]
    return np.where(amount > 0, rgb + amount * (255 - rgb), rgb * (1 + amount))


def shaded_rows(rgb, top: int, side: int, height: int) -> np.ndarray:
    """Each canvas row's colour for a ``shaded`` shape of ``side`` px starting at row ``top``
    (``(height, 3)`` uint8; rows outside the shape clamp to its first or last)."""
    t = ((np.arange(height) - top) / max(1, side - 1)).clip(0, 1)
    return shade(rgb, SHADE * (1 - 2 * t)).round().astype(np.uint8)


def generate_styled(n: int, style: str, seed: int, size: tuple[int, int], two_shape_prob: float = 0.5,
                    balanced: bool = False) -> list[tuple[np.ndarray, str, Scene]]:
    """``n`` training examples ``(uint8 image, caption, scene)`` of ``style``, deterministic from ``seed``
    (the base model's training scenes: held-out triples never appear)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        scene = sample_scene(rng, two_shape_prob, balanced)
        out.append((np.asarray(render_styled(scene, style, size)), scene.caption, scene))
    return out


def _objects(image, count: int, style: str) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    """Pixels and the ``count`` largest objects of an image: regions of pixels clearly off the
    background (60 RGB units, as the base judge), their breaks closed, each labelled with the object
    colour most of its pixels are nearest to; as (colour index, drawn pixels)."""
    pixels, background = _pixels_and_background(image)
    bg = np.array(PALETTE[background], dtype=np.float32)
    far = np.sqrt(((pixels - bg) ** 2).sum(-1)) > 60
    if style == "shaded":  # nearest of each colour's lit and darkened tones, named by that colour
        labels = _nearest(pixels, _SHADED_RGB.reshape(-1, 3)) // _SHADED_RGB.shape[1]
    else:
        labels = _nearest(pixels, _OBJECT_RGB)
    found = []
    joined = far
    if style == "striped":  # a shape's bands, one colour, joined along columns (two objects differ in colour)
        for k in np.unique(labels[far]):
            joined = joined | _close_columns(far & (labels == k), MAX_STRIPE_GAP)
    for region in blobs(_erode(_dilate(joined, CLOSING), CLOSING) | joined):
        mask = np.zeros(far.shape, dtype=bool)
        mask[region[:, 0], region[:, 1]] = True
        drawn = mask & far
        if drawn.sum() >= 8:
            found.append((int(np.bincount(labels[drawn], minlength=len(OBJECT_COLOURS)).argmax()), drawn))
    found.sort(key=lambda item: -silhouette(item[1], "outline").sum())
    return pixels, found[:count]


#: (colour, tone, RGB): each object colour from lit (SHADE of white) to darkened (SHADE of black)
_SHADED_RGB = shade(_OBJECT_RGB[:, None], np.linspace(SHADE, -SHADE, 5)[None, :])


def _close_columns(mask: np.ndarray, max_gap: int) -> np.ndarray:
    """``mask`` with every vertical run of at most ``max_gap`` unset pixels between set ones filled."""
    out = mask.copy()
    for x in range(mask.shape[1]):
        rows = np.nonzero(mask[:, x])[0]
        for a, b in zip(rows[:-1], rows[1:]):
            if 1 < b - a <= max_gap + 1:
                out[a:b, x] = True
    return out


def convex_hull(mask: np.ndarray) -> np.ndarray:
    """The pixels of the convex hull of ``mask`` (Andrew's monotone chain, drawn with PIL)."""
    ys, xs = np.nonzero(mask)
    points = sorted(set(zip(xs.tolist(), ys.tolist())))
    if len(points) < 3:
        return mask.copy()

    def half(sequence):
        chain: list[tuple[int, int]] = []
        for p in sequence:
            while len(chain) >= 2 and ((chain[-1][0] - chain[-2][0]) * (p[1] - chain[-2][1])
                                       - (chain[-1][1] - chain[-2][1]) * (p[0] - chain[-2][0])) <= 0:
                chain.pop()
            chain.append(p)
        return chain

    hull = half(points)[:-1] + half(points[::-1])[:-1]
    image = Image.new("1", (mask.shape[1], mask.shape[0]), 0)
    ImageDraw.Draw(image).polygon(hull, fill=1, outline=1)
    return np.asarray(image, dtype=bool)


def drawn_side(measured: int) -> int:
    """The side a style drew (14 small, 26 large) for a measured one, split where the base judge splits
    sizes (> 20 px is large)."""
    return SIDE["small"] if measured <= 20 else SIDE["large"]


def striped_fit(drawn: np.ndarray) -> tuple[float, np.ndarray]:
    """The plain shape whose ``striped`` drawing best matches ``drawn``, and that match's IoU.

    A striped shape keeps its first and last rows, so the drawing's height is the shape's side; the
    box is centred on the drawing. Each of the three shapes is drawn striped in that box as
    :func:`render_styled` draws it and compared with the pixels.
    """
    ys, xs = np.nonzero(drawn)
    top, bottom = int(ys.min()), int(ys.max())
    side = bottom - top + 1
    left = int(round((xs.min() + xs.max()) / 2 - (side - 1) / 2))
    best_iou, best = 0.0, drawn
    for shape in ("circle", "square", "triangle"):
        mask = shape_mask(shape, (left, top, left + side - 1, bottom), (drawn.shape[1], drawn.shape[0]))
        striped = styled_mask("striped", mask, top, drawn_side(side))
        iou = float((striped & drawn).sum() / max(1, (striped | drawn).sum()))
        if iou > best_iou:
            best_iou, best = iou, mask
    return best_iou, best


def silhouette(drawn: np.ndarray, style: str) -> np.ndarray:
    """The plain shape a ``style`` drawing of one object covers: its convex hull (circles, squares and
    triangles are convex; a ring's breaks and a band's blurred ends do not change it); for ``striped``,
    the shape whose striped drawing matches the pixels at :data:`STRIPED_MIN_IOU` when one does (the
    hull of a small circle's two caps has flat sides, and the base judge reads it as no shape)."""
    if style == "striped" and drawn.any():
        iou, shape = striped_fit(drawn)
        if iou >= STRIPED_MIN_IOU:
            return shape
    return convex_hull(drawn)


def restore(image, style: str, count: int = 1) -> tuple[Image.Image, list[tuple[np.ndarray, np.ndarray]]]:
    """The plain scene a ``style`` image of ``count`` objects shows, and per object (drawn pixels,
    filled silhouette)."""
    pixels, objects = _objects(image, count, style)
    restored = pixels.copy()
    found = []
    for k, drawn in objects:
        filled = silhouette(drawn, style)
        # a shaded object's own pixels are tones of its colour: the plain scene has the colour itself
        restored[filled if style == "shaded" else filled & ~drawn] = _OBJECT_RGB[k]
        found.append((drawn, filled))
    return Image.fromarray(restored.clip(0, 255).astype(np.uint8)), found


def shaded_step(pixels: np.ndarray, drawn: np.ndarray, filled: np.ndarray) -> float:
    """How much lighter an object's drawn pixels are in the top third of its silhouette's rows than in
    the bottom third (mean luminance, Rec. 601 weights)."""
    luminance = pixels @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    ys = np.nonzero(filled.any(1))[0]
    third = max(1, len(ys) // 3)
    top, bottom = drawn.copy(), drawn.copy()
    top[ys[third]:], bottom[: ys[-third]] = False, False
    if not top.any() or not bottom.any():
        return 0.0
    return float(luminance[top].mean() - luminance[bottom].mean())


def style_applied(style: str, found: list[tuple[np.ndarray, np.ndarray]], pixels: np.ndarray | None = None) -> bool:
    """Whether every object found shows ``style`` (see the module docstring); False when none is found.
    ``shaded`` reads the image's ``pixels`` (float RGB)."""
    objects = [(drawn, filled) for drawn, filled in found if filled.sum() >= 24]
    if not objects:
        return False
    for drawn, filled in objects:
        if style == "outline":
            side = max(np.ptp(np.nonzero(filled)[0]), np.ptp(np.nonzero(filled)[1])) + 1
            inside = _erode(filled, BORDER[drawn_side(side)])
            if inside.sum() < 4 or drawn[inside].mean() > 0.5:
                return False
        elif style == "shaded":
            if pixels is None or shaded_step(pixels, drawn, filled) < SHADED_MIN_STEP:
                return False
        else:
            ys = np.nonzero(filled.any(1))[0]
            widths = filled[ys].sum(1).clip(min=1)
            coverage = drawn[ys].sum(1) / widths
            inner = coverage[1:-1]
            gaps = np.nonzero(inner <= 0.3)[0]
            if not len(gaps) or coverage[: gaps[0] + 1].max() < 0.6 or coverage[gaps[-1] + 2:].max(initial=0) < 0.6:
                return False
    return True


def judge_styled(scene: Scene, image, style: str) -> dict[str, bool]:
    """``style`` applied, and the base judge's verdicts on the restored scene (``all``: every base attribute)."""
    restored, found = restore(image, style, len(scene.objects))
    result = judge_image(scene, restored)
    return {"style": style_applied(style, found, _pixels_and_background(image)[0]), **result}


__all__ = ["OBJECT_COLOURS", "STYLES", "generate_styled", "judge_styled", "render_styled", "restore", "style_applied"]
