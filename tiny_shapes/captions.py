"""Captions the way visitors write them, for training and evaluating the tiny-shapes model.

The grammar of :mod:`tiny_shapes.dataset` (``Scene.caption``) is one sentence per scene. People
write the same scene many ways, so the training captions come from :func:`describe`, which draws,
per caption:

- **synonyms and spellings:** small / little / tiny, large / big, gray / grey, center / centre /
  middle / centered, top / upper and bottom / lower, top-left / top left, with or without
  "corner" or "of the image";
- **word order and form:** background last ("on a white background", "on white", "against a
  white background") or first ("on a white background, a red circle", "a white background with
  a red circle"), or a comma list ("small blue square, top-left, white background"); "and" or ","
  between two objects; an optional leading "a picture of" / "an image of" / "draw" / ...; an
  optional full stop;
- **left-out attributes:** size, position and the background may each be missing, for one or
  both objects. The scene still draws them (at random, as the dataset samples them), so the
  model learns to let the seed choose what the prompt leaves open;
- **stray words:** now and then a made-up word the vocabulary does not know, so words the model
  cannot read (spelled out in character pieces) carry no meaning.

Letter case is not the generator's business: the shipped tokenizer lowercases
(``tiny_shapes.model``), the way real tokenizers normalise.

:data:`HELD_OUT_TEMPLATES` are phrasings no training caption uses (:func:`describe` redraws a
caption that matches one): the evaluation's "held-out phrasings" are written with them, so their
figure measures reading, not recall.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import numpy as np

from tiny_shapes.dataset import JITTER, OBJECT_COLOURS, SHAPES, Scene, ShapeSpec, render, sample_scene

#: The attributes a caption may leave out; colour and shape are always named.
OPTIONAL = ("size", "position", "background")

SIZE_WORDS = {"small": ("small", "little", "tiny"), "large": ("large", "big")}
BACKGROUND_WORDS = {"white": ("white",), "black": ("black",), "gray": ("gray", "grey")}
VERTICAL_WORDS = {"top": ("top", "upper"), "bottom": ("bottom", "lower")}
CENTER_PHRASES = ("in the center", "in the centre", "in the middle", "at the center", "at the centre",
                  "centered", "centred", "in the center of the image", "in the middle of the picture")
CENTER_BARE = ("center", "centre", "middle", "centered")
PREFIXES = ("a picture of ", "an image of ", "draw ", "a drawing of ", "show me ", "please draw ")
#: Trailing background phrases ("{b}" is the colour word); the leading forms are in :func:`describe`.
BACKGROUND_AFTER = ("on a {b} background", "on {b}", "against a {b} background", "on a {b} backdrop",
                    "with a {b} background", "in front of a {b} background")

#: Phrasings kept out of training, each a pattern over the lowercased caption and an example.
#: Every word in them is trained in other phrasings; only the combination is new.
HELD_OUT_TEMPLATES: dict[str, tuple[str, str]] = {
    "comma before the background": (r", on an? \w+ background", "a small red circle at the top-left, on a white background"),
    "at the upper/lower ... corner": (r"\bat the (upper|lower)[ -](left|right) corner\b",
                                      "a big blue square at the lower right corner on black"),
    "against a bare colour": (r"\bagainst (white|black|gray|grey)\b", "a little green triangle in the middle against gray"),
    "on a colour, first": (r"(^|\bof |^draw |^show me |^please draw )on (white|black|gray|grey), ",
                           "on white, a large purple circle in the upper left"),
}
_HELD_OUT = [re.compile(pattern) for pattern, _ in HELD_OUT_TEMPLATES.values()]

#: Every word :func:`describe` writes (whole-word T5 pieces), and the punctuation it uses.
WORDS: tuple[str, ...] = tuple(dict.fromkeys(
    "a an and on of the at in with against front background backdrop corner image picture drawing draw show "
    "me please left right".split()
    + [w for words in SIZE_WORDS.values() for w in words] + list(OBJECT_COLOURS)
    + [w for words in BACKGROUND_WORDS.values() for w in words] + list(SHAPES)
    + [w for words in VERTICAL_WORDS.values() for w in words]
    + [w for phrase in CENTER_PHRASES + CENTER_BARE for w in phrase.split()]
))
PUNCTUATION = (",", ".", "-")
#: What the model draws, for the page's line under a prompt with words it cannot read.
SUMMARY = ("it draws circles, squares and triangles in 8 colours (red, green, blue, yellow, orange, purple, "
           "white, black), small or large, in a corner or the center, on white, black or gray; "
           "what you leave out, the seed chooses")
#: The same for weights trained on the grammar's one sentence per scene (the shipped ones).
GRAMMAR_SUMMARY = ("it draws circles, squares and triangles in 8 colours, read from one sentence form: "
                   "\"a small|large <colour> <shape> at the top-left|top-right|bottom-left|bottom-right | in the "
                   "center on a white|black|gray background\", two shapes joined by \"and\"")


def vocabulary_record(varied: bool = True) -> dict:
    """The ``vocabulary.json`` saved beside the weights (read by ``tpu_demo.core.vocabulary``):
    the words of the captions the weights were trained on, and what they draw."""
    if varied:
        return {"words": list(WORDS), "summary": SUMMARY}
    from tiny_shapes.dataset import VOCABULARY

    return {"words": list(VOCABULARY), "summary": GRAMMAR_SUMMARY}


@dataclass(frozen=True)
class Prompt:
    """A caption and what it says: ``scene`` is what the training image draws (every attribute),
    ``named`` the optional attributes the text names, per object (plus "background" in the first
    set when the background is named), ``spans`` each object's phrase as character offsets."""

    text: str
    scene: Scene
    named: tuple[frozenset[str], ...]
    background_named: bool
    spans: tuple[tuple[int, int], ...]

    def names(self, index: int, attribute: str) -> bool:
        if attribute in ("colour", "shape"):
            return True
        if attribute == "background":
            return self.background_named
        return attribute in self.named[index]


