"""Generation settings carried inside each PNG, in two text chunks.

"parameters" is the AUTOMATIC1111 layout image tools read (a style as ``<lora:NAME:SCALE>``, "Drawn as:"
when the prompt was rewritten); "tpu_demo" holds the same settings as JSON and is the only one the app
reads back. The typed prompt is always kept; a PNG without ``upsample_prompt`` restores with it off.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from PIL import Image, PngImagePlugin

from tpu_demo.core.styles import lora_tag

JSON_KEY = "tpu_demo"
PARAMETERS_KEY = "parameters"
#: The request fields a PNG restores.
SETTINGS_FIELDS = ("prompt", "negative_prompt", "model", "mode", "resolution", "num_inference_steps",
                   "guidance_scale", "seed", "style", "style_scale", "upsample_prompt")


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
        ("Drawn as", settings.get("drawn_prompt", "")),
    ]
    timings = settings.get("timings") or {}
    if timings:
        fields.append(("Time taken", f"{timings.get('total_seconds', 0):.2f}s"))
    body = ", ".join(f"{name}: {str(value).replace(',', ' ')}" for name, value in fields if value != "")
    negative = settings.get("negative_prompt") or ""
    # A1111's layout: the negative prompt on its own line between the prompt and the settings
    tag = lora_tag(settings.get("style") or "", float(settings.get("style_scale", 1.0)))
    prompt = f"{settings['prompt']} {tag}" if tag else settings["prompt"]
    return f"{prompt}\n" + (f"Negative prompt: {negative}\n" if negative else "") + body


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
    return _restored(settings)


def _restored(settings: Any) -> dict[str, Any] | None:
    """The fields a PNG restores; ``upsample_prompt`` off when it predates the upsampler (as it was made)."""
    if not isinstance(settings, dict):
        return None
    return {"upsample_prompt": False, **{key: settings[key] for key in SETTINGS_FIELDS if key in settings}}


#: An uploaded PNG is refused past these: the largest bucket served is far smaller, and the
#: settings chunk is a few hundred bytes. Checked from the chunk headers, before any decoding.
MAX_UPLOAD_PIXELS = 4096 * 4096
MAX_TEXT_CHUNK_BYTES = 64 * 1024
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_TEXT_CHUNKS = (b"tEXt", b"iTXt", b"zTXt")


class PngRejected(ValueError):
    """An uploaded file that is not read; ``str()`` says why, for the user."""


def read_settings_file(path: str, max_pixels: int = MAX_UPLOAD_PIXELS,
                       max_text_bytes: int = MAX_TEXT_CHUNK_BYTES) -> dict[str, Any] | None:
    """The settings of an uploaded PNG without decoding its pixels, or None if it has none.

    Walks the chunk headers: the size comes from IHDR and is bounded before anything else; the
    text chunks this app writes come before the image data, so reading stops at the first IDAT
    (a decompression bomb is never inflated, and a huge text chunk is refused by its length).
    """
    with open(path, "rb") as file:
        if file.read(8) != _PNG_SIGNATURE:
            raise PngRejected("this file is not a PNG; drop a PNG made by this app")
        text: dict[str, str] = {}
        while True:
            header = file.read(8)
            if len(header) < 8:
                break
            length, kind = int.from_bytes(header[:4], "big"), header[4:]
            if kind == b"IHDR":
                data = file.read(length)
                width, height = int.from_bytes(data[0:4], "big"), int.from_bytes(data[4:8], "big")
                if width * height > max_pixels:
                    raise PngRejected(f"the PNG is {width}x{height} ({width * height / 1e6:.0f} megapixels); "
                                      f"images made here are at most {max_pixels / 1e6:.0f} megapixels")
            elif kind in _TEXT_CHUNKS:
                if length > max_text_bytes:
                    raise PngRejected(f"the PNG carries a {length / 1024:.0f} KiB text chunk; settings written "
                                      f"here are under {max_text_bytes // 1024} KiB")
                data = file.read(length)
                if kind == b"tEXt":
                    key, _, value = data.partition(b"\0")
                    text[key.decode("latin-1")] = value.decode("latin-1")
            elif kind in (b"IDAT", b"IEND"):
                break
            else:
                file.seek(length, 1)
            file.seek(4, 1)  # CRC
    raw = text.get(JSON_KEY)
    if not raw:
        return None
    try:
        settings = json.loads(raw)
    except ValueError:
        return None
    return _restored(settings)
