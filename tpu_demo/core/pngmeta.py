"""Generation settings carried inside each PNG.

Two text chunks: "parameters", in the AUTOMATIC1111 layout that image tools read
(prompt line, "Negative prompt: ..." line when there is one, then "Steps: 4, Sampler: ..., CFG scale: ..., Seed: ..., Size: WxH, Model: ..."),
and "tpu_demo", the same settings as JSON, which is what the app reads back.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from PIL import Image, PngImagePlugin

JSON_KEY = "tpu_demo"
PARAMETERS_KEY = "parameters"
#: The request fields a PNG restores.
SETTINGS_FIELDS = ("prompt", "negative_prompt", "model", "mode", "resolution", "num_inference_steps",
                   "guidance_scale", "seed")


def a1111_parameters(settings: Mapping[str, Any]) -> str:
    """The AUTOMATIC1111-style "parameters" text for ``settings``."""
    fields = [
        ("Steps", settings["num_inference_steps"]),
        ("Sampler", settings.get("scheduler", "FlowMatchEulerDiscreteScheduler")),
        ("CFG scale", settings["guidance_scale"]),
        ("Seed", settings["seed"]),
        ("Size", settings["resolution"]),
        ("Model", settings["model"]),
        ("Mode", settings.get("mode_description", settings["mode"])),
        ("Device", settings.get("device", "")),
    ]
    timings = settings.get("timings") or {}
    if timings:
        fields.append(("Time taken", f"{timings.get('total_seconds', 0):.2f}s"))
    body = ", ".join(f"{name}: {str(value).replace(',', ' ')}" for name, value in fields if value != "")
    negative = settings.get("negative_prompt") or ""
    # A1111's layout: the negative prompt on its own line between the prompt and the settings
    return f"{settings['prompt']}\n" + (f"Negative prompt: {negative}\n" if negative else "") + body


def attach(image: Image.Image, settings: Mapping[str, Any]) -> Image.Image:
    """Store ``settings`` in ``image.info`` so that saving as PNG writes both text chunks."""
    image.info[PARAMETERS_KEY] = a1111_parameters(settings)
    image.info[JSON_KEY] = json.dumps(dict(settings), sort_keys=True, default=str)
    return image


def png_info(image: Image.Image) -> PngImagePlugin.PngInfo:
    """A PngInfo holding the image's settings chunks, for ``image.save(path, pnginfo=...)``."""
    info = PngImagePlugin.PngInfo()
    for key in (PARAMETERS_KEY, JSON_KEY):
        if key in image.info:
            info.add_text(key, str(image.info[key]))
    return info


def read_settings(image: Image.Image) -> dict[str, Any] | None:
    """The settings stored in a PNG by this app, or None if it carries none."""
    text = getattr(image, "text", None) or image.info
    raw = text.get(JSON_KEY) if text else None
    if not raw:
        return None
    try:
        settings = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return {key: settings[key] for key in SETTINGS_FIELDS if key in settings} if isinstance(settings, dict) else None