def is_held_out_phrasing(text: str) -> bool:
    """Whether ``text`` (any case) uses one of :data:`HELD_OUT_TEMPLATES`."""
    lowered = text.lower()
    return any(p.search(lowered) for p in _HELD_OUT)


def _position_phrase(position: str, rng: random.Random, bare: bool, held_out: str | None) -> str:
    if position == "center":
        return rng.choice(CENTER_BARE if bare else CENTER_PHRASES)
    vertical, horizontal = position.split()
    vertical = rng.choice(VERTICAL_WORDS[vertical])
    if held_out == "at the upper/lower ... corner":
        return f"at the {VERTICAL_WORDS[position.split()[0]][1]}{rng.choice('- ')}{horizontal} corner"
    words = f"{vertical}{rng.choice(('-', ' '))}{horizontal}"
    corner = rng.random() < 0.35
    if bare:
        return words + (" corner" if corner else "")
    tail = " corner" if corner else ""
    if rng.random() < 0.1:
        tail += rng.choice((" of the image", " of the picture"))
    return f"{rng.choice(('at the', 'in the'))} {words}{tail}"


def _object_phrase(obj: ShapeSpec, named: frozenset[str], rng: random.Random, listed: bool,
                   held_out: str | None) -> str:
    words = []
    if "size" in named:
        words.append(rng.choice(SIZE_WORDS[obj.size]))
    words += [obj.colour, obj.shape]
    article = "an" if words[0][0] in "aeiou" and rng.random() < 0.8 else "a"
    if listed and rng.random() < 0.5:
        text = " ".join(words)
    else:
        text = f"{article} " + " ".join(words)
    if "position" in named:
        phrase = _position_phrase(obj.position, rng, listed, held_out)
        text += (", " if listed else " ") + phrase
    return text


def _pseudo_word(rng: random.Random) -> str:
    while True:
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 7)))
        if word not in WORDS:
            return word


