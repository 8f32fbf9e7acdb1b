"""Synthetic captioned scenes of simple shapes, for the tiny text-to-image model in ``assets/``.

A scene is an RGB image of one or two shapes (circle, square, triangle) in a named colour,
size and position on a plain named background, with a caption built from a small grammar::

    a small red circle at the top-left on a white background
    a large blue square in the center on a gray background
    a small green triangle at the top-right and a small yellow circle at the bottom-left on a black background

A position is one word ("top-left", one T5 piece): the image tokens learn where they are only
through attention to the text tokens (FLUX gives text tokens position id 0), and that attention's
logit is a sum of a row part and a column part, so separate "top" and "left" words can only vote
along one axis each; with two objects on a diagonal the model drew a 2x2 grid coloured by column.

The same caption can be drawn on any canvas (:data:`CANVASES`: 64x64, 128x128, 96x64, 64x96;
"WIDTHxHEIGHT"). Positions are fractions of the canvas (the quadrant centres at a quarter and
three quarters of each side, or its centre), and sizes are pixels (small 14 px, large 26 px) on
every canvas: on 96x64 "top-left" is the centre of the left half's top quarter, (24, 16); on
128x128 it is (32, 32), and the shapes are as big as on 64x64, with more room around them. So a
shape is the same picture, and the same latent, on every bucket, and what the model learns about
drawing it on one canvas serves them all.

Everything is generated from a seed (no files). A fixed rule holds out some (colour, shape,
position) combinations: no training scene ever contains them, and :func:`held_out_prompts`
lists the single-shape captions built from them for the evaluation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

IMAGE_SIZE = 64
#: Canvases (width, height) the model is trained and evaluated on; the first is the default.
CANVASES: tuple[tuple[int, int], ...] = ((64, 64), (128, 128), (96, 64), (64, 96))

#: Named colours and their RGB values. Objects use OBJECT_COLOURS, backgrounds BACKGROUNDS.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 210, 40),
    "orange": (245, 140, 30),
    "purple": (140, 60, 180),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
    "gray": (128, 128, 128),
}
OBJECT_COLOURS = ("red", "green", "blue", "yellow", "orange", "purple", "white", "black")
BACKGROUNDS = ("white", "black", "gray")
SHAPES = ("circle", "square", "triangle")
SIZES = ("small", "large")
#: Position name -> (caption phrase, centre x, centre y) on the 64x64 canvas; on any canvas the
#: centre is the same fraction of its width and height (:func:`layout`).
POSITIONS: dict[str, tuple[str, int, int]] = {
    "top left": ("at the top-left", 16, 16),
    "top right": ("at the top-right", 48, 16),
    "bottom left": ("at the bottom-left", 16, 48),
    "bottom right": ("at the bottom-right", 48, 48),
    "center": ("in the center", 32, 32),
}
POSITION_NAMES = tuple(POSITIONS)
#: Bounding-box side in pixels on a 64 px shorter side, per size word.
SIDE = {"small": 14, "large": 26}
#: Offsets (pixels, each axis) an object's centre may be moved by in a rendered scene: the
#: variety the judges are tested against (and the training scenes' offsets up to the seventh attempt).
JITTER = (-2, -1, 0, 1, 2)
#: The training scenes' offsets: none, so a caption is one picture. With five offsets per axis the
#: transformer had to pick one for all of an object's tokens at once; its misses were dented edges
#: and stray fragments, and without jitter they went (commit 531ac6c).
TRAINING_JITTER = (0,)

#: Every word of the grammar (whole-word pieces for the T5 tokenizer).
VOCABULARY: tuple[str, ...] = tuple(dict.fromkeys(
    "a and on background at the in".split() + list(SIZES) + list(OBJECT_COLOURS) + list(BACKGROUNDS)
    + list(SHAPES) + "top-left top-right bottom-left bottom-right center".split()
))


@dataclass(frozen=True)
class ShapeSpec:
    colour: str
    shape: str
    position: str
    size: str

    def phrase(self) -> str:
        return f"a {self.size} {self.colour} {self.shape} {POSITIONS[self.position][0]}"


@dataclass(frozen=True)
class Scene:
    background: str
    objects: tuple[ShapeSpec, ...]

    @property
    def caption(self) -> str:
        return " and ".join(obj.phrase() for obj in self.objects) + f" on a {self.background} background"


#: The attributes :func:`word_attributes` labels, and how many values each has.
ATTRIBUTES: dict[str, tuple[str, ...]] = {"colour": OBJECT_COLOURS, "shape": SHAPES, "size": SIZES,
                                          "position": POSITION_NAMES}


def word_attributes(scene: Scene) -> list[tuple[int, ...] | None]:
    """Per word of ``scene.caption``: the indices (into :data:`ATTRIBUTES`) of the colour, shape, size
    and position of the object whose phrase the word is in, or None ("and", "on a ... background").

    Training labels for binding: a text encoder that can read every attribute of an object off any
    word of its phrase has bound them, which is what a two-shape prompt needs.
    """
    labels: list[tuple[int, ...] | None] = []
    for i, obj in enumerate(scene.objects):
        if i:
            labels.append(None)  # "and"
        values = (obj.colour, obj.shape, obj.size, obj.position)
        ids = tuple(table.index(v) for table, v in zip(ATTRIBUTES.values(), values))
        labels += [ids] * len(obj.phrase().split())
    labels += [None] * len(f"on a {scene.background} background".split())
    assert len(labels) == len(scene.caption.split())
    return labels


def is_held_out(colour: str, shape: str, position: str) -> bool:
    """The fixed held-out rule: about one (colour, shape, position) triple in six never trains.

    Every pair of the three (colour+shape, colour+position, shape+position) is still seen in
    training with other values of the third, so the held-out prompts test composition.
    """
    c, s, p = OBJECT_COLOURS.index(colour), SHAPES.index(shape), POSITION_NAMES.index(position)
    return (c + 2 * s + 3 * p) % 6 == 0


def held_out_prompts() -> list[Scene]:
    """All single-shape scenes made of held-out triples (every size and background), in a fixed order."""
    scenes = []
    for colour in OBJECT_COLOURS:
        for shape in SHAPES:
            for position in POSITION_NAMES:
                if not is_held_out(colour, shape, position):
                    continue
                for size in SIZES:
                    for background in BACKGROUNDS:
                        if background != colour:
                            scenes.append(Scene(background, (ShapeSpec(colour, shape, position, size),)))
    return scenes


def tuning_prompts(count: int = 110) -> list[Scene]:
    """Single-shape scenes of triples the model trained on, in a fixed order: the judge's tuning
    set. It shares no (colour, shape, position) triple, hence no prompt, with :func:`held_out_prompts`."""
    scenes = [Scene(background, (ShapeSpec(colour, shape, position, size),))
              for colour in OBJECT_COLOURS for shape in SHAPES for position in POSITION_NAMES
              if not is_held_out(colour, shape, position)
              for size in SIZES for background in BACKGROUNDS if background != colour]
    return scenes[:: max(1, len(scenes) // count)][:count]


def parse_caption(caption: str) -> Scene:
    """The scene a caption of the grammar describes (inverse of ``Scene.caption``)."""
    text = caption.strip().lower()
    body, _, tail = text.rpartition(" on a ")
    background = tail.removesuffix(" background").strip()
    objects = []
    for part in body.split(" and "):
        words = part.split()
        if len(words) < 5 or words[0] != "a":
            raise ValueError(f"not a caption of the grammar: {caption!r}")
        size, colour, shape = words[1], words[2], words[3]
        phrase = " ".join(words[4:])
        position = next(name for name, (p, _, _) in POSITIONS.items() if p == phrase)
        objects.append(ShapeSpec(colour, shape, position, size))
    scene = Scene(background, tuple(objects))
    if scene.caption != text:
        raise ValueError(f"not a caption of the grammar: {caption!r}")
    return scene


def layout(position: str, object_size: str, size: tuple[int, int] = (IMAGE_SIZE, IMAGE_SIZE)) -> tuple[int, int, int]:
    """``(centre x, centre y, side)`` in pixels of an object on a ``(width, height)`` canvas.

    The centre is at the same fraction of the canvas as on 64x64 (quadrant centres at 1/4 and 3/4
    of each side, or the middle); the side is the same number of pixels on every canvas.
    """
    width, height = size
    _, x, y = POSITIONS[position]
    return round(x * width / IMAGE_SIZE), round(y * height / IMAGE_SIZE), SIDE[object_size]


def render(scene: Scene, rng: random.Random | None = None, size: tuple[int, int] = (IMAGE_SIZE, IMAGE_SIZE),
           jitter: tuple[int, ...] = JITTER) -> Image.Image:
    """Draw ``scene`` on a ``(width, height)`` canvas (with each object's centre moved by one of the
    ``jitter`` offsets, in pixels, along each axis when ``rng`` is given)."""
    image = Image.new("RGB", tuple(size), PALETTE[scene.background])
    draw = ImageDraw.Draw(image)
    for obj in scene.objects:
        cx, cy, side = layout(obj.position, obj.size, size)
        if rng is not None:
            cx += rng.choice(jitter)
            cy += rng.choice(jitter)
        x0, y0 = cx - side // 2, cy - side // 2
        x1, y1 = x0 + side - 1, y0 + side - 1
        fill = PALETTE[obj.colour]
        if obj.shape == "circle":
            draw.ellipse((x0, y0, x1, y1), fill=fill)
        elif obj.shape == "square":
            draw.rectangle((x0, y0, x1, y1), fill=fill)
        elif obj.shape == "triangle":
            draw.polygon(((x0 + x1) / 2, y0, x1, y1, x0, y1), fill=fill)
        else:
            raise ValueError(obj.shape)
    return image


def trained_positions(colour: str, shape: str) -> int:
    """How many positions a (colour, shape) pair trains at: 5, or 2-3 where the held-out rule takes some."""
    return sum(not is_held_out(colour, shape, position) for position in POSITION_NAMES)


def _random_object(rng: random.Random, background: str, position: str, size: str,
                   balanced: bool = False) -> ShapeSpec:
    if balanced:  # each (colour, shape) pair as often as any other, whatever positions and backgrounds it has
        pairs = [(c, s) for c in OBJECT_COLOURS for s in SHAPES if c != background and not is_held_out(c, s, position)]
        weights = [1 / trained_positions(c, s) / sum(b != c for b in BACKGROUNDS) for c, s in pairs]
        colour, shape = rng.choices(pairs, weights=weights)[0]
        return ShapeSpec(colour, shape, position, size)
    while True:
        colour = rng.choice(OBJECT_COLOURS)
        shape = rng.choice(SHAPES)
        if colour != background and not is_held_out(colour, shape, position):
            return ShapeSpec(colour, shape, position, size)


def sample_scene(rng: random.Random, two_shape_prob: float = 0.25, balanced: bool = False) -> Scene:
    """One random training scene; never contains a held-out (colour, shape, position) triple.

    ``balanced``: every (colour, shape) pair drawn equally often overall; by default a pair that
    trains at 2 positions of 5 (white circles, blue triangles, ...) is 2.5 times rarer than one that
    trains at all 5, and white or black ones, never on their own background, 1.5 times rarer still."""
    background = rng.choice(BACKGROUNDS)
    if rng.random() >= two_shape_prob:
        return Scene(background, (_random_object(rng, background, rng.choice(POSITION_NAMES), rng.choice(SIZES),
                                                 balanced),))
    first, second = rng.sample(POSITION_NAMES, 2)
    if "center" in (first, second):  # a large shape at the centre would overlap a corner one
        sizes = ("small", "small")
    else:
        sizes = (rng.choice(SIZES), rng.choice(SIZES))
    objects = (_random_object(rng, background, first, sizes[0], balanced),
               _random_object(rng, background, second, sizes[1], balanced))
    return Scene(background, objects)


def generate(n: int, seed: int = 0, two_shape_prob: float = 0.25, size: tuple[int, int] = (IMAGE_SIZE, IMAGE_SIZE),
             jitter: tuple[int, ...] = JITTER) -> list[tuple[np.ndarray, str, Scene]]:
    """``n`` training examples ``(uint8 HxWx3 image, caption, scene)`` on a ``(width, height)``
    canvas, deterministic from ``seed`` (``jitter``: see :func:`render`)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        scene = sample_scene(rng, two_shape_prob)
        out.append((np.asarray(render(scene, rng, size, jitter)), scene.caption, scene))
    return out


