"""Reuse settings: fill the page's controls from a PNG this app made (gallery selection or a dropped file).

The settings are checked as a generation would check them, so a PNG edited by hand cannot put
values in the controls that Generate would refuse. The PNG is read bounded and never decoded
(``core.pngmeta``). The handlers get what they use from the page's handlers (the limits, the
model check and the control updates), not the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import gradio as gr

from tpu_demo.core import pngmeta
from tpu_demo.core.catalog import ModelSpec
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.request import RequestError, RequestLimits, validate_request
from tpu_demo.web.outputs import user_error

#: the controls a restore fills: prompt, model, mode, resolution, steps, guidance, seed, randomize,
#: header, details, upsample prompt, negative prompt, style, style strength
RESTORED_OUTPUTS = 14


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


class SettingsRestore:
    """The "Reuse settings" button, the gallery selection it reads, and a PNG dropped on the page."""

    def __init__(self, limits: RequestLimits, start_model: str,
                 checked: Callable[[Any, Any], tuple[ModelSpec, ExecutionMode]],
                 model_controls: Callable[..., tuple],
                 style_controls: Callable[[ModelSpec, str, float], tuple] = lambda spec, style, scale: ()):
        self.limits, self.start_model = limits, start_model
        #: model and mode checked like a generation's (the engine's spec of the model)
        self.checked = checked
        #: updates for (resolution, steps, guidance, header, details, upsample prompt) showing a model's limits
        self.model_controls = model_controls
        #: updates for (style, style strength) showing a model's styles (web/styles.py)
        self.style_controls = style_controls

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
        spec, _ = self.checked(checked.model, checked.mode.value)
        restored = self.model_controls(spec, checked.resolution, checked.num_inference_steps,
                                       checked.guidance_scale, checked.mode.value, checked.upsample_prompt)
        gr.Info("Settings restored from the image.")
        negative = gr.update(value=checked.negative_prompt, visible=spec.negative_prompt)
        return (checked.prompt, checked.model, checked.mode.value, *restored[:3], checked.seed, False,
                *restored[3:], negative, *self.style_controls(spec, checked.style or "None", checked.style_scale))

    def restore_from_gallery(self, gallery: Any, selected: Any, mode: Any):
        """The image selected in the gallery (``remember_selection``), restored as a dropped one would be."""
        if not isinstance(gallery, list) or not isinstance(selected, int) or not 0 <= selected < len(gallery):
            gr.Warning("Select an image in the gallery first.")
            return (gr.skip(),) * RESTORED_OUTPUTS
        item = gallery[selected]
        path = item[0] if isinstance(item, (list, tuple)) and item else item
        return self.restore_settings(path, mode)

    @staticmethod
    def remember_selection(event: gr.SelectData) -> int:
        return event.index