def token_count(text: str) -> int:
    """T5 pieces of ``text`` without the end token: one per known word or mark, one per letter otherwise."""
    return sum(1 if piece in WORDS or piece in PUNCTUATION else len(piece)
               for piece in re.findall(r"[a-z]+|[^\sa-z]", text.lower()))


def _choose_named(rng: random.Random, count: int, full_share: float) -> tuple[tuple[frozenset[str], ...], bool]:
    if rng.random() < full_share:
        return (frozenset({"size", "position"}),) * count, True
    while True:
        named = tuple(frozenset(a for a in ("size", "position") if rng.random() < 0.5) for _ in range(count))
        background = rng.random() < 0.5
        if not background or any(n != {"size", "position"} for n in named):
            return named, background


def describe(scene: Scene, rng: random.Random, *, full_share: float = 0.4, stray_word: float = 0.08,
             named: tuple[frozenset[str], ...] | None = None, background_named: bool | None = None,
             held_out: str | None = None, max_tokens: int = 31) -> Prompt:
    """One caption of ``scene`` drawn from the wide generator (see the module docstring).

    ``named`` / ``background_named`` fix which optional attributes are named (default: all of
    them in ``full_share`` of captions, else a random subset with at least one left out).
    ``held_out`` names one of :data:`HELD_OUT_TEMPLATES` to write the caption with (evaluation);
    without it, a caption that matches any of them is redrawn, as is one over ``max_tokens``.
    """
    if named is None:
        named, drawn_background = _choose_named(rng, len(scene.objects), full_share)
        background_named = drawn_background if background_named is None else background_named
    background_named = True if background_named is None else background_named
    if held_out is not None and held_out not in HELD_OUT_TEMPLATES:
        raise ValueError(f"held_out must be one of {sorted(HELD_OUT_TEMPLATES)}, got {held_out!r}")
    for _ in range(1000):
        prompt = _compose(scene, rng, named, background_named, stray_word if held_out is None else 0.0, held_out)
        if token_count(prompt.text) > max_tokens:
            continue
        if held_out is None and is_held_out_phrasing(prompt.text):
            continue
        if held_out is not None and not _HELD_OUT[list(HELD_OUT_TEMPLATES).index(held_out)].search(prompt.text):
            continue
        return prompt
    raise RuntimeError(f"no caption of {scene} fits (held_out={held_out!r})")


def _compose(scene: Scene, rng: random.Random, named, background_named: bool, stray_word: float,
             held_out: str | None) -> Prompt:
    background = rng.choice(BACKGROUND_WORDS[scene.background])
    listed = held_out is None and rng.random() < 0.15
    corner_held = held_out == "at the upper/lower ... corner"
    phrases = [_object_phrase(obj, n, rng, listed, held_out if corner_held and n >= {"position"} else None)
               for obj, n in zip(scene.objects, named)]
    joiner = ", " if listed else rng.choice((" and ", " and ", " and ", ", ", ", and "))
    lead = after = ""
    if background_named:
        if held_out == "comma before the background":
            after = f", on a {background} background"
        elif held_out == "against a bare colour":
            after = f" against {background}"
        elif held_out == "on a colour, first":
            lead = f"on {background}, "
        elif listed:
            after = f", {background} background"
        else:
            form = rng.random()
            if form < 0.7:
                after = " " + rng.choice(BACKGROUND_AFTER).format(b=background)
            elif form < 0.85:
                lead = rng.choice((f"on a {background} background, ", f"{background} background, ",
                                   f"against a {background} background, "))
            else:
                lead = f"a {background} background with "
    prefix = rng.choice(PREFIXES) if rng.random() < 0.3 else ""
    if lead.startswith("a ") and prefix.startswith("draw"):
        prefix = ""
    # Segments keep each object's character span for the binding labels.
    segments: list[tuple[str, int | None]] = [(prefix + lead, None)]
    for i, phrase in enumerate(phrases):
        if i:
            segments.append((joiner, None))
        segments.append((phrase, i))
    segments.append((after + ("." if rng.random() < 0.3 else ""), None))
    if stray_word and rng.random() < stray_word:  # a made-up word at the start, after an object, or at the end
        slots = [0] + [k + 1 for k, (_, owner) in enumerate(segments) if owner is not None] + [len(segments)]
        at = rng.choice(slots)
        segments.insert(at, (_pseudo_word(rng) + " ", None) if at == 0 else (" " + _pseudo_word(rng), None))
    text, spans = "", {}
    for segment, owner in segments:
        if owner is not None:
            spans[owner] = (len(text), len(text) + len(segment))
        text += segment
    return Prompt(text, scene, tuple(named), background_named, tuple(spans[i] for i in range(len(phrases))))


