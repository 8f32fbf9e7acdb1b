"""PNG uploads (the restore-settings drop zone) from outside: bounded in pixels and text, with a message."""

import struct
import zlib

import httpx
from gradio_client import Client

from conftest import request_fields
from support import GOOD, good_request_works, queue_call


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png(width: int, height: int, text: bytes = b"") -> bytes:
    ihdr = _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    return (b"\x89PNG\r\n\x1a\n" + ihdr + (_chunk(b"tEXt", text) if text else b"") +
            _chunk(b"IDAT", zlib.compress(b"\0" * 4096)) + _chunk(b"IEND", b""))


def _restore(http: httpx.Client, url: str, content: bytes, name: str = "drop.png") -> dict:
    """Upload a file as the page does (POST /gradio_api/upload), then run the restore handler on it through
    Gradio's queue, as the page does; its completion message."""
    (path,) = http.post("gradio_api/upload", files={"files": (name, content, "image/png")}).json()
    fn_index = next(dep["id"] for dep in http.get("config").json()["dependencies"]
                    if dep["api_name"] == "restore_settings")
    data = [{"path": path, "orig_name": name, "meta": {"_type": "gradio.FileData"}}, "eager"]
    return queue_call(http, fn_index, data, "upload")


def test_png_uploads_are_bounded_and_refused_with_a_message(served_app):
    app, url = served_app
    client = Client(url, verbose=False)
    (item,), _ = client.predict(**request_fields(num_inference_steps=3, seed=99, **GOOD), api_name="/generate")
    with httpx.Client(base_url=url, timeout=30) as http:
        with open(item["image"], "rb") as file:  # gradio_client downloaded the PNG the app made
            made_here = file.read()
        restored = _restore(http, url, made_here)
        assert restored["success"], restored
        assert 99 in restored["output"]["data"] and "tiny-flux" in restored["output"]["data"]
        for content, message in ((_png(20000, 20000), "image: the PNG is 20000x20000 (400 megapixels)"),
                                 (_png(64, 64, b"tpu_demo\0" + b"{" * (2 << 20)), "KiB text chunk"),
                                 (b"GIF89a not a png", "not a PNG")):
            answer = _restore(http, url, content)
            assert not answer["success"] and message in answer["output"]["error"], answer
        # a PNG without settings is answered with a warning, not an error
        assert _restore(http, url, _png(64, 64))["success"]
    good_request_works(client, app)
