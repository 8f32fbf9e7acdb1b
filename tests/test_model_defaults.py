"""What a caller leaves out is the chosen model's default, not the start model's.

Every door builds one ``GenerationRequest`` from named inputs (``core.request.validate_request``): the
check itself for every catalog model (the resolution is required there), and real ``gradio_client``
calls for every tiny model that name the model and leave its settings out (``/generate``, what the page's
Generate runs, and ``/generate_images``, the MCP tool's endpoint; both fill the resolution with the model's
first bucket), read back from the settings of the image each made.
"""

from __future__ import annotations

import re

import pytest
from gradio_client import Client

from tpu_demo.core.catalog import CATALOG, get_spec
from tpu_demo.core.links import request_from_link
from tpu_demo.core.pngmeta import read_settings_file
from tpu_demo.core.request import GENERATE_INPUTS, RequestError, named_inputs, validate_request

TINY_MODELS = ("tiny-shapes", "tiny-flux", "tiny-sd3", "tiny-flux2")


def _defaults(model: str) -> tuple:
    spec = get_spec(model)
    upsampler = spec.prompt_upsampler
    return (str(spec.buckets[0]), spec.default_steps, spec.default_guidance,
            upsampler is not None and upsampler.default_on, "", 1.0)


@pytest.mark.parametrize("model", sorted(CATALOG))
def test_a_request_that_leaves_settings_out_takes_the_chosen_models_defaults(model):
    sent = {"prompt": "a red circle", "model": model, "mode": "eager"}
    with pytest.raises(RequestError, match="resolution: .*null"):  # the resolution is required, not defaulted
        validate_request(sent)
    bucket = str(get_spec(model).buckets[-1])
    request = validate_request(dict(sent, resolution=bucket))
    assert (request.resolution, request.num_inference_steps, request.guidance_scale, request.upsample_prompt,
            request.style, request.style_scale) == (bucket, *_defaults(model)[1:])


def test_a_null_means_left_out_only_where_the_door_says_so():
    sent = {"prompt": "a red circle", "model": "tiny-shapes", "mode": "eager",
            "resolution": str(get_spec("tiny-shapes").buckets[0])}
    with pytest.raises(RequestError, match="upsample_prompt: .*null"):  # the page's doors: refused like every null
        validate_request(dict(sent, upsample_prompt=None))
    raw = named_inputs(dict(sent, upsample_prompt=None, guidance_scale=None), frozenset({"upsample_prompt"}))
    assert "upsample_prompt" not in raw and raw["guidance_scale"] is None  # a null guidance is refused, not defaulted
    assert set(GENERATE_INPUTS) >= set(raw)


def test_gradio_client_call_naming_each_tiny_model_runs_at_that_models_defaults(launch_app):
    app, url = launch_app("--no-warmup", "--model", "tiny-flux", "--models", ",".join(TINY_MODELS))
    client = Client(url, verbose=False)
    for model in TINY_MODELS:
        text = client.predict(prompt="a red circle on a white background", model=model, api_name="/generate_images")
        link = re.search(r"link: \S*?/\?(\S+)", text)
        assert link, text
        ran = request_from_link(link.group(1))
        assert ran.model == model
        assert (ran.resolution, ran.num_inference_steps, ran.guidance_scale, ran.upsample_prompt, ran.style,
                ran.style_scale) == _defaults(model), (model, text)
        (image,), _ = client.predict(prompt="a red circle on a white background", model=model, num_images=1,
                                     previews=False, api_name="/generate")
        settings = read_settings_file(image["image"])
        assert settings["model"] == model
        assert (settings["resolution"], settings["num_inference_steps"], settings["guidance_scale"],
                settings["upsample_prompt"], settings.get("style") or "", settings.get("style_scale", 1.0)) \
            == _defaults(model), (model, settings)


def test_compare_modes_naming_a_model_runs_every_mode_at_that_models_defaults(launch_app):
    """``/compare_modes`` the same way: tiny-sd3 (guidance 4.5) named on a tiny-flux (guidance 0.0) server."""
    app, url = launch_app("--no-warmup", "--model", "tiny-flux", "--models", "tiny-flux,tiny-sd3")
    gallery, _, figures = Client(url, verbose=False).predict(prompt="a red circle on a white background",
                                                             model="tiny-sd3", api_name="/compare_modes")
    assert len(gallery) == len(figures["modes"]) == 3
    for item in gallery:
        settings = read_settings_file(item["image"])
        assert (settings["model"], settings["resolution"], settings["num_inference_steps"],
                settings["guidance_scale"]) == ("tiny-sd3", *_defaults("tiny-sd3")[:3]), settings