def generate(n: int, seed: int = 0, two_shape_prob: float = 0.25, size: tuple[int, int] = (64, 64),
             jitter: tuple[int, ...] = JITTER, **describe_kwargs) -> list[tuple[np.ndarray, Prompt]]:
    """``n`` training examples ``(uint8 HxWx3 image, Prompt)`` with captions from :func:`describe`,
    deterministic from ``seed`` (scene, caption, then render draw from one generator)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        scene = sample_scene(rng, two_shape_prob)
        prompt = describe(scene, rng, **describe_kwargs)
        out.append((np.asarray(render(scene, rng, size, jitter)), prompt))
    return out


def held_out_phrasings(scenes: list[Scene], seed: int = 0) -> list[Prompt]:
    """Each scene, every attribute named, in one of :data:`HELD_OUT_TEMPLATES` (in turn)."""
    rng = random.Random(seed)
    prompts = []
    for i, scene in enumerate(scenes):
        names = [name for name in HELD_OUT_TEMPLATES  # the corner phrasing needs an object in a corner
                 if "corner" not in name or any(o.position != "center" for o in scene.objects)]
        prompts.append(describe(scene, rng, named=(frozenset({"size", "position"}),) * len(scene.objects),
                                background_named=True, held_out=names[i % len(names)]))
    return prompts


#: Which optional attributes the left-out evaluation leaves out, in turn (the ones that matter for
#: variety leave out the position, whose five values make 8 seeds' layouts differ).
LEFT_OUT_KINDS: tuple[frozenset[str], ...] = (
    frozenset({"size", "position", "background"}), frozenset({"position"}), frozenset({"position", "background"}),
    frozenset({"size", "position"}), frozenset({"size"}), frozenset({"background"}),
)


def left_out_prompts(scenes: list[Scene], seed: int = 0) -> list[Prompt]:
    """Each scene's caption leaving out one :data:`LEFT_OUT_KINDS` set (in turn), for every object,
    phrased by :func:`describe` (no held-out template, no stray word)."""
    rng = random.Random(seed)
    prompts = []
    for i, scene in enumerate(scenes):
        left_out = LEFT_OUT_KINDS[i % len(LEFT_OUT_KINDS)]
        named = frozenset({"size", "position"}) - left_out
        prompts.append(describe(scene, rng, named=(named,) * len(scene.objects),
                                background_named="background" not in left_out, stray_word=0.0))
    return prompts


def mixed_case(text: str, seed: int = 0) -> str:
    """``text`` with each word in lower, Title or UPPER case, or a random mix of letters."""
    rng = random.Random(seed)

    def recase(word: str) -> str:
        kind = rng.randrange(4)
        if kind == 0:
            return word.lower()
        if kind == 1:
            return word.title()
        if kind == 2:
            return word.upper()
        return "".join(c.upper() if rng.random() < 0.5 else c for c in word)

    return " ".join(recase(w) for w in text.split(" "))




def describe_grammar(scene: Scene) -> Prompt:
    """``scene.caption`` (the grammar of :mod:`tiny_shapes.dataset`: every attribute named) as a Prompt."""
    spans, start = [], 0
    for obj in scene.objects:
        spans.append((start, start + len(obj.phrase())))
        start += len(obj.phrase()) + len(" and ")
    return Prompt(scene.caption, scene, (frozenset({"size", "position"}),) * len(scene.objects), True, tuple(spans))
