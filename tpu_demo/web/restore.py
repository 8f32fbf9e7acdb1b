"""Fill the page's controls from settings this app wrote: a PNG (the gallery's selected image or a dropped
file) or a reproduce link the page was opened with (``core/links.py``); and "Copy link" of an image.

Settings are checked as a generation would check them, so an edited PNG or link cannot put values in the
controls that Generate would refuse, and nothing runs until the visitor clicks. The PNG is read bounded
and never decoded (``core.pngmeta``).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Callable

import gradio as gr

from tpu_demo.core import links, pngmeta
from tpu_demo.core.catalog import ModelSpec
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.request import GenerationRequest, RequestError, RequestLimits, validate_request
from tpu_demo.core.styles import NO_STYLE
from tpu_demo.web.outputs import user_error

#: the controls a restore fills: prompt, model, mode, resolution, steps, guidance, seed, randomize,
#: header, details, upsample prompt, negative prompt, style, style strength
RESTORED_OUTPUTS = 14
#: a link fills those, then the number of images, the link note and the "Generate this" button
LINK_OUTPUTS = RESTORED_OUTPUTS + 3
#: the browser turns ``link_query``'s query string into the full link and copies it (page.py)
COPY_JS = """(query) => {
  if (!query) return "";
  const url = query.startsWith("http") ? query : window.location.origin + window.location.pathname + "?" + query;
  if (navigator.clipboard) navigator.clipboard.writeText(url).catch(() => {});
  return url;
}"""
#: what the page passes to ``open_link`` at load: its own query string
QUERY_JS = "() => window.location.search"


def read_png_settings(path: str | Path | None) -> dict | None:
    """Settings from a PNG file that Gradio handed us (its own cache), or None; bounded, never decoded.

    Raises pngmeta.PngRejected (the reason, for the user) for a file past the size limits.
    """
    if not path:
        return None
    try:
        return pngmeta.read_settings_file(str(path))
    except OSError:
        return None


def _path_of(item: Any) -> Any:
    """The file of a gallery item as the page sends it: (path, caption) or the path."""
    return item[0] if isinstance(item, (list, tuple)) and item else item


class SettingsRestore:
    """"Reuse settings" (the gallery selection it reads), a PNG dropped on the page, a page opened from a
    link, and "Copy link"."""

    def __init__(self, limits: RequestLimits, start_model: str,
                 checked: Callable[[Any, Any], tuple[ModelSpec, ExecutionMode]],
                 model_controls: Callable[..., tuple],
                 style_controls: Callable[[ModelSpec, str, float], tuple] = lambda spec, style, scale: (),
                 style_refusal: Callable[[str], str | None] = lambda model_id: None):
        self.limits, self.start_model = limits, start_model
        #: model and mode checked like a generation's (the engine's spec of the model)
        self.checked = checked
        #: updates for (resolution, steps, guidance, header, details, upsample prompt) showing a model's limits
        self.model_controls = model_controls
        #: updates for (style, style strength) showing a model's styles (web/styles.py)
        self.style_controls = style_controls
        #: why a model's placement takes no style here (None when it does): a styled link to it is refused
        self.style_refusal = style_refusal

    def _controls(self, request: GenerationRequest) -> tuple:
        """The ``RESTORED_OUTPUTS`` updates showing a checked request (the seed fixed: randomize off)."""
        spec, mode = self.checked(request.model, request.mode.value)
        shown = self.model_controls(spec, request.resolution, request.num_inference_steps, request.guidance_scale,
                                    mode.value, request.upsample_prompt)
        return (request.prompt, request.model, mode.value, *shown[:3], request.seed, False, *shown[3:],
                gr.update(value=request.negative_prompt, visible=spec.negative_prompt),
                *self.style_controls(spec, request.style or NO_STYLE, request.style_scale))

    def restore_settings(self, image_path: Any, mode: Any):
        """Fill the controls from a PNG this app made; a warning and no change for any other image."""
        _, mode = self.checked(self.start_model, mode)
        try:
            settings = read_png_settings(image_path if isinstance(image_path, str) else None)
        except pngmeta.PngRejected as error:
            raise user_error(f"image: {error}", "Invalid input") from None
        if settings is None:
            gr.Warning("This image carries no settings from this app.")
            return (gr.skip(),) * RESTORED_OUTPUTS
        try:
            checked = validate_request({"mode": mode.value, **settings}, self.limits)
        except RequestError as error:
            gr.Warning(f"The image's settings are not served here ({error}).")
            return (gr.skip(),) * RESTORED_OUTPUTS
        restored = self._controls(checked)
        gr.Info("Settings restored from the image.")
        return restored

    def restore_from_gallery(self, gallery: Any, selected: Any, mode: Any):
        """The image selected in the gallery (``remember_selection``), restored as a dropped one would be."""
        if not isinstance(gallery, list) or not isinstance(selected, int) or not 0 <= selected < len(gallery):
            gr.Warning("Select an image in the gallery first.")
            return (gr.skip(),) * RESTORED_OUTPUTS
        return self.restore_settings(_path_of(gallery[selected]), mode)

    @staticmethod
    def remember_selection(event: gr.SelectData) -> int:
        return event.index

    def link_query(self, gallery: Any, selected: Any) -> Any:
        """The selected image's settings as a link's query string, shown (the browser then completes it
        into the link and copies it); nothing, with a warning, when there is none."""
        if not isinstance(gallery, list) or not gallery:
            gr.Warning("Generate an image first, then copy its link.")
            return gr.skip()
        index = selected if isinstance(selected, int) and 0 <= selected < len(gallery) else len(gallery) - 1
        path = _path_of(gallery[index])
        try:
            settings = read_png_settings(path if isinstance(path, str) else None)
        except pngmeta.PngRejected:
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
            spec, _ = self.checked(request.model, request.mode.value)
            if request.style and (refusal := self.style_refusal(spec.id)):
                raise RequestError("style", refusal)
        except (RequestError, gr.Error) as error:  # gr.Error: the page's model or mode check (the API's wording)
            why = (f"<strong>{html.escape(str(error))}</strong>. Nothing was run." if isinstance(error, RequestError)
                   else f"{html.escape(str(error))}.")
            note = f"<p class='link-note link-error' role='alert'>This link cannot be used: {why}</p>"
            return (*(gr.skip(),) * (LINK_OUTPUTS - 2), gr.update(value=note, visible=True), gr.update(visible=False))
        note = ("<p class='link-note' role='status'>Settings from a shared link: "
                "<strong>Generate this</strong> makes the same image (nothing has run yet).</p>")
        return (*self._controls(request), 1, gr.update(value=note, visible=True), gr.update(visible=True))
