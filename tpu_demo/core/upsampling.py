"""Prompt upsamplers as catalog data, and what one gives back: the prompt a model was really given.

A model may declare one upsampler (``ModelSpec.prompt_upsampler``); models without one show no
"Upsample prompt" control. An upsampler rewrites the visitor's prompt per image, from that image's
seed, so the same typed prompt and seed always draw the same picture.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class UpsamplerKind(str, enum.Enum):
    """How the prompt is rewritten."""

    #: a declared language file beside the weights (``language.json``), read by a generic reader
    LANGUAGE = "language"
    #: the pipeline's own ``upsample_prompt`` (FLUX.2's text encoder writes the new prompt)
    PIPELINE = "pipeline"


@dataclass(frozen=True)
class PromptUpsamplerSpec:
    """One model's prompt upsampler."""

    kind: UpsamplerKind
    #: the "Upsample prompt" control's value when the model is picked (and the API's default)
    default_on: bool
    #: LANGUAGE: the file beside the weights
    language_file: str = "language.json"
    #: PIPELINE: the sampling temperature passed to ``upsample_prompt`` (diffusers recommends 0.15)
    temperature: float = 0.15
    #: one line for the page and the docs: what turning it on costs
    cost_note: str = ""


@dataclass(frozen=True)
class DrawnPrompt:
    """What the model was given for one image, when an upsampler rewrote the typed prompt."""

    #: the prompt the pipeline received
    text: str
    #: the same, with what the seed chose in [brackets] (the caption's "drawn as: ...")
    marked: str
    #: the attributes the seed chose, e.g. ("position", "background") or ("size of shape 2",)
    seed_chose: tuple[str, ...] = ()
