"""A model's declared prompt language (``language.json``), read generically: a visitor's words -> its sentence.

It never refuses: text with no object gives None (the prompt goes as typed); unreadable words are skipped.
Case, hyphens, commas, "and", lead-ins and a full stop never change the reading. An attribute the text
names is never changed; one it leaves out is drawn from the seed under the declared rules. The same text
and seed always give the same sentence. No model names, no torch: only the file.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from tpu_demo.core.upsampling import DrawnPrompt

_TOKEN = re.compile(r"[^\W_]+|[,.;:!?]")
_BOUNDARY = {",", ".", ";", ":", "!", "?"}
#: draws tried before giving up on the rules (named values that break them)
_DRAW_TRIES = 200
#: the golden ratio's fractional part: the step of the seeds' walk over the possible draws
_GOLDEN = (math.sqrt(5) - 1) / 2
#: the step between one seed's successive draws when one breaks a rule (another irrational)
_REDRAW_STEP = math.sqrt(2) - 1
#: consecutive seeds spread over the possible draws within blocks of this many seeds
_SPREAD_BLOCK = 16


@dataclass
class _Object:
    """One object of a reading: slot -> value, for the slots the text names."""

    named: dict[str, str] = field(default_factory=dict)
    closed: bool = False  # its shape word has been read: a later size or colour starts another object


@dataclass(frozen=True)
class Reading:
    """What a text names: per object its named slots, and the scene's named slots."""

    objects: tuple[dict[str, str], ...]
    scene: dict[str, str]


