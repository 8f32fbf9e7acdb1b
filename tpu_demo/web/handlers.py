"""The page's event handlers: controls -> engine -> a gallery that fills image by image.

This layer knows nothing of torch. It validates raw inputs with ``validate_request`` (the same
check every API caller gets), hands the request to the engine, and turns engine events into
gallery updates, progress and messages. Restoring settings from a PNG: ``web/restore.py``.
"""

from __future__ import annotations

import html
import random
from dataclasses import dataclass
from typing import Any, Iterator

import gradio as gr

from tpu_demo.core.catalog import ModelSpec
from tpu_demo.core.engine_api import EngineAPI
from tpu_demo.core.events import BucketState, Compiling, ImageResult, Loading, StepProgress, Stopped
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.request import MAX_SEED, RequestError, RequestLimits, check_mode, check_model, validate_request
from tpu_demo.core.vocabulary import load_vocabulary, vocabulary_note
from tpu_demo.web.admission import WarmupThrottle
from tpu_demo.web.callers import stop_key
from tpu_demo.web.outputs import NO_PREVIEW, RequestFiles, gallery_data, preview_html, user_error
from tpu_demo.web.restore import SettingsRestore
from tpu_demo.web.runs import Runs
from tpu_demo.web.styles import caption_part, style_updates


#: the page's random seeds
_SEEDS = random.SystemRandom()


@dataclass(frozen=True)
class UiSettings:
    start_model: str
    start_mode: ExecutionMode
    limits: RequestLimits
    status_refresh_seconds: float = 1.0
    #: generate handlers running at once (Gradio's concurrency limit of the event); the engine's
    #: device thread is what runs one pipeline call at a time
    generate_concurrency: int = 1

    @property
    def start_images(self) -> int:
        """How many images a generation makes unless the caller says (the page's slider starts there)."""
        return min(2, self.limits.max_images)


