"""Live previews, Stop (mid-denoise, through the UI's Stop and the API's cancel), settings in PNGs."""

import json
import threading
import time

import numpy as np
import pytest
from gradio_client import Client
from PIL import Image

from tpu_demo.core import pngmeta
from support import preview_caption, preview_image, stopped_early
from conftest import request_fields


def test_previews_arrive_before_each_image_at_the_configured_interval(launch_app):
    app, url = launch_app("--no-warmup", "--preview-every", "3", "--preview-seconds", "0")
    client = Client(url, verbose=False)
    job = client.submit(**request_fields(num_inference_steps=10, num_images=2, seed=5), api_name="/generate")
    timeline = []  # ("preview", caption) or ("image", count); the gallery never holds a preview
    for gallery, preview in job:
        timeline.append(("preview", preview_caption(preview)) if preview else ("image", len(gallery)))
        assert all(item["caption"].startswith("seed ") for item in gallery)
    first_image = timeline.index(("image", 1))
    assert [kind for kind, _ in timeline[:first_image]] == ["preview"] * 3  # steps 3, 6, 9 of 10
    assert [caption for _, caption in timeline[:first_image]] == [
        f"preview \u00b7 image 1 \u00b7 step {step}/10" for step in (3, 6, 9)]
    assert [kind for kind, _ in timeline[first_image + 1:]] == ["preview"] * 3 + ["image"]
    # a preview update re-sends the finished images unchanged; a finished image clears the preview
    assert [len(gallery) for gallery, preview in job.outputs() if preview] == [0, 0, 0, 1, 1, 1]
    previews = [preview_image(preview) for _, preview in job.outputs() if preview]
    # previews are the latent grid itself (FLUX packs 2x2 latent patches: 64 px / 8 / 2 = 4), scaled by the page
    assert len(previews) == 6 and all(p.size == (4, 4) for p in previews)


def test_previews_never_change_the_final_pixels(launch_app):
    app, url = launch_app("--no-warmup", "--preview-every", "1", "--preview-seconds", "0")
    client = Client(url, verbose=False)
    job = client.submit(**request_fields(num_inference_steps=6, seed=11, previews=True), api_name="/generate")
    assert sum(1 for _, preview in job if preview) == 5  # steps 1-5: the last step's image is the result
    (final_with,), _ = job.outputs()[-1]
    (final_without,), _ = client.predict(**request_fields(num_inference_steps=6, seed=11, previews=False),
                                         api_name="/generate")
    assert np.array_equal(np.asarray(Image.open(final_with["image"])), np.asarray(Image.open(final_without["image"])))


def _slow_steps(app, model_id="tiny-flux", seconds=0.05):
    """Make each denoising step take ``seconds`` so a 50-step run can be stopped mid-way; records step times."""
    steps: list[float] = []

    def slow(module, args):
        time.sleep(seconds)
        steps.append(time.monotonic())

    app.engine.load(model_id).transformer.register_forward_pre_hook(slow)
    return steps


def test_previews_are_throttled_by_wall_time_through_the_app(launch_app):
    """Default --preview-seconds 0.25: a fast image streams no preview at all (its final image comes
    first); a slow one gets one per 0.25 s counted from its start, never one per step."""
    app, url = launch_app("--no-warmup")
    client = Client(url, verbose=False)
    fast = list(client.submit(**request_fields(num_inference_steps=4, num_images=2, previews=True), api_name="/generate"))
    assert not any(preview for _, preview in fast) and len(fast[-1][0]) == 2
    step_times = _slow_steps(app)  # 50 ms a step, one transformer call per step
    job = client.submit(**request_fields(num_inference_steps=20, seed=3, previews=True), api_name="/generate")
    steps = [int(preview_caption(preview).split("step ")[1].split("/")[0]) for _, preview in job if preview]
    assert steps and 19 not in steps and steps == sorted(set(steps))
    assert len(steps) <= 20 * 0.05 / 0.25 + 1  # about one per 0.25 s of a ~1 s image, not 19
    # step s's callback runs between forward s and forward s + 1 (each starting after a 50 ms sleep):
    # two previews 0.25 s apart lie at least 0.30 s apart in forward start times (the first comes 0.25 s
    # after the call began, which is before forward 1: test_preview_stream.py checks that rule exactly)
    for earlier, later in zip(steps, steps[1:]):
        assert step_times[later] - step_times[earlier - 1] >= 0.30 - 0.02, (earlier, later)


