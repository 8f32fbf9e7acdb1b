"""The tiny-shapes prompt language, as the data the app's prompt upsampler reads (``language.json``).

Generated from the grammar's own tables (:mod:`tiny_shapes.dataset` for the values and the
sentence, :mod:`tiny_shapes.captions` for the words people use for them), so the reader and the
training data cannot drift apart. It declares:

- ``slots``: per attribute (size, colour, shape, position, background), each value and the
  phrases that name it ("top left": "upper left", "top left corner", ...);
- ``sentence``: how the model's one sentence form writes a scene, and the phrase of each value;
- ``draw``: the values the training scenes draw from, and the rules they keep (two shapes at two
  different positions, both small when one is in the centre, a background unlike every shape),
  so an attribute a prompt leaves out is drawn as the training data would have drawn it.

``python -m tiny_shapes.language`` writes the file; a test checks the committed one is current.
"""

from __future__ import annotations

import json
from pathlib import Path

from tiny_shapes import captions, dataset

#: The committed file the app reads (beside ``vocabulary.json``).
LANGUAGE_PATH = Path(__file__).resolve().parents[1] / "assets" / "models" / "tiny-shapes" / "language.json"

#: Words for a value that no training caption uses but visitors do (plurals, a few common synonyms).
#: Reader-only: the shipped weights never see them, the reader maps them to the grammar's words.
EXTRA_WORDS: dict[str, dict[str, tuple[str, ...]]] = {
    "size": {"small": ("smaller", "mini", "petite"), "large": ("larger", "bigger", "huge", "giant", "massive")},
    "shape": {"circle": ("circles", "disc", "disk", "dot"), "square": ("squares", "box"),
              "triangle": ("triangles",)},
    "colour": {"purple": ("violet",)},
    "background": {"gray": ("grey",)},
}
#: Words that say "the picture's background" after or before a colour ("a white background", "on white").
BACKGROUND_AFTER = ("background", "backdrop", "bg", "canvas")
BACKGROUND_BEFORE = ("on", "against", "over")
#: Words that carry no attribute: articles, prepositions, the captions' lead-ins ("a picture of", "draw").
FILLER = tuple(dict.fromkeys(
    "a an the at in on of to with and one please show me draw drawing picture image photo of placed "
    "located sitting positioned put it its is are there corner side part".split()
    + [w for prefix in captions.PREFIXES for w in prefix.split()]))
#: Count words before a plural shape ("two red circles"): a scene holds at most two shapes.
COUNTS = {"two": 2, "2": 2, "pair": 2, "both": 2}


def _position_phrases(position: str) -> list[str]:
    """Every phrase the captions use for ``position`` ("top left": "top left", "upper left", ...)."""
    if position == "center":
        phrases = [p.removeprefix("in the ").removeprefix("at the ") for p in captions.CENTER_PHRASES]
        return list(dict.fromkeys(phrases + list(captions.CENTER_BARE) + ["central", "centre of the image"]))
    vertical, horizontal = position.split()
    phrases = []
    for v in captions.VERTICAL_WORDS[vertical]:
        phrases += [f"{v} {horizontal}", f"{horizontal} {v}"]
    return phrases


def language_record() -> dict:
    """The ``language.json`` record (see the module docstring)."""
    slots: dict[str, dict[str, list[str]]] = {
        "size": {size: list(captions.SIZE_WORDS[size]) for size in dataset.SIZES},
        "colour": {colour: [colour] for colour in dataset.OBJECT_COLOURS},
        "shape": {shape: [shape] for shape in dataset.SHAPES},
        "position": {position: _position_phrases(position) for position in dataset.POSITION_NAMES},
        "background": {background: list(captions.BACKGROUND_WORDS[background]) for background in dataset.BACKGROUNDS},
    }
    for slot, values in EXTRA_WORDS.items():
        for value, words in values.items():
            slots[slot][value] = list(dict.fromkeys(slots[slot][value] + list(words)))
    words = sorted({w for values in slots.values() for phrases in values.values() for p in phrases for w in p.split()}
                   | set(FILLER) | set(BACKGROUND_AFTER) | set(BACKGROUND_BEFORE) | set(COUNTS))
    return {
        "summary": captions.SUMMARY,
        "words": words,
        "slots": slots,
        "object_slots": ["size", "colour", "shape", "position"],
        # the word that ends an object's phrase ("a small red circle"), and the phrase written after or before it
        "noun_slot": "shape",
        "place_slot": "position",
        "scene_slots": ["background"],
        "background_words": {"after": list(BACKGROUND_AFTER), "before": list(BACKGROUND_BEFORE)},
        "filler": list(FILLER),
        "counts": COUNTS,
        "max_objects": 2,
        "sentence": {
            "object": "a {size} {colour} {shape} {position}",
            "join": " and ",
            "scene": "{objects} on a {background} background",
            "phrases": {"position": {name: phrase for name, (phrase, _, _) in dataset.POSITIONS.items()}},
        },
        "draw": {
            "values": {"size": list(dataset.SIZES), "colour": list(dataset.OBJECT_COLOURS),
                       "shape": list(dataset.SHAPES), "position": list(dataset.POSITION_NAMES),
                       "background": list(dataset.BACKGROUNDS)},
            # the rules of dataset.sample_scene
            "rules": [
                {"rule": "distinct", "slot": "position"},
                {"rule": "scene differs", "scene_slot": "background", "slot": "colour"},
                {"rule": "if any", "min_objects": 2, "slot": "position", "value": "center",
                 "then": {"slot": "size", "value": "small"}},
            ],
        },
    }


def write(path: Path = LANGUAGE_PATH) -> None:
    path.write_text(json.dumps(language_record(), indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write()
    print(f"wrote {LANGUAGE_PATH}")
