"""The link that reproduces an image: its settings as query parameters of the page's own URL.

Opening a link only fills the controls: it never runs or queues anything. Every parameter passes the
API's validation, and an error names the link's parameter. A link without ``upsample=1`` draws the prompt
as typed. The same link on the same server and weights gives the same pixels.
"""

from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import parse_qs, urlencode

from tpu_demo.core.request import GenerationRequest, RequestError, RequestLimits, validate_request
from tpu_demo.core.styles import NO_STYLE

#: link parameter -> request field, in the link's order
LINK_FIELDS = {"prompt": "prompt", "model": "model", "mode": "mode", "resolution": "resolution",
               "steps": "num_inference_steps", "guidance": "guidance_scale", "upsample": "upsample_prompt",
               "seed": "seed", "negative_prompt": "negative_prompt", "style": "style", "style_scale": "style_scale"}
#: parameters a link must carry (a negative prompt and a style may be left out)
REQUIRED = ("prompt", "model", "mode", "resolution", "steps", "guidance", "seed")
#: longer query strings are refused unread (a prompt is at most a few thousand characters)
MAX_QUERY_CHARS = 16384

_LINK_NAME = {field: name for name, field in LINK_FIELDS.items()}
_LINK_BOOLEANS = {"1": True, "true": True, "0": False, "false": False}


def link_query(settings: Mapping[str, Any]) -> str:
    """The query string (without ``?``) for a request's or a PNG's settings (request field names)."""
    styled = settings.get("style") not in (None, "", NO_STYLE)
    pairs = [(name, settings[field]) for name, field in LINK_FIELDS.items()
             if field in settings and not (field in ("negative_prompt", "upsample_prompt") and not settings[field])
             and (styled or field not in ("style", "style_scale"))]
    return urlencode([(name, str(int(value)) if isinstance(value, bool) else str(value)) for name, value in pairs])


def is_link(query: str) -> bool:
    """Whether a page URL's query string carries any link parameter (else the page opens as usual)."""
    try:
        names = parse_qs(query.lstrip("?")[:MAX_QUERY_CHARS], keep_blank_values=True)
    except ValueError:
        return True
    return any(name in LINK_FIELDS for name in names)


def request_from_link(query: str, limits: RequestLimits = RequestLimits()) -> GenerationRequest:
    """The one-image request a link describes, validated like the API's; RequestError names the link's parameter."""
    query = query.lstrip("?")
    if len(query) > MAX_QUERY_CHARS:
        raise RequestError("link", f"is {len(query)} characters long; the limit is {MAX_QUERY_CHARS}")
    try:
        values = parse_qs(query, keep_blank_values=True, strict_parsing=False, max_num_fields=64)
    except ValueError as error:
        raise RequestError("link", f"cannot be read ({error})") from None
    for name in LINK_FIELDS:
        if len(values.get(name, [])) > 1:
            raise RequestError(name, "is given more than once")
    missing = [name for name in REQUIRED if name not in values]
    if missing:
        raise RequestError(missing[0], "is missing from the link")
    raw: dict[str, Any] = {field: values[name][0] for name, field in LINK_FIELDS.items() if name in values}
    # a query string is text: "1" / "0" (also "true" / "false") for upsample, anything else refused by the check
    upsample = raw.get("upsample_prompt", "0")
    raw["upsample_prompt"] = _LINK_BOOLEANS.get(upsample.strip().lower(), upsample)
    try:
        return validate_request({**raw, "num_images": 1, "previews": True}, limits)
    except RequestError as error:
        name = _LINK_NAME.get(error.field, error.field)
        raise RequestError(name, str(error).split(": ", 1)[-1]) from None
