"""What the generate event sends: finished images as PNG files, the live preview as inline HTML.

A finished image is a file (settings chunks included) Gradio copies into its cache once; a preview is
an ``<img>`` with a ``data:`` URL in a ``gr.HTML`` output, never a file. The event runs with
``postprocess=False``: the handler yields what Gradio sends (``gallery_data``); see docs/generation.md.
"""

from __future__ import annotations

import base64
import html
import io
import shutil
import tempfile
import time
from pathlib import Path

import gradio as gr
from PIL import Image

from tpu_demo.core import pngmeta

#: the preview output when no image is denoising (Gradio's HTML renders an empty string as nothing)
NO_PREVIEW = ""


class RequestFiles:
    """Each image of a request written once as a PNG (settings chunks included).

    The gallery is re-sent whole on every update; handing Gradio PIL images would re-encode and
    rewrite every earlier image's cache file each time, racing clients that are downloading it.
    File paths are copied into Gradio's cache once. The files here go when the request ends.
    """

    def __init__(self):
        self.directory = Path(tempfile.mkdtemp(prefix="tpu-demo-"))
        self._count = 0
        #: seconds spent encoding and writing PNGs (the request log's ``png_encode_write`` stage)
        self.encode_seconds = 0.0

    def save(self, image: Image.Image, name: str) -> str:
        started = time.perf_counter()
        self._count += 1
        path = self.directory / f"{self._count:04d}-{name}.png"
        image.save(path, format="PNG", pnginfo=pngmeta.png_info(image), compress_level=1)
        self.encode_seconds += time.perf_counter() - started
        return str(path)

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def gallery_data(images: list[tuple[str, str]]) -> list[dict]:
    """(PNG path, caption) pairs as ``gr.Gallery`` sends them (``GalleryData``): what its postprocess makes."""
    return [{"image": gr.FileData(path=path, orig_name=Path(path).name, mime_type="image/png").model_dump(),
             "caption": caption} for path, caption in images]


def preview_html(image: Image.Image, caption: str) -> str:
    """``image`` (the latent grid, e.g. 4x4 px for a 64x64 FLUX image) inline at its own aspect ratio, scaled
    up by the page; ``alt`` and caption carry the same text, for screen readers and API callers alike."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    text = html.escape(caption)
    return (f'<figure class="live-preview"><img src="data:image/png;base64,{data}" alt="{text}" '
            f'style="aspect-ratio: {image.width} / {image.height}"><figcaption>{text}</figcaption></figure>')


def user_error(message: str, title: str) -> gr.Error:
    """An error for the user's modal and API callers: Gradio renders its text as HTML, and it can quote
    what the caller sent, so markup is escaped; the operator log has its own line (no stack trace)."""
    return gr.Error(html.escape(message, quote=False), title=title, print_exception=False)
