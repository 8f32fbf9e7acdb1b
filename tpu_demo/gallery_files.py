"""Gallery images as PNG files written once, so a streaming gallery never serves a half-written file.

A generator that yields the growing gallery as PIL images makes Gradio re-encode and rewrite
every earlier image on every yield (``processing_utils.save_pil_to_cache`` writes in place,
to a path named by the content hash). A browser still fetching image 1 while image 2's update
rewrites it receives a truncated file: a broken image in the page ("Too little data for
declared Content-Length" in the server log). Writing each image once, atomically, into
Gradio's upload folder and yielding its path avoids that: Gradio serves files already in its
cache folder as they are.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from pathlib import Path

from gradio.utils import get_upload_folder
from PIL import Image

from . import pngmeta


def save_png_once(image: Image.Image, folder: str | Path | None = None) -> str:
    """Write ``image`` as PNG (settings chunks kept) unless identical bytes exist; returns its path."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=pngmeta.png_info(image))
    data = buffer.getvalue()
    directory = Path(folder or get_upload_folder()) / f"tpu-demo-{hashlib.sha256(data).hexdigest()[:32]}"
    path = directory / "image.png"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        fd, staging = tempfile.mkstemp(dir=directory, prefix=".image.", suffix=".png")
        with os.fdopen(fd, "wb") as staging_file:
            staging_file.write(data)
        os.replace(staging, path)  # atomic: readers see no file or the whole file
    return str(path)
