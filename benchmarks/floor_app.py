"""Gradio's floor for the request path a browser speaks: a bare Gradio app, same version and queue
settings as the app, whose ``generate`` takes the same named inputs and yields one ready PNG per call.

No engine, no guard, no PNG encode: what is left is Gradio's own cost per request (the join, the queue,
the event stream, the copy of the file into its cache, the image fetch). ``benchmarks/throughput.py``
drives it with the same raw-HTTP visitors as the app and reports the app's time beyond it.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Any

#: distinct ready PNGs the floor cycles through (Gradio's cache copies each new file once, as the app's)
READY_PNGS = 256


def start_floor(inputs: tuple[str, ...], concurrency: int, poll_seconds: float, port: int) -> tuple[Any, Path]:
    """Launch the floor app on ``port`` (loopback); returns (Blocks, its work folder)."""
    import gradio as gr
    from PIL import Image

    from tpu_demo.web.gradio_internals import limit_queue_analytics, set_queue_polling
    from tpu_demo.web.outputs import NO_PREVIEW, gallery_data

    work = Path(tempfile.mkdtemp(prefix="gradio-floor-"))
    paths = []
    for index in range(READY_PNGS):  # encoded now, not per call: the floor does no image work
        path = work / f"{index:04d}.png"
        Image.new("RGB", (128, 128), (index % 256, 128, 255 - index % 256)).save(path, compress_level=1)
        paths.append(str(path))
    ready = itertools.cycle(paths)

    def generate(**values: Any):
        yield gallery_data([(next(ready), "floor")]), NO_PREVIEW

    with gr.Blocks(analytics_enabled=False) as demo:
        controls = {name: gr.Textbox(visible=False) for name in inputs}
        gallery, preview = gr.Gallery(format="png", type="filepath"), gr.HTML()
        gr.Button().click(generate, inputs_kwargs=controls, outputs=[gallery, preview], api_name="generate",
                          preprocess=False, postprocess=False, concurrency_id="device",
                          concurrency_limit=concurrency)
    limit_queue_analytics()
    demo.queue(max_size=None, default_concurrency_limit=1, api_open=False)  # as launch/serve.py
    set_queue_polling(demo, poll_seconds)
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    return demo, work


def stop_floor(demo: Any, work: Path) -> None:
    demo.close()
    shutil.rmtree(work, ignore_errors=True)
