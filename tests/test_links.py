"""The reproduce link (core/links.py): settings -> query -> the same request, and every bad parameter
refused by the API's validation under the link's own parameter name. Pure functions: seconds."""

import pytest

from tpu_demo.core import links
from tpu_demo.core.request import RequestError, RequestLimits, validate_request

from conftest import request_fields


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
    for change, message in cases.items():
        name = change.split("=")[0]
        tampered = "&".join(change if part.startswith(name + "=") else part for part in query.split("&"))
        with pytest.raises(RequestError) as error:
            links.request_from_link(tampered)
        assert str(error.value).startswith(message), (change, str(error.value))
    with pytest.raises(RequestError, match="^seed: is missing from the link"):
        links.request_from_link(query.replace("&seed=4294967295", ""))
    with pytest.raises(RequestError, match="^seed: is given more than once"):
        links.request_from_link(query + "&seed=1")
    with pytest.raises(RequestError, match="^model: "):
        links.request_from_link(query, RequestLimits(offered_models=("tiny-sd3",)))
