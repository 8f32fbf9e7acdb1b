"""The Style control and its strength slider (in Advanced): what a model offers, and what a caption says.

Visitors choose a style by name from the model's list (None first); the engine swaps the adapter
on the warm graph, so a switch never compiles. A model whose placement cannot take styles shows
None only and says why.
"""

from __future__ import annotations

from typing import Any, Mapping

import gradio as gr

from tpu_demo.core.catalog import ModelSpec
from tpu_demo.core.engine_api import EngineAPI
from tpu_demo.core.styles import NO_STYLE, STYLE_SCALE_RANGE, default_scale, find_style


def style_choices(engine: EngineAPI, spec: ModelSpec) -> tuple[list[tuple[str, str]], str]:
    """(label, name) pairs for the Style control, and the line under it."""
    refusal = engine.style_refusal(spec.id) if spec.styles else None
    if not spec.styles or refusal:
        return [(NO_STYLE, NO_STYLE)], refusal or f"{spec.short_title or spec.id} has no styles"
    return ([(NO_STYLE, NO_STYLE)] + [(style.title, style.name) for style in spec.styles],
            "swapped on the warm graph: no recompile")


def style_updates(engine: EngineAPI, spec: ModelSpec, style: str = NO_STYLE, scale: float | None = None) -> tuple:
    """Updates for (style, style scale) showing ``spec``'s styles, ``style`` selected."""
    choices, info = style_choices(engine, spec)
    chosen = find_style(spec.styles, style) if style in [name for _, name in choices] else None
    value = chosen.name if chosen else NO_STYLE
    return (gr.update(choices=choices, value=value, info=info, interactive=len(choices) > 1),
            gr.update(value=default_scale(spec.styles, value) if scale is None else scale))


def style_controls(engine: EngineAPI, spec: ModelSpec) -> tuple[gr.Dropdown, gr.Slider]:
    """The Style dropdown and its strength slider, for the start model (not rendered yet: the style
    examples under the prompt set them, and they are rendered in Advanced)."""
    choices, info = style_choices(engine, spec)
    style = gr.Dropdown(label="Style", choices=choices, value=NO_STYLE, info=info, interactive=len(choices) > 1,
                        elem_id="style", render=False)
    low, high = STYLE_SCALE_RANGE
    scale = gr.Slider(label="Style strength", minimum=low, maximum=high, step=0.05, value=1.0,
                      info="0 draws as no style", elem_id="style-scale", render=False)
    return style, scale


def style_example_samples(spec: ModelSpec) -> tuple[list[list], list[str]]:
    """(prompt, bucket, style, strength) of each of ``spec``'s styles with an example prompt, and their labels."""
    rows = [style_spec for style_spec in spec.styles if style_spec.example]
    return ([[s.example, str(spec.buckets[0]), s.name, s.default_scale] for s in rows],
            [f"{s.name} \u00b7 {s.example}" for s in rows])


def style_examples(spec: ModelSpec, prompt: Any, resolution: Any, style: Any, scale: Any) -> gr.Examples | None:
    """"Try a style" for the start model: each of its styles with its example prompt (catalog), at its strength."""
    samples, labels = style_example_samples(spec)
    if not samples:
        return None
    return gr.Examples(examples=samples, inputs=[prompt, resolution, style, scale], label="Try a style",
                       elem_id="style-examples", example_labels=labels)


def caption_part(parameters: Mapping[str, Any]) -> str:
    """" · style outline 1" for a caption ("" for no style)."""
    name = parameters.get("style") or ""
    return f" \u00b7 style {name} {float(parameters.get('style_scale', 1.0)):g}" if name else ""