class PromptLanguage:
    """One model's language (see the module docstring); build with :meth:`load`."""

    def __init__(self, record: dict[str, Any]):
        self.record = record
        self.object_slots: list[str] = list(record["object_slots"])
        self.scene_slots: list[str] = list(record["scene_slots"])
        self.max_objects = int(record["max_objects"])
        self.counts: dict[str, int] = {k: int(v) for k, v in record.get("counts", {}).items()}
        self.background_after = set(record["background_words"]["after"])
        self.background_before = set(record["background_words"]["before"])
        #: the slot whose word ends an object's phrase ("circle"), and the one written before or after it ("top left")
        self.noun_slot, self.place_slot = record["noun_slot"], record["place_slot"]
        # phrase (tuple of words) -> [(slot, value)]: one phrase may name a value of several slots
        # ("white" is a colour and a background); the context decides which (_read)
        self._phrases: dict[tuple[str, ...], list[tuple[str, str]]] = {}
        for slot, values in record["slots"].items():
            for value, phrases in values.items():
                for phrase in phrases:
                    self._phrases.setdefault(tuple(_words(phrase)), []).append((slot, value))
        self._longest = max(len(p) for p in self._phrases)
        self._draw = record["draw"]
        self._sentence = record["sentence"]

    @classmethod
    def load(cls, path: Path) -> "PromptLanguage":
        return _load(Path(path))

    # ---- reading ------------------------------------------------------------------------------
    def read(self, text: str) -> Reading | None:
        """What ``text`` names, or None when it names no object (no colour, no shape)."""
        tokens = _words(text)
        items = self._match(tokens)
        objects: list[_Object] = []
        scene: dict[str, str] = {}
        pending_positions: list[str] = []
        joined_since_close = False
        count = 1
        for index, (start, end, choices) in enumerate(items):
            if choices is None:  # a mark: "a red circle, top right" still places the red circle
                continue
            if choices == "and":  # "a red circle and at the top right a blue square": the next one's
                joined_since_close = True
                continue
            if choices == "count":
                count = self.counts[tokens[start]]
                continue
            slot, value = self._choose(tokens, items, index, choices)
            if slot in self.scene_slots:
                scene.setdefault(slot, value)
                continue
            current = objects[-1] if objects else None
            if slot == self.place_slot:
                if current is not None and slot not in current.named and not (current.closed and joined_since_close):
                    current.named[slot] = value
                else:
                    pending_positions.append(value)
                continue
            # "small circle, colour: orange": a word after its shape, when no shape of its own follows
            trailing = (current is not None and current.closed and slot not in current.named
                        and not joined_since_close and tokens[start - 1:start] not in (["a"], ["an"])
                        and not self._shape_follows(items, index))
            if not trailing and (current is None or current.closed or slot in current.named):
                current = _Object()
                objects.append(current)
                joined_since_close = False
                if pending_positions:
                    current.named[self.place_slot] = pending_positions.pop(0)
            current.named[slot] = value
            if slot == self.noun_slot:
                current.closed = True
                joined_since_close = False
                if count > 1:  # "two red circles": the same object again, its position left to the seed
                    objects.extend(_Object({k: v for k, v in current.named.items() if k != self.place_slot}, True)
                                   for _ in range(count - 1))
                    count = 1
        for obj in objects:  # positions written before or after all the objects ("..., top left and bottom right")
            if pending_positions and self.place_slot not in obj.named:
                obj.named[self.place_slot] = pending_positions.pop(0)
        objects = objects[: self.max_objects]
        if not objects:
            return None
        return Reading(tuple(dict(o.named) for o in objects), scene)

    def _shape_follows(self, items: list, index: int) -> bool:
        """Whether a noun comes next, past other words of an object only ("a little blue square")."""
        for _, _, choices in items[index + 1:]:
            if not isinstance(choices, list):
                return False
            if any(slot == self.noun_slot for slot, _ in choices):
                return True
            if not any(slot in self.object_slots and slot != self.place_slot for slot, _ in choices):
                return False
        return False

    def _match(self, tokens: list[str]) -> list[tuple[int, int, Any]]:
        """Longest known phrases, left to right: (start, end, [(slot, value)] | None (a mark) | "and" | "count")."""
        items: list[tuple[int, int, Any]] = []
        i = 0
        while i < len(tokens):
            for length in range(min(self._longest, len(tokens) - i), 0, -1):
                choices = self._phrases.get(tuple(tokens[i:i + length]))
                if choices:
                    items.append((i, i + length, choices))
                    i += length
                    break
            else:
                if tokens[i] in _BOUNDARY:
                    items.append((i, i + 1, None))
                elif tokens[i] == "and":
                    items.append((i, i + 1, "and"))
                elif tokens[i] in self.counts:
                    items.append((i, i + 1, "count"))
                i += 1
        return items

    def _choose(self, tokens: list[str], items: list, index: int, choices: list[tuple[str, str]]) -> tuple[str, str]:
        """Which slot an ambiguous phrase names: a scene slot when the words around it say so
        ("a white background", "on white, ..."), else the object's."""
        scene = [c for c in choices if c[0] in self.scene_slots]
        other = [c for c in choices if c[0] not in self.scene_slots]
        if not scene or not other:
            return choices[0]
        start, end, _ = items[index]
        after = [t for t in tokens[end:] if t not in ("a", "an", "the")]
        before = [t for t in tokens[:start] if t not in ("a", "an", "the")]
        if after and after[0] in self.background_after:  # "a white background"
            return scene[0]
        # "on white, a circle", "a circle on white", "backdrop: black"; but "on a white square" is an object's
        previous = before[-1] if before else ""
        previous_word = next((t for t in reversed(before) if t not in _BOUNDARY), "")
        shape_next = bool(after) and any(slot == self.noun_slot for slot, _ in self._phrases.get((after[0],), []))
        if (previous in self.background_before or previous_word in self.background_after) and not shape_next:
            return scene[0]
        return other[0]

    # ---- drawing the left-out attributes -------------------------------------------------------
    def rewrite(self, text: str, seed: int) -> DrawnPrompt | None:
        """The model's sentence for ``text``, what it leaves out drawn from ``seed``; None if no object is found."""
        reading = self.read(text)
        if reading is None:
            return None
        objects, scene = self.draw(reading, seed)
        return self._sentence_of(objects, scene, reading)

    def draw(self, reading: Reading, seed: int) -> tuple[list[dict[str, str]], dict[str, str]]:
        """Every slot of the scene: the named ones as read, the others drawn from ``seed``.

        The draw is the training scenes' (each left-out value uniform, the forcing rules applied, a
        draw that breaks a rule drawn again), made from a quasi-random sequence: seed ``s`` takes the
        point ``frac(r + s * golden ratio)`` of all possible draws (a mixed-radix number over the
        left-out slots; ``r`` random per block of 16 seeds), so consecutive seeds land far apart and
        eight seeds of "a red circle" are eight different scenes where independent draws would
        repeat some, while seeds far apart (1000 apart) draw independently.
        """
        values = self._draw["values"]
        left_out = [(i, slot) for i, named in enumerate(reading.objects) for slot in self.object_slots
                    if slot not in named] + [(-1, slot) for slot in self.scene_slots if slot not in reading.scene]
        total = math.prod(len(values[slot]) for _, slot in left_out)
        # seeds in one block of _SPREAD_BLOCK walk from the block's own random start: a request's images
        # (seed, seed + 1, ...) are spread, and seeds far apart are independent draws
        start = random.Random(seed // _SPREAD_BLOCK).random()
        for attempt in range(_DRAW_TRIES):
            index = int(((start + seed * _GOLDEN + attempt * _REDRAW_STEP) % 1.0) * total)
            objects = [dict(named) for named in reading.objects]
            scene = dict(reading.scene)
            for i, slot in reversed(left_out):  # the last slot is the least significant digit
                index, digit = divmod(index, len(values[slot]))
                (scene if i < 0 else objects[i])[slot] = values[slot][digit]
            self._force(objects, reading)
            if self._allowed(objects, scene, reading):
                break
        return objects, scene  # no allowed draw in _DRAW_TRIES: the last one (named values win over rules)

    def _force(self, objects: list[dict[str, str]], reading: Reading) -> None:
        """Apply the "if any" rules to the slots the text leaves out ("a centred shape makes both small")."""
        for rule in self._draw["rules"]:
            if rule["rule"] != "if any" or len(objects) < rule["min_objects"]:
                continue
            if any(o[rule["slot"]] == rule["value"] for o in objects):
                for obj, named in zip(objects, reading.objects):
                    if rule["then"]["slot"] not in named:
                        obj[rule["then"]["slot"]] = rule["then"]["value"]

    def _allowed(self, objects: list[dict[str, str]], scene: dict[str, str], reading: Reading) -> bool:
        """Whether a draw keeps every declared rule, except one the named values alone break."""
        for rule in self._draw["rules"]:
            kind = rule["rule"]
            if kind == "distinct":
                slot = rule["slot"]
                seen = [o[slot] for o in objects]
                named = [n[slot] for n in reading.objects if slot in n]
                if len(set(seen)) < len(seen) and len(set(named)) == len(named):
                    return False
            elif kind == "scene differs":
                for obj, named in zip(objects, reading.objects):
                    both_named = rule["scene_slot"] in reading.scene and rule["slot"] in named
                    if obj[rule["slot"]] == scene[rule["scene_slot"]] and not both_named:
                        return False
            elif kind == "if any":
                if len(objects) < rule["min_objects"] or not any(o[rule["slot"]] == rule["value"] for o in objects):
                    continue
                named_condition = any(n.get(rule["slot"]) == rule["value"] for n in reading.objects)
                then = rule["then"]
                # a named size keeps its value: it must not be drawn into the centre beside another shape
                if not named_condition and any(o[then["slot"]] != then["value"] for o in objects):
                    return False
            else:
                raise ValueError(f"unknown rule {kind!r} in the language's draw rules")
        return True

    def _sentence_of(self, objects: list[dict[str, str]], scene: dict[str, str], reading: Reading) -> DrawnPrompt:
        phrases = self._sentence.get("phrases", {})

        def phrase(slot: str, value: str, named: bool, marked: bool) -> str:
            text = phrases.get(slot, {}).get(value, value)
            return text if named or not marked else f"[{text}]"

        chosen: list[str] = []
        plain_objects, marked_objects = [], []
        for i, (obj, named) in enumerate(zip(objects, reading.objects)):
            for slot in self.object_slots:
                if slot not in named:
                    chosen.append(f"{slot}" if len(objects) == 1 else f"{slot} of shape {i + 1}")
            plain_objects.append(self._sentence["object"].format(
                **{s: phrase(s, obj[s], s in named, False) for s in self.object_slots}))
            marked_objects.append(self._sentence["object"].format(
                **{s: phrase(s, obj[s], s in named, True) for s in self.object_slots}))
        chosen += [slot for slot in self.scene_slots if slot not in reading.scene]
        join = self._sentence["join"]
        plain = self._sentence["scene"].format(objects=join.join(plain_objects), **scene)
        marked = self._sentence["scene"].format(
            objects=join.join(marked_objects),
            **{s: phrase(s, v, s in reading.scene, True) for s, v in scene.items()})
        return DrawnPrompt(text=plain, marked=marked, seed_chose=tuple(chosen))


def _words(text: str) -> list[str]:
    """Lowercased words and marks; hyphens and underscores split words ("top-left" -> "top", "left")."""
    return _TOKEN.findall(text.lower().replace("-", " ").replace("_", " "))


@lru_cache(maxsize=8)
def _load(path: Path) -> PromptLanguage:
    return PromptLanguage(json.loads(path.read_text(encoding="utf-8")))
