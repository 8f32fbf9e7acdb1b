"""Style adapters (LoRA) as catalog data, and the checks of a request's ``style`` and ``style_scale``.

A model entry lists its styles; visitors pick one by name (or none), never a path or a repo: where
the weights are is the operator's business, written here or in the catalog. Model code never
branches on a style's name: what a style does is its weights, plus the trigger words, if any,
put before the prompt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: what the page and the API call "no style"
NO_STYLE = "None"
#: the scale a visitor may set: 0 (the base model's pixels) to twice the trained strength
STYLE_SCALE_RANGE = (0.0, 2.0)


@dataclass(frozen=True)
class StyleSpec:
    """One style adapter a model offers."""

    #: what visitors pick ("outline"); also the A1111 ``<lora:NAME:SCALE>`` name in the PNG
    name: str
    title: str
    #: "assets:<path>" (committed under assets/), "hub:<org>/<repo>/<file>" (in the local Hugging
    #: Face cache, fetched beforehand) or an absolute path to a ``.safetensors`` file
    source: str
    default_scale: float = 1.0
    #: words put before the prompt when the adapter was trained with them ("" for none)
    trigger: str = ""
    #: a prompt the page lists under "Try a style" with this style set ("" for none)
    example: str = ""

    def problems(self) -> list[str]:
        """What makes this entry unusable (empty when it is fine), for the catalog's validation."""
        problems = []
        if not self.name or self.name.strip() != self.name or self.name == NO_STYLE or "," in self.name:
            problems.append(f"style name {self.name!r} must be a plain word, not {NO_STYLE!r}")
        if not self.source.startswith(("assets:", "hub:", "/")) or not self.source.endswith(".safetensors"):
            problems.append(f"style {self.name!r}: source {self.source!r} must be assets:, hub: or an absolute "
                            "path to a .safetensors file")
        low, high = STYLE_SCALE_RANGE
        if not (math.isfinite(self.default_scale) and low <= self.default_scale <= high):
            problems.append(f"style {self.name!r}: default_scale {self.default_scale} is outside {STYLE_SCALE_RANGE}")
        return problems


def style_names(styles: tuple[StyleSpec, ...]) -> tuple[str, ...]:
    """What the Style control offers: None first, then the model's styles."""
    return (NO_STYLE, *(style.name for style in styles))


def find_style(styles: tuple[StyleSpec, ...], name: str) -> StyleSpec | None:
    """The style called ``name``; None for no style ("" or "None")."""
    if name in ("", NO_STYLE):
        return None
    return next(style for style in styles if style.name == name)


def default_scale(styles: tuple[StyleSpec, ...], name: object) -> float:
    """The strength a request gets when it names no ``style_scale``: the style's catalog default; 1.0
    for no style or a name the model does not offer (validation refuses that one, naming the field)."""
    return next((style.default_scale for style in styles if style.name == name), 1.0)


def styled_prompt(styles: tuple[StyleSpec, ...], name: str, prompt: str) -> str:
    """The prompt the pipeline gets: the style's trigger words, if any, before the visitor's prompt."""
    style = find_style(styles, name)
    return f"{style.trigger} {prompt}" if style is not None and style.trigger else prompt


def lora_tag(name: str, scale: float) -> str:
    """The AUTOMATIC1111 prompt tag of a LoRA: ``<lora:outline:0.8>`` ("" for no style)."""
    return f"<lora:{name}:{scale:g}>" if name not in ("", NO_STYLE) else ""