def _two_shape_scenes(triples) -> list[Scene]:
    """Every two-shape scene of two of ``triples`` (colour, shape, position): different positions and
    colours, first object the earlier position in POSITION_NAMES; sizes as the training scenes allow
    (both small when one is in the centre), the first background differing from both colours."""
    scenes = []
    for i, first in enumerate(triples):
        for second in triples[i + 1:]:
            if first[2] == second[2] or first[0] == second[0]:
                continue
            if POSITION_NAMES.index(first[2]) > POSITION_NAMES.index(second[2]):
                (c1, s1, p1), (c2, s2, p2) = second, first
            else:
                (c1, s1, p1), (c2, s2, p2) = first, second
            sizes = [("small", "small")] if "center" in (p1, p2) else [(a, b) for a in SIZES for b in SIZES]
            background = next(b for b in BACKGROUNDS if b not in (c1, c2))
            for a, b in sizes:
                scenes.append(Scene(background, (ShapeSpec(c1, s1, p1, a), ShapeSpec(c2, s2, p2, b))))
    return scenes


def _spread(scenes: list[Scene], count: int) -> list[Scene]:
    """``count`` scenes spread evenly over ``scenes`` (a fixed, deterministic choice)."""
    if len(scenes) <= count:
        return scenes
    return [scenes[int(i * len(scenes) / count)] for i in range(count)]


def held_out_two_shape_prompts(count: int = 100) -> list[Scene]:
    """Two-shape scenes whose **both** objects are held-out triples (so no training scene contains
    either object), of two different colours: ``count`` of them, spread over all such scenes."""
    triples = [(c, s, p) for c in OBJECT_COLOURS for s in SHAPES for p in POSITION_NAMES if is_held_out(c, s, p)]
    return _spread(_two_shape_scenes(triples), count)


def tuning_two_shape_prompts(count: int = 100) -> list[Scene]:
    """Two-shape scenes of trained triples only (the two-shape judge's and the guidance's tuning set)."""
    triples = [(c, s, p) for c in OBJECT_COLOURS for s in SHAPES for p in POSITION_NAMES if not is_held_out(c, s, p)]
    rng = random.Random(1234)
    rng.shuffle(triples)
    return _spread(_two_shape_scenes(triples[:40]), count)
