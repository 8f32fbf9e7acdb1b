"""The resident placement's host side: text encoders on the host, prompt embeddings cached.

No weight moves per request: the transformer and VAE stay on the chip, the text encoders run on the host
in a second pipeline of the same class (``transformer=None, vae=None``), and only their embeddings go to
the device. An LRU cache keyed by everything that changes the embeddings lets a repeated prompt skip the
encoders.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import torch

from tpu_demo.core.catalog import ModelSpec

#: Distinct prompts whose embeddings stay cached (host memory: a few MB each).
DEFAULT_CAPACITY = 64


class PromptEncoder:
    """Encodes prompts on the host and remembers the last ``capacity`` distinct ones."""

    def __init__(self, encoder_pipeline: Any, spec: ModelSpec, capacity: int = DEFAULT_CAPACITY):
        self.encoder_pipeline = encoder_pipeline
        self.spec = spec
        self._encode = functools.lru_cache(maxsize=capacity)(self._encode_uncached)

    @property
    def hits(self) -> int:
        return self._encode.cache_info().hits

    @property
    def misses(self) -> int:
        return self._encode.cache_info().misses

    def call_inputs(self, prompt: str, guidance: float, target_device: torch.device,
                    negative_prompt: str = "") -> dict[str, Any]:
        """Keyword arguments for the denoising pipeline: the embeddings (moved to the chip) in place of
        ``prompt`` / ``negative_prompt``, and the model's other call arguments."""
        kwargs = dict(self.spec.pipeline_kwargs(guidance, negative_prompt))
        negative = kwargs.pop("negative_prompt", None)
        uses_cfg = self.spec.cfg_doubles_batch and guidance > 1.0
        out_layers = kwargs.get("text_encoder_out_layers")  # FLUX.2: which hidden states make the embedding
        embeddings = self._encode(prompt, negative, uses_cfg, kwargs.get("max_sequence_length"),
                                  tuple(out_layers) if out_layers is not None else None)
        return {**kwargs, **{name: tensor.to(target_device) for name, tensor in embeddings.items()}}

    @torch.inference_mode()
    def _encode_uncached(self, prompt: str, negative: str | None, uses_cfg: bool, max_sequence_length: int | None,
                         out_layers: tuple[int, ...] | None = None) -> Mapping[str, torch.Tensor]:
        encoder, host = self.encoder_pipeline, torch.device("cpu")
        length = {} if max_sequence_length is None else {"max_sequence_length": max_sequence_length}
        kind = self.spec.pipeline_class
        if kind == "FluxPipeline":
            embeds, pooled, _ = encoder.encode_prompt(prompt=prompt, prompt_2=None, device=host, **length)
            out = {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}
            if negative is not None:  # true CFG: FluxPipeline runs it when true_cfg_scale > 1
                negative_embeds, negative_pooled, _ = encoder.encode_prompt(prompt=negative, prompt_2=None,
                                                                            device=host, **length)
                out.update(negative_prompt_embeds=negative_embeds, negative_pooled_prompt_embeds=negative_pooled)
            return out
        if kind == "StableDiffusion3Pipeline":
            embeds, negative_embeds, pooled, negative_pooled = encoder.encode_prompt(
                prompt=prompt, prompt_2=None, prompt_3=None, device=host, do_classifier_free_guidance=uses_cfg,
                negative_prompt=negative, **length)
            out = {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}
            if uses_cfg:
                out.update(negative_prompt_embeds=negative_embeds, negative_pooled_prompt_embeds=negative_pooled)
            return out
        if kind == "Flux2Pipeline":
            layers = {} if out_layers is None else {"text_encoder_out_layers": out_layers}
            embeds, _ = encoder.encode_prompt(prompt=prompt, device=host, **length, **layers)
            return {"prompt_embeds": embeds}
        raise ValueError(f"no prompt encoding known for {kind}")


def split_text_encoders(pipeline: Any, spec: ModelSpec) -> PromptEncoder:
    """Move ``pipeline``'s text encoders into a host-side encoder pipeline; ``pipeline`` keeps the rest."""
    components = pipeline.components
    encoder_pipeline = type(pipeline)(**{**components, "transformer": None, "vae": None})
    encoder_pipeline.set_progress_bar_config(disable=True)
    for name in components:
        if name.startswith("text_encoder"):
            setattr(pipeline, name, None)  # DiffusionPipeline.__setattr__ keeps its config in step
    return PromptEncoder(encoder_pipeline, spec)
