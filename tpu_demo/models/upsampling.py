"""A loaded model's prompt upsampler: the typed prompt and an image's seed -> what the pipeline is given.

Built from the catalog's ``PromptUpsamplerSpec``; no model names here. ``language`` is pure Python and
fits the model's static text length, so it never makes a new graph; ``pipeline`` samples the pipeline's
own ``upsample_prompt`` under the image's seed in a forked RNG, so a seed writes the same prompt on every
rank. ``rewrite`` returns None when the prompt goes to the model as typed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tpu_demo.core.catalog import ModelSpec
from tpu_demo.core.upsampling import DrawnPrompt, UpsamplerKind
from tpu_demo.models.prompt_language import PromptLanguage


class LanguageUpsampler:
    """Rewrites into a declared sentence form; what the text leaves out comes from the seed."""

    #: pure Python on rank 0: followers of a tensor-parallel group just receive the sentence
    uses_text_encoder = False

    def __init__(self, language_path: Path):
        self.language = PromptLanguage.load(language_path)

    def rewrite(self, prompt: str, seed: int) -> DrawnPrompt | None:
        return self.language.rewrite(prompt, seed)


class PipelineUpsampler:
    """Calls ``pipeline.upsample_prompt(prompt, temperature=...)`` with the image's seed."""

    #: a sharded text encoder generates on every rank: the engine runs it in lockstep
    uses_text_encoder = True

    def __init__(self, pipeline: Any, temperature: float):
        self.pipeline, self.temperature = pipeline, temperature
        # diffusers decodes with a processor's inner tokenizer (FLUX.2's PixtralProcessor.tokenizer); a
        # plain tokenizer in the processor's place (the offline stand-in's Qwen2 tokenizer) is its own
        tokenizer = pipeline.tokenizer
        if not hasattr(tokenizer, "tokenizer"):
            tokenizer.tokenizer = tokenizer

    def rewrite(self, prompt: str, seed: int) -> DrawnPrompt | None:
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(seed)
            text = self.pipeline.upsample_prompt(prompt, temperature=self.temperature)[0].strip()
        if not text or text == prompt:
            return None
        return DrawnPrompt(text=text, marked=text)


PromptUpsampler = LanguageUpsampler | PipelineUpsampler


def build_upsampler(spec: ModelSpec, text_pipeline: Any) -> PromptUpsampler | None:
    """The upsampler ``spec`` declares, over ``text_pipeline`` (the pipeline holding the text encoder)."""
    upsampler = spec.prompt_upsampler
    if upsampler is None:
        return None
    if upsampler.kind is UpsamplerKind.LANGUAGE:
        assert spec.language_path is not None  # ModelSpec.validate: a language needs an assets: folder
        return LanguageUpsampler(spec.language_path)
    return PipelineUpsampler(text_pipeline, upsampler.temperature)
