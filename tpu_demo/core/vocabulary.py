"""A model's declared vocabulary, and which words of a prompt fall outside it.

A model trained here on a closed language (tiny-shapes) declares the words it was trained on in a
``vocabulary.json`` beside its weights; real models declare none and the page shows nothing.
Nothing is refused: the page only says which words the model cannot read, so a visitor who types
"a cat on a sofa" learns why the picture is not a cat.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

#: What a vocabulary file holds: the words, and one sentence of what the model draws.
#: ``{"words": ["a", "red", ...], "summary": "it draws circles, squares and triangles in ..."}``
VOCABULARY_FILE = "vocabulary.json"

#: runs of letters, hyphenated ones whole: "top-left," -> "top-left" (a word of its own, or its two parts)
_WORD = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*")


@dataclass(frozen=True)
class Vocabulary:
    words: frozenset[str]
    summary: str

    def unknown_words(self, prompt: str) -> list[str]:
        """The prompt's words outside the vocabulary, lowercased, first occurrence order, no repeats."""
        seen: dict[str, None] = {}
        for word in _WORD.findall(prompt.lower()):
            if word in self.words:
                continue
            for part in word.split("-"):
                if part not in self.words:
                    seen.setdefault(part)
        return list(seen)


@lru_cache(maxsize=16)
def load_vocabulary(path: Path) -> Vocabulary | None:
    """The vocabulary declared in ``path`` (None when the file does not exist)."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return Vocabulary(frozenset(str(w).lower() for w in data["words"]), str(data.get("summary", "")))


def vocabulary_note(vocabulary: Vocabulary | None, title: str, prompt: str, max_words: int = 8) -> str:
    """One line for under the prompt, or "" when every word is known (or the model declares no vocabulary)."""
    if vocabulary is None:
        return ""
    unknown = vocabulary.unknown_words(prompt)
    if not unknown:
        return ""
    shown = ", ".join(unknown[:max_words]) + (f" (+{len(unknown) - max_words} more)" if len(unknown) > max_words else "")
    possessive = f"{title}'" if title.endswith("s") else f"{title}'s"
    return f"Not in {possessive} vocabulary: {shown}; {vocabulary.summary}"
