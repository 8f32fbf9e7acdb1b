"""The reproduce link (core/links.py): settings -> query -> the same request, and every bad parameter
refused by the API's validation under the link's own parameter name. Pure functions: seconds."""

import pytest

from tpu_demo.core import links
from tpu_demo.core.request import RequestError, RequestLimits, validate_request

from conftest import request_fields


def _assert_refused(query: str, cases: dict[str, str], field_is_parameter: bool = False) -> None:
    """Each ``"name=value": message`` case replaces that parameter of ``query``; the link is refused with
    an error starting with ``message`` (and, when asked, naming the parameter as its field)."""
    for change, message in cases.items():
        name = change.split("=")[0]
        tampered = "&".join(change if part.startswith(name + "=") else part for part in query.split("&"))
        with pytest.raises(RequestError) as error:
            links.request_from_link(tampered)
        assert str(error.value).startswith(message), (change, str(error.value))
        assert not field_is_parameter or error.value.field == name, (change, error.value.field)


def test_a_link_reproduces_the_request_and_bad_parameters_name_the_link_field():
    original = validate_request(request_fields(prompt="a red circle & a blue square?", seed=4294967295,
                                               guidance_scale=0.0, num_images=3))
    settings = dict(original.as_dict(), resolution=original.resolution)
    query = links.link_query(settings)
    assert query.startswith("prompt=a+red+circle+%26+a+blue+square%3F&model=tiny-flux&mode=eager&resolution=64x64")
    assert "negative_prompt" not in query  # left out when empty
    again = links.request_from_link("?" + query)
    assert again == validate_request(dict(request_fields(prompt=original.prompt, seed=original.seed), num_images=1))
    assert links.is_link("?" + query) and not links.is_link("") and not links.is_link("?__theme=dark")

    cases = {"steps=999": "steps: must be from", "seed=-1": "seed: must be from 0 to 4294967295",
             "resolution=4096x4096": "resolution: 4096x4096 is not served for tiny-flux",
             "guidance=nan": "guidance: must be", "model=../../etc": "model: ", "mode=turbo": "mode: 'turbo' is not a mode",
             "prompt=": "prompt: is empty"}
    _assert_refused(query, cases)
    with pytest.raises(RequestError, match="^seed: is missing from the link"):
        links.request_from_link(query.replace("&seed=4294967295", ""))
    with pytest.raises(RequestError, match="^seed: is given more than once"):
        links.request_from_link(query + "&seed=1")
    with pytest.raises(RequestError, match="^model: "):
        links.request_from_link(query, RequestLimits(offered_models=("tiny-sd3",)))


def test_a_styled_link_carries_its_style_and_a_tampered_style_is_refused_under_its_name():
    """A link to a styled image (tiny-shapes' trained styles) carries style and style_scale and gives
    back the same request; an unstyled one carries neither (links made before styles stay valid)."""
    shapes = dict(model="tiny-shapes", guidance_scale=3.0, num_inference_steps=4)
    original = validate_request(request_fields(style="outline", style_scale=0.8, **shapes))
    query = links.link_query(dict(original.as_dict(), resolution=original.resolution))
    assert query.endswith("&seed=7&style=outline&style_scale=0.8")
    again = links.request_from_link(query)
    assert (again.style, again.style_scale) == ("outline", 0.8) and again == original
    for unstyled in ("", "None"):
        plain = links.link_query(dict(original.as_dict(), resolution=original.resolution, style=unstyled))
        assert "style" not in plain and links.request_from_link(plain).style == ""
    assert links.request_from_link(query.replace("style=outline", "style=None")).style == ""

    cases = {"style=watercolor": "style: 'watercolor' is not a style of tiny-shapes",
             "style=..%2F..%2Fetc%2Fpasswd": "style: '../../etc/passwd' is not a style of tiny-shapes",
             "style_scale=2.5": "style_scale: must be from 0.0 to 2.0", "style_scale=nan": "style_scale: must be",
             "style_scale=strong": "style_scale: must be a number"}
    _assert_refused(query, cases, field_is_parameter=True)
    with pytest.raises(RequestError, match="^style: is given more than once"):
        links.request_from_link(query + "&style=shaded")
    with pytest.raises(RequestError, match="^style: 'outline' is not a style of tiny-flux"):  # the model's own list
        links.request_from_link(links.link_query(dict(request_fields(), style="outline", style_scale=1.0)))
