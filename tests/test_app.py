"""The real app: a Gradio server on loopback driven by the real gradio_client."""

import numpy as np
import pytest
from gradio_client import Client
from PIL import Image

from conftest import request_fields


def test_generate_streams_one_gallery_update_per_image(served_app):
    app, url = served_app
    client = Client(url, verbose=False)
    job = client.submit(**request_fields(num_images=3, seed=100, previews=False), api_name="/generate")
    updates = [(len(gallery), preview) for gallery, preview in job]
    assert updates == [(1, ""), (2, ""), (3, "")]
    final, _ = job.outputs()[-1]
    images = [Image.open(item["image"]) for item in final]
    assert [image.size for image in images] == [(64, 64)] * 3
    assert "seed 100" in final[0]["caption"] and "seed 102" in final[2]["caption"]
    # the same request again gives the same pixels (seed + i)
    (again,), _ = client.predict(**request_fields(num_images=1, seed=101), api_name="/generate")
    assert np.array_equal(np.asarray(Image.open(again["image"])), np.asarray(images[1]))


def test_api_lists_the_documented_parameters(served_app):
    app, url = served_app
    api = Client(url, verbose=False).view_api(return_format="dict", print_info=False)
    parameters = [p["parameter_name"] for p in api["named_endpoints"]["/generate"]["parameters"]]
    assert parameters == ["prompt", "model", "mode", "resolution", "num_inference_steps", "guidance_scale",
                          "seed", "num_images", "previews", "negative_prompt", "style", "style_scale",
                          "upsample_prompt"]


def test_start_up_warms_the_configured_buckets_in_the_background(launch_app):
    import time

    app, url = launch_app("--model", "tiny-flux", "--mode", "compiled", "--buckets", "64x64,128x128")
    deadline = time.monotonic() + 180
    table = app.ui.bucket_table("tiny-flux", "compiled")
    while table.count("warm") < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        table = app.ui.bucket_table("tiny-flux", "compiled")
    rows = [line for line in table.splitlines() if line.startswith("| 64x64") or line.startswith("| 128x128")]
    assert len(rows) == 2 and all("warm" in row for row in rows), table
    compiled = app.engine.counter.count
    result, _ = Client(url, verbose=False).predict(**request_fields(mode="compiled", resolution="128x128", previews=False),
                                                api_name="/generate")
    assert "warm" in result[0]["caption"] and app.engine.counter.count == compiled


def test_default_model_warms_its_buckets_in_order_cold_compiling_warm(launch_app):
    """The embedded default in compiled mode: every bucket of the catalog entry (at least four, two of
    them non-square) goes cold -> compiling -> warm, one after another in the configured order, and
    the first bucket serves a request while the others may still compile."""
    import time

    from tpu_demo.core.catalog import get_spec
    from tpu_demo.core.modes import ExecutionMode

    labels = [str(b) for b in get_spec("tiny-shapes").buckets]
    assert len(labels) >= 4 and labels[0] == "64x64" and sum(b.width != b.height for b in get_spec("tiny-shapes").buckets) >= 2
    app, url = launch_app("--mode", "compiled", "--max-batch", "1")
    seen: dict[str, list[str]] = {label: [] for label in labels}
    warm_order: list[str] = []
    served = None
    deadline = time.monotonic() + 300
    while len(warm_order) < len(labels) and time.monotonic() < deadline:
        for row in app.engine.buckets_for("tiny-shapes", ExecutionMode.COMPILED):
            states = seen[row.resolution]
            if not states or states[-1] != row.state.value:
                states.append(row.state.value)
            if row.state.value == "warm" and row.resolution not in warm_order:
                warm_order.append(row.resolution)
        if warm_order and served is None:  # the first bucket is warm: the page is usable
            served = Client(url, verbose=False).submit(**request_fields(
                model="tiny-shapes", mode="compiled", resolution=labels[0], num_inference_steps=12,
                guidance_scale=3.0, previews=False), api_name="/generate")
        time.sleep(0.02)
    assert warm_order == labels, seen
    for label, states in seen.items():
        assert states[-2:] == ["compiling", "warm"] and states[0] in ("cold", "compiling"), (label, states)
    assert all(seen[label][0] == "cold" for label in labels[1:]), seen  # each waited for the one before
    result, _ = served.result(timeout=120)
    assert "warm" in result[0]["caption"]
    table = app.ui.bucket_table("tiny-shapes", "compiled")
    assert all(f"| {label} | compiled |" in table for label in labels) and table.count("warm") >= len(labels)


def test_default_start_is_the_trained_tiny_shapes_model(served_app):
    app, url = served_app
    assert app.ui.settings.start_model == "tiny-shapes"
    client = Client(url, verbose=False)
    api = client.view_api(return_format="dict", print_info=False)
    defaults = {p["parameter_name"]: p["parameter_default"] for p in api["named_endpoints"]["/generate"]["parameters"]}
    # the model is the start model; its settings are "the chosen model's" (None), here tiny-shapes' 64x64, 12 steps
    assert (defaults["model"], defaults["resolution"], defaults["num_inference_steps"]) == ("tiny-shapes", None, None)
    (left_out,), _ = client.predict(prompt="a large red circle", num_images=1, previews=False, api_name="/generate")
    parameters = Image.open(left_out["image"]).info["parameters"]
    assert "Steps: 12," in parameters and "Size: 64x64," in parameters, parameters
    result, _ = client.predict(prompt="a large red circle in the center on a white background", model="tiny-shapes",
                            mode="eager", resolution="64x64", num_inference_steps=12, guidance_scale=3.0, seed=0,
                            num_images=1, previews=False, api_name="/generate")
    image = np.asarray(Image.open(result[0]["image"]).convert("RGB"), dtype=float)
    corners = np.concatenate([image[:6, :6].reshape(-1, 3), image[-6:, -6:].reshape(-1, 3)])
    centre = image[24:40, 24:40].reshape(-1, 3)
    assert corners.mean() > 180  # a white background ...
    assert centre[:, 0].mean() - centre[:, 2].mean() > 60  # ... with something red in the centre


def test_compiled_mode_with_inductor_the_default_backend_matches_eager(launch_app):
    """The app's default compile backend off TPU is inductor; every other compiled test uses aot_eager.
    Here the real app compiles the trained tiny-shapes FluxPipeline with inductor through the API,
    and its image must match the eager image of the same seed."""
    app, url = launch_app("--no-warmup", "--compile-backend", "inductor")
    assert app.engine.counter.backend == "inductor"
    client = Client(url, verbose=False)
    fields = dict(prompt="a small blue square in the top left corner on a black background", model="tiny-shapes",
                  resolution="64x64", num_inference_steps=4, guidance_scale=3.0, seed=3, num_images=1, previews=False)
    eager, _ = client.predict(mode="eager", **fields, api_name="/generate")
    compiled, _ = client.predict(mode="compiled", **fields, api_name="/generate")
    # the PNG's own settings say what ran
    assert "compiled (inductor on cpu)" in Image.open(compiled[0]["image"]).info["parameters"]
    assert app.engine.counter.count >= 1  # inductor compiled at least one graph
    a = np.asarray(Image.open(eager[0]["image"]).convert("RGB"), dtype=float)
    b = np.asarray(Image.open(compiled[0]["image"]).convert("RGB"), dtype=float)
    assert a.shape == b.shape == (64, 64, 3)
    assert np.abs(a - b).max() <= 4, np.abs(a - b).max()  # fused kernels reorder float sums: a few levels at most
    assert np.abs(a - b).mean() <= 0.5