def step_progress(steps_done: dict[int, int], event: StepProgress, images: int) -> tuple[tuple[int, int], str]:
    """(steps done, steps in all) of the request and "images 1-4/4 · step 3/8 · ETA 1.2 s image, 5.0 s request",
    counting every image's own steps (``steps_done``, by image, updated with ``event``): the images of one batched
    call step together and report one by one, the same step each."""
    steps_done[event.index] = event.step
    denoising = sorted(index for index, step in steps_done.items() if step < event.total) or [event.index]
    shown = f"image {denoising[0] + 1}" if len(denoising) == 1 else f"images {denoising[0] + 1}-{denoising[-1] + 1}"
    per_step = event.elapsed_seconds / max(event.step, 1)
    image_left = per_step * (event.total - event.step)
    calls_after = -(-(images - len(steps_done)) // len(denoising))  # the images not begun, as many a call
    request_left = image_left + per_step * event.total * calls_after
    return ((sum(steps_done.values()), images * event.total),
            f"{shown}/{images} \u00b7 step {event.step}/{event.total} \u00b7 "
            f"ETA {image_left:.1f} s image, {request_left:.1f} s request")


def _caption(result: ImageResult) -> str:
    t = result.timings
    warmth = "warm" if result.warm else "compiled first"
    return (f"seed {result.seed} \u00b7 denoise {t['denoise_seconds']:.2f}s \u00b7 {t['steps_per_second']:.1f} steps/s"
            f" \u00b7 decode {t['decode_seconds']:.2f}s \u00b7 {warmth}{caption_part(result.parameters)}"
            f"{drawn_caption(result.parameters)}")


def drawn_caption(parameters: dict[str, Any]) -> str:
    """"\ndrawn as: a [large] red circle ..." when the upsampler rewrote the prompt ([...]: the seed chose it)."""
    marked = parameters.get("drawn_marked")
    if not marked:
        return ""
    chosen = " ([...]: chosen by the seed)" if parameters.get("seed_chose") else ""
    # a text encoder's upsampler may write any bytes (tiny-flux2's random one does): no control characters
    marked = "".join(char if char.isprintable() else "\ufffd" for char in marked)
    return f"\ndrawn as: {marked}{chosen}"


def upsample_update(spec: ModelSpec, value: bool | None = None) -> Any:
    """The "Upsample prompt" checkbox for ``spec``: shown only when it declares an upsampler."""
    upsampler = spec.prompt_upsampler
    if upsampler is None:
        return gr.update(visible=False, value=False)
    return gr.update(visible=True, value=upsampler.default_on if value is None else value, info=upsampler.cost_note)


class PageHandlers:
    """The handlers of one page around one engine; their runs live in ``runs`` (web/runs.py)."""

    def __init__(self, engine: EngineAPI, settings: UiSettings, runs: Runs | None = None):
        self.engine = engine
        self.settings = settings
        self.runs = runs or Runs()
        self.warmup_throttle = WarmupThrottle()
        #: "Reuse settings", a dropped PNG, a page opened from a link and "Copy link" (web/restore.py)
        self.restore = SettingsRestore(settings.limits, settings.start_model, self._checked, self._model_controls,
                                       lambda spec, style, scale: style_updates(engine, spec, style, scale),
                                       engine.style_refusal)

    # ---- handlers -------------------------------------------------------------------------
    def generate(self, request: gr.Request = None, progress: gr.Progress = gr.Progress(),
                 **inputs: Any) -> Iterator[tuple[list, str]]:
        """Stream (gallery, live preview) for the named inputs ``GENERATE_INPUTS``: an update per finished image
        (it clears the preview) and per preview (the same gallery: Gradio's diff sends nothing for it), as
        Gradio sends them (the event has ``postprocess=False``)."""
        generation = self.runs.checked(request, lambda: validate_request(inputs, self.settings.limits))
        files = RequestFiles()
        events = self.runs.supervise(request, generation, self.engine.generate, "Generation failed", files)
        gallery: list[tuple[str, str]] = []
        total = generation.num_images
        steps_done: dict[int, int] = {}  # by image
        progress(0, desc=f"waiting for the device \u00b7 {generation.resolution}")
        try:
            for event in events:
                if isinstance(event, Loading):
                    progress(0, desc=event.text)
                elif isinstance(event, Compiling):
                    progress(0, desc=f"compiling bucket {event.resolution} for {event.mode} "
                                     "(first time, may take minutes on TPU)")
                elif isinstance(event, StepProgress):
                    done, text = step_progress(steps_done, event, total)
                    progress(done, desc=text, unit="steps")
                    if event.preview is not None:
                        caption = f"preview \u00b7 image {event.index + 1} \u00b7 step {event.preview.step}/{event.total}"
                        yield gallery_data(gallery), preview_html(event.preview.render(), caption)
                elif isinstance(event, ImageResult):
                    gallery.append((files.save(event.image, f"seed{event.seed}"), _caption(event)))
                    yield gallery_data(gallery), NO_PREVIEW
                elif isinstance(event, Stopped):
                    # never a success with a short gallery: the images streamed so far stay on the page,
                    # and the run's next step raises the error saying how many were finished
                    yield gallery_data(gallery), NO_PREVIEW
        finally:
            files.remove()

    def stop(self, request: gr.Request = None) -> None:
        """Stop this session's oldest run at its next denoising step (only the caller holding the
        session's owner secret reaches it)."""
        self.runs.stop_owner(stop_key(getattr(request, "session_hash", None), getattr(request, "headers", None)))

    def switch_model(self, model_id: Any, mode: Any, request: gr.Request = None):
        """A user picked another model: its defaults, and warm it in the background (see _warm)."""
        spec, mode = self._checked(model_id, mode)
        self._warm(spec.id, mode, request)
        return self._model_controls(spec, str(spec.buckets[0]), spec.default_steps, spec.default_guidance, mode.value)

    def _checked(self, model_id: Any, mode: Any) -> tuple[ModelSpec, ExecutionMode]:
        """Model and mode from any handler's input, checked like a generation's."""
        try:
            spec = check_model(model_id, self.settings.limits)
            return self.engine.spec(spec.id), check_mode(mode, self.settings.limits)
        except RequestError as error:
            raise user_error(str(error), "Invalid input") from None

    def _warm(self, model_id: str, mode: ExecutionMode, request: gr.Request | None) -> None:
        """What a visitor may trigger without a generation: one background warmup per address
        every ``WarmupThrottle.interval`` seconds, coalesced per (model, mode) by the engine, and
        never one that frees a loaded model (the first generation for a model that does not fit
        loads it, under the generation limits)."""
        if self.warmup_throttle.allow(getattr(getattr(request, "client", None), "host", None)):
            self.engine.warmup_in_background(model_id, mode, may_evict=False)

    def _model_controls(self, spec: ModelSpec, resolution: str, steps: int, guidance: float, mode: str,
                        upsample: bool | None = None):
        """Updates for (resolution, steps, guidance, header, details, upsample prompt) showing ``spec``'s
        limits; the upsample checkbox shows only for a model with an upsampler (``None``: its default)."""
        low, high = spec.guidance_range or (spec.default_guidance, spec.default_guidance + 1)
        return (
            gr.update(choices=self.resolution_choices(spec), value=resolution),
            gr.update(minimum=spec.min_steps, maximum=spec.max_steps, value=steps),
            gr.update(minimum=low, maximum=high, value=guidance, interactive=not spec.guidance_fixed,
                      info="fixed by this model" if spec.guidance_fixed else "classifier-free guidance"),
            self.header_html(spec.id),
            self.details_markdown(spec.id, mode),
            upsample_update(spec, upsample),
        )

    def switch_mode(self, model_id: Any, mode: Any, request: gr.Request = None):
        spec, mode = self._checked(model_id, mode)
        self._warm(spec.id, mode, request)
        return self.details_markdown(spec.id, mode.value)

    def bucket_table(self, model_id: Any, mode: Any) -> str:
        """Markdown table of the model's buckets in ``mode``: cold / compiling / warm / failed."""
        spec, mode = self._checked(model_id, mode)
        model_id = spec.id
        status = self.engine.status()
        rows = self.engine.buckets_for(model_id, mode)
        icons = {BucketState.COLD: "\u25cb cold", BucketState.COMPILING: "\u25d4 compiling",
                 BucketState.WARM: "\u25cf warm", BucketState.FAILED: "\u2716 failed"}
        tones = {BucketState.COLD: "none", BucketState.COMPILING: "wait", BucketState.WARM: "ok", BucketState.FAILED: "bad"}
        icons = {state: f"<span class='bucket-state tone-{tones[state]}'>{text}</span>" for state, text in icons.items()}
        # "batch": the transformer's batch, images per call (--max-batch) times 2 where SD3-style CFG
        # doubles it; one static shape, one graph. FluxPipeline's true CFG does not double it.
        lines = ["| bucket | mode | batch | state | compile s | graphs | from cache |", "|---|---|---|---|---|---|---|"]
        cached = {True: "yes", False: "no", None: "\u2013"}
        for b in rows:
            seconds = f"{b.compile_seconds:.2f}" if b.compile_seconds is not None else "\u2013"
            state = icons[b.state] + (f": {html.escape(b.error)}" if b.error else "")
            lines.append(f"| {b.resolution} | {b.mode} | {b.batch} | {state} | {seconds} | {b.compiles} | {cached[b.from_cache]} |")
        if status.loading:  # a model switch (or --warm all) is reading weights now
            lines.insert(0, f"**{html.escape(status.loading)}**\n")
        busy = "busy" if status.busy else "idle"
        cfg = " (\u00d72 with classifier-free guidance)" if spec.cfg_doubles_batch else ""
        lines.append(f"\nbatch = images per call{cfg}, up to {self.engine.batch_sizes_for(model_id)[-1]} images \u00b7 {status.device} "
                     f"\u00b7 device {busy} \u00b7 {status.compiles_total} graphs compiled in total")
        return "\n".join(lines)

    @staticmethod
    def pick_seed(seed: Any, randomize: Any) -> Any:
        """A random seed, else ``seed`` as given (Generate checks it and names the field). The random one comes
        from the OS, not Python's shared ``random`` state, which torch.compile saves and restores around each
        compile on another thread (visitors would draw the same seed again)."""
        return _SEEDS.randint(0, MAX_SEED) if randomize is True else seed

    # ---- helpers --------------------------------------------------------------------------
    @staticmethod
    def resolution_choices(spec: ModelSpec) -> list[tuple[str, str]]:
        return [(bucket.label, str(bucket)) for bucket in spec.buckets]

    def header_html(self, model_id: str) -> str:
        """Title plus chips for the device, the model and its placement (styled in assets/style.css)."""
        spec = self.engine.spec(model_id)
        device = self.engine.device
        placement = self.engine.placement_description(model_id)

        def chip(kind: str, label: str, value: str, title: str = "") -> str:
            return (f"<span class='chip chip-{kind}' title='{html.escape(title or value)}'>"
                    f"<span class='chip-label'>{label}</span>{html.escape(value)}</span>")

        return ("<div class='demo-header'><div class='demo-title'><h1>TPU Diffusion Demo</h1>"
                "<p>diffusers text-to-image \u00b7 one warm graph per resolution bucket</p></div>"
                f"<div class='demo-chips'>{chip(f'device device-{device.kind}', 'device', device.badge)}"
                f"{chip('model', 'model', spec.title, spec.id)}"
                f"{chip('placement', 'placement', placement.split(':')[0], placement)}</div></div>")

    def vocabulary_line(self, prompt: Any, model_id: Any, upsample: Any = False) -> Any:
        """The line under the prompt naming the words the model cannot read (hidden when none, or
        when the model declares no vocabulary); the generation itself is never refused for it. With
        the prompt upsampler on, the words are those its language reads (it passes the rest over)."""
        try:
            spec = self.engine.spec(check_model(model_id, self.settings.limits).id)
        except RequestError:
            return gr.update(value="", visible=False)
        text = prompt if isinstance(prompt, str) else ""
        path = spec.language_path if upsample is True and spec.language_path else spec.vocabulary_path
        note = vocabulary_note(load_vocabulary(path) if path else None,
                               spec.short_title or spec.title, text[: self.settings.limits.max_prompt_chars])
        return gr.update(value=html.escape(note), visible=bool(note))

    def details_markdown(self, model_id: str, mode: str) -> str:
        placement = self.engine.placement_description(model_id)
        ran = self.engine.mode_description(ExecutionMode(mode))
        return f"**Mode:** {ran}  \n**Placement:** {placement}"
