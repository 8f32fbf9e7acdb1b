"""The page's side of the reproduce link (core/links.py): "Copy link" under the gallery, and a page
opened from a link, its controls filled and a "Generate this" button shown (it never runs by itself).

The link is built from the selected image's PNG settings and completed in the browser with the page's
own address; opening one checks every parameter as the API would and leaves the device alone.
"""

from __future__ import annotations

import html
from typing import Any, Callable

import gradio as gr

from tpu_demo.core import links
from tpu_demo.core.catalog import ModelSpec
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.pngmeta import PngRejected
from tpu_demo.core.request import RequestError, RequestLimits
from tpu_demo.core.styles import NO_STYLE
from tpu_demo.web.restore import read_png_settings

#: the browser turns the handler's query string into the full link and copies it (page.py)
COPY_JS = """(query) => {
  if (!query) return "";
  const url = query.startsWith("http") ? query : window.location.origin + window.location.pathname + "?" + query;
  if (navigator.clipboard) navigator.clipboard.writeText(url).catch(() => {});
  return url;
}"""
#: what the page passes to ``open_link`` at load: its own query string
QUERY_JS = "() => window.location.search"

#: the controls ``open_link`` fills: prompt, model, mode, resolution, steps, guidance, seed, randomize,
#: header, details, upsample prompt, negative prompt, number of images, style, style strength, the link
#: note, the Generate this button
LINK_OUTPUTS = 17


class ShareLinks:
    """Copy link (from the gallery's selected image) and the page opened from a link."""

    def __init__(self, limits: RequestLimits, checked: Callable[[Any, Any], tuple[ModelSpec, ExecutionMode]],
                 model_controls: Callable[..., tuple],
                 style_controls: Callable[[ModelSpec, str, float], tuple],
                 style_refusal: Callable[[str], str | None] = lambda model_id: None):
        self.limits = limits
        #: model and mode checked like a generation's (the engine's spec of the model)
        self.checked = checked
        #: updates for (resolution, steps, guidance, header, details, upsample prompt) showing a model's limits
        self.model_controls = model_controls
        #: updates for (style, style strength) showing a model's styles, one selected (web/styles.py)
        self.style_controls = style_controls
        #: why a model's placement takes no style here (None when it does): a styled link to it is refused
        self.style_refusal = style_refusal

    def link_query(self, gallery: Any, selected: Any) -> Any:
        """The selected image's settings as a link's query string, shown (the browser then completes it
        into the link and copies it); nothing, with a warning, when there is none."""
        if not isinstance(gallery, list) or not gallery:
            gr.Warning("Generate an image first, then copy its link.")
            return gr.skip()
        index = selected if isinstance(selected, int) and 0 <= selected < len(gallery) else len(gallery) - 1
        item = gallery[index]
        path = item[0] if isinstance(item, (list, tuple)) and item else item
        try:
            settings = read_png_settings(path if isinstance(path, str) else None)
        except PngRejected:
            settings = None
        if not settings:
            gr.Warning("This image carries no settings from this app.")
            return gr.skip()
        gr.Info(f"Link to image {index + 1} copied: it opens this page with its settings.")
        return gr.update(value=links.link_query(settings), visible=True)

    def open_link(self, query: Any):
        """Fill the controls from the page's link; show "Generate this" (nothing runs until it is clicked)."""
        query = query if isinstance(query, str) else ""
        if not links.is_link(query):
            return (gr.skip(),) * LINK_OUTPUTS
        try:
            request = links.request_from_link(query, self.limits)
            spec, mode = self.checked(request.model, request.mode.value)
            if request.style and (refusal := self.style_refusal(spec.id)):
                raise RequestError("style", refusal)
        except RequestError as error:
            note = (f"<p class='link-note link-error' role='alert'>This link cannot be used: "
                    f"<strong>{html.escape(str(error))}</strong>. Nothing was run.</p>")
            return (*(gr.skip(),) * (LINK_OUTPUTS - 2), gr.update(value=note, visible=True), gr.update(visible=False))
        except gr.Error as error:  # the model or mode check of the page (same wording as the API's)
            note = f"<p class='link-note link-error' role='alert'>This link cannot be used: {html.escape(str(error))}.</p>"
            return (*(gr.skip(),) * (LINK_OUTPUTS - 2), gr.update(value=note, visible=True), gr.update(visible=False))
        controls = self.model_controls(spec, request.resolution, request.num_inference_steps,
                                       request.guidance_scale, mode.value, request.upsample_prompt)
        note = ("<p class='link-note' role='status'>Settings from a shared link: "
                "<strong>Generate this</strong> makes the same image (nothing has run yet).</p>")
        return (request.prompt, request.model, mode.value, *controls[:3], request.seed, False, *controls[3:],
                gr.update(value=request.negative_prompt, visible=spec.negative_prompt), 1,
                *self.style_controls(spec, request.style or NO_STYLE, request.style_scale),
                gr.update(value=note, visible=True), gr.update(visible=True))