def test_stop_ends_the_run_within_two_steps_and_keeps_finished_images(launch_app):
    app, url = launch_app("--no-warmup", "--preview-every", "1", "--preview-seconds", "0")
    steps = _slow_steps(app)
    client = Client(url, verbose=False)
    job = client.submit(**request_fields(num_inference_steps=50, num_images=3, seed=1, previews=True),
                        api_name="/generate")
    stopped_at = None
    for finished, preview in job:
        if len(finished) == 1 and preview and "step 5/50" in preview_caption(preview):
            client.predict(api_name="/stop")  # same session as the job
            stopped_at = time.monotonic()
    assert stopped_at is not None
    deadline = time.monotonic() + 10
    while app.engine.status().busy and time.monotonic() < deadline:
        time.sleep(0.02)
    steps_after_stop = sum(1 for t in steps if t > stopped_at)
    assert steps_after_stop <= 2, f"{steps_after_stop} denoising steps ran after Stop"
    final, _ = job.outputs()[-1]
    assert stopped_early(job, 3) == len(final)  # an error that counts the finished images, not a success
    # every image the server finished before Stop survives (the client may lag behind the server,
    # so count on the server: one transformer call per step, 50 steps per image); the aborted one is not decoded
    finished_before_stop = sum(1 for t in steps if t <= stopped_at) // 50
    assert finished_before_stop >= 1 and len(final) == finished_before_stop
    assert len(steps) < 150  # the run did not go on to its end
    # the device is free for the next request right away
    started = time.monotonic()
    result, _ = client.predict(**request_fields(num_inference_steps=2, previews=False), api_name="/generate")
    assert len(result) == 1 and time.monotonic() - started < 30


@pytest.mark.parametrize("previews", [True, False])
def test_api_cancel_stops_the_running_generation(launch_app, previews):
    """gradio_client's job.cancel() (POST /cancel) stops the run within two steps, also before the
    handler's first update (Gradio alone could only close the handler when it next yields)."""
    app, url = launch_app("--no-warmup", "--preview-every", "1")
    steps = _slow_steps(app)
    client = Client(url, verbose=False)
    job = client.submit(**request_fields(num_inference_steps=50, num_images=2, previews=previews),
                        api_name="/generate")
    deadline = time.monotonic() + 30
    while len(steps) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    job.cancel()
    cancelled_at = time.monotonic()
    while app.engine.status().busy and time.monotonic() < cancelled_at + 10:
        time.sleep(0.02)
    assert not app.engine.status().busy
    assert sum(1 for t in steps if t > cancelled_at) <= 2
    assert len(steps) < 50


def test_png_settings_round_trip_and_restore(launch_app):
    app, url = launch_app("--no-warmup")
    client = Client(url, verbose=False)
    fields = request_fields(prompt="a small blue square at the top left", num_inference_steps=3, seed=1234,
                            resolution="96x64", previews=False, negative_prompt="", style="", style_scale=1.0,
                            upsample_prompt=False)
    (item,), _ = client.predict(**fields, api_name="/generate")
    with Image.open(item["image"]) as image:
        assert image.format == "PNG"
        stored = json.loads(image.text[pngmeta.JSON_KEY])
        parameters = image.text[pngmeta.PARAMETERS_KEY]
        settings = pngmeta.read_settings(image)
    for key in pngmeta.SETTINGS_FIELDS:
        assert stored[key] == fields[key], key
    assert settings == {key: fields[key] for key in pngmeta.SETTINGS_FIELDS}
    assert parameters.startswith(fields["prompt"] + "\nSteps: 3, ")
    assert "Seed: 1234" in parameters and "Size: 96x64" in parameters and "Model: tiny-flux" in parameters
    # dropping the PNG on the page fills every control from it
    restored = app.ui.restore.restore_settings(item["image"], "compiled")
    prompt, model, mode, resolution, steps, guidance, seed, randomize = restored[:8]
    assert (prompt, model, mode, seed, randomize) == (fields["prompt"], "tiny-flux", "eager", 1234, False)
    assert resolution["value"] == "96x64" and steps["value"] == 3 and guidance["value"] == 0.0
