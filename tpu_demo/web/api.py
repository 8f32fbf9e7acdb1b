"""The endpoints programs call, each a ``gr.api`` function: ``/generate`` and ``/compare_modes`` (what
the page's buttons run, streamed the same way) and the MCP tools (Gradio's MCP server lists each public
``gr.api`` endpoint it is not told to hide): generate images, compare modes, list models.

Every setting an endpoint takes defaults to None ("the chosen model's default"), so a caller who names a
model and leaves its settings out runs at that model's defaults. The device endpoints run through the
page's own handlers (validation naming the field, the run registry, one log line).
"""

# no ``from __future__ import annotations``: gr.api reads list_models's output type from its return annotation
import functools
import inspect
import json
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

import gradio as gr
from gradio import route_utils

from tpu_demo.core import links
from tpu_demo.core.events import BucketState
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.request import (COMPARE_INPUTS, GENERATE_INPUTS, INPUT_TYPES, MODEL_DEFAULTS, RequestError,
                                   check_model, input_docs, named_inputs, validate_request)
from tpu_demo.core.styles import NO_STYLE, STYLE_SCALE_RANGE
from tpu_demo.web.gradio_internals import hide_from_mcp
from tpu_demo.web.outputs import user_error

if TYPE_CHECKING:
    from tpu_demo.web.compare import CompareHandler
    from tpu_demo.web.handlers import PageHandlers

#: the endpoints gradio_client callers use, beside the page's own (private) events of the same handlers
GENERATE_API, COMPARE_API = "generate", "compare_modes"
#: the tools' endpoint names (= tool names); the first two run the device
GENERATE_TOOL, COMPARE_TOOL, MODELS_TOOL = "generate_images", "compare_execution_modes", "list_models"
DEVICE_TOOLS = (GENERATE_TOOL, COMPARE_TOOL)
#: every tool the MCP door answers (the guard refuses a call to any other endpoint)
TOOLS = (*DEVICE_TOOLS, MODELS_TOOL)
#: a tool's input the caller must give
REQUIRED = inspect.Parameter.empty
#: every generation shares this concurrency id (its limit: UiSettings.generate_concurrency)
DEVICE_CONCURRENCY_ID = "device"
#: one comparison at a time (it runs the request in every mode), beside the generate handlers
COMPARE_CONCURRENCY_ID = "compare"


def _root_url(request: Any) -> str:
    """This server as the caller reached it (its Host, or a proxy's X-Forwarded-Host / -Proto); ``request``
    is a ``gr.Request`` or, on Gradio's in-process MCP path, the caller's own Starlette request."""
    inner = getattr(request, "request", None) or request
    if inner is None or not hasattr(inner, "url"):
        return ""
    return route_utils.get_root_url(request=inner, route_path=inner.url.path, root_path=None)


class ToolError(Exception):
    """A tool's refusal or failure, its text the caller's message (``str(gr.Error)`` would quote it)."""


def _plain_errors(tool: Callable[..., str], *args: Any) -> str:
    try:
        return tool(*args)
    except gr.Error as error:
        raise ToolError(error.message) from None


class ApiEndpoints:
    """The endpoints around the page's handlers; ``keeper`` is a page component whose Gradio cache
    keeps the MCP tools' images served (cleaned with the rest of the cache by ``delete_cache``)."""

    def __init__(self, handlers: "PageHandlers", comparer: "CompareHandler", keeper: gr.components.Component):
        self.handlers, self.comparer, self.keeper = handlers, comparer, keeper
        self.engine, self.limits = handlers.engine, handlers.settings.limits

    @functools.cached_property
    def _input_docs(self) -> dict[str, str]:
        settings = self.handlers.settings
        return input_docs([self.engine.spec(m) for m in self.engine.specs], self.limits, self.engine.style_refusal,
                          model=settings.start_model, mode=settings.start_mode.value, num_images=settings.start_images)

    def _doc(self, summary: str, names: tuple[str, ...], returns: str) -> str:
        docs = self._input_docs
        return (summary + "\n\nArgs:\n" + "\n".join(f"    {name}: {docs[name]}" for name in names)
                + f"\n\nReturns:\n    {returns}")

    # ---- the endpoints --------------------------------------------------------------------------
    def add(self) -> None:
        """Add every endpoint to the Blocks being built (``gr.api``), their docstrings written for this server.
        ``/generate`` and ``/compare_modes`` are queued like the page's buttons; the MCP tools are not, so
        Gradio calls them in-process with the caller's own request (the guard admitted them)."""
        settings, device = self.handlers.settings, self.engine.device.badge
        # what a door gives an input left out when the chosen model does not decide it
        fixed = dict(prompt="", model=settings.start_model, mode=settings.start_mode.value, seed=0, negative_prompt="",
                     previews=True, num_images=settings.start_images)
        # a tool's caller names the prompt; its resolution and style are plain text ("" and NO_STYLE: the defaults)
        tool = dict(fixed, prompt=REQUIRED, num_images=1, resolution="", style=NO_STYLE)
        generate = self._endpoint(
            GENERATE_API, lambda named, request: self.handlers.generate(request=request, **named), GENERATE_INPUTS, fixed,
            tuple[list, str], "What the page's Generate runs: images streamed as they finish, with live previews "
            "while denoising.", "gallery: every finished image (a PNG carrying its settings) with its caption; "
            "live preview: the image denoising now, as inline HTML (empty between images).", stream=True)
        compare = self._endpoint(
            COMPARE_API, lambda named, request: self.comparer.compare_modes(request=request, **named), COMPARE_INPUTS, fixed,
            tuple[list, str, dict], "What the page's Compare modes runs: the prompt and seed in every execution "
            "mode, streamed.", "gallery: one image per mode; summary: the figures as HTML; figures: the same as JSON.",
            stream=True)
        generate_images = self._endpoint(
            GENERATE_TOOL, lambda named, request: _plain_errors(self.generate, named, request),
            tuple(name for name in GENERATE_INPUTS if name != "previews"), tool, str,
            f"Generate images from a text prompt with a diffusers pipeline on this server ({device}), one warm "
            "compiled graph per resolution bucket. Each image is a PNG URL carrying its settings, with a link "
            "that reopens the demo page with them.",
            "text: what ran (device, model, mode, bucket warm or compiled, seconds), then per image its seed, "
            "timings, what it was drawn as (when the prompt upsampler rewrote the prompt), PNG URL and reproduce link.")
        compare_execution_modes = self._endpoint(
            COMPARE_TOOL, lambda named, request: _plain_errors(self.compare, named, request),
            tuple(name for name in GENERATE_INPUTS if name in COMPARE_INPUTS), tool, str,
            "Run one prompt and seed in all three execution modes (strict eager, optimized eager, compiled) "
            "and compare them warm against warm: seconds per image, speedup over strict eager and the "
            "largest pixel difference.", "text: one line per mode with its timing and the URL of its image.")

        def list_models() -> str:
            """List the models this server offers: their resolution buckets, step and guidance ranges and defaults,
            their styles (name, trigger words, default strength) and which buckets are warm (compiled) in each mode.

            Returns:
                JSON text: device, modes, limits and one entry per model.
            """
            return self.models_json()

        hide_from_mcp(generate, compare)  # MCP callers have generate_images and compare_execution_modes
        gr.api(generate, api_name=GENERATE_API, concurrency_id=DEVICE_CONCURRENCY_ID,
               concurrency_limit=settings.generate_concurrency)
        gr.api(compare, api_name=COMPARE_API, concurrency_id=COMPARE_CONCURRENCY_ID, concurrency_limit=1)
        for name, function in zip(TOOLS, (generate_images, compare_execution_modes, list_models)):
            gr.api(function, api_name=name, queue=False)

    def _endpoint(self, name: str, call: Callable[[dict[str, Any], Any], Any], inputs: tuple[str, ...],
                  defaults: dict[str, Any], returns: Any, summary: str, returned: str, stream: bool = False) -> Callable:
        """The function ``gr.api`` reads as endpoint ``name``: ``inputs`` by name (typed by ``INPUT_TYPES``, each
        defaulting to ``defaults`` or else None: the model decides) and the ``gr.Request``; ``call`` gets the
        inputs the caller gave, and the request."""
        def parameter(input_name: str, default: Any) -> inspect.Parameter:
            hint = INPUT_TYPES[input_name] if default is not None else INPUT_TYPES[input_name] | None
            return inspect.Parameter(input_name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=hint)

        request = inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=gr.Request)
        signature = inspect.Signature([*(parameter(name, defaults.get(name)) for name in inputs), request],
                                      return_annotation=returns)

        def arguments(args: tuple, kwargs: dict[str, Any]) -> tuple[dict[str, Any], Any]:
            bound = signature.bind(*args, **kwargs)  # Gradio passes them by position, the request last
            bound.apply_defaults()
            named = dict(bound.arguments)
            request = named.pop("request")
            return self._named(named), request

        if stream:
            def endpoint(*args: Any, **kwargs: Any) -> Iterator:
                yield from call(*arguments(args, kwargs))
        else:
            def endpoint(*args: Any, **kwargs: Any) -> Any:
                return call(*arguments(args, kwargs))
        endpoint.__name__ = endpoint.__qualname__ = name
        endpoint.__signature__ = signature  # type: ignore[attr-defined]
        endpoint.__annotations__ = {**{p.name: p.annotation for p in signature.parameters.values()}, "return": returns}
        endpoint.__doc__ = self._doc(summary, inputs, returned)
        return endpoint

    def _named(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """An endpoint's arguments as the page's named inputs: what the caller left out (None where the model
        decides) is dropped, so ``validate_request`` fills the chosen model's defaults; a resolution left out
        (empty or None), which the request check refuses, is the chosen model's first bucket."""
        named = named_inputs({name: value for name, value in inputs.items() if not (name == "resolution" and value == "")},
                             MODEL_DEFAULTS)
        if "resolution" not in named:
            try:
                named["resolution"] = str(check_model(named.get("model"), self.limits).buckets[0])
            except RequestError:
                pass  # validate_request names the bad model
        return named

    def _keep(self, path: str) -> str:
        return str(self.keeper.move_resource_to_block_cache(path))

    def _warmth(self, model: str, mode: str, resolution: str) -> str:
        rows = [b for b in self.engine.buckets_for(model, ExecutionMode(mode)) if b.resolution == resolution]
        return "warm" if any(b.state is BucketState.WARM for b in rows) else "cold (compiled for this request)"

    def generate(self, named: dict[str, Any], request: gr.Request | None) -> str:
        try:  # checked here first only to say how warm the bucket was before the run; generate checks again
            checked = validate_request(named, self.limits)
            warmth = self._warmth(checked.model, checked.mode.value, checked.resolution)
        except RequestError:
            checked, warmth = None, ""
        started = time.perf_counter()
        gallery: list[dict] = []
        kept: dict[str, str] = {}
        for gallery, _ in self.handlers.generate(request=request, **dict(named, previews=False)):
            for item in gallery:  # into Gradio's cache before the handler's own files go
                path = item["image"]["path"]
                kept.setdefault(path, self._keep(path))
        seconds = time.perf_counter() - started
        if checked is None:  # generate validated the same fields and finished: cannot happen
            raise user_error("the request could not be described", "Generation failed")
        root = _root_url(request)
        styled = f" with style {checked.style} {checked.style_scale:g}" if checked.style else ""
        lines = [f"Ran {len(gallery)} image(s) of {checked.model}{styled} at {checked.resolution} on {self.engine.device.badge}, "
                 f"mode {self.engine.mode_description(checked.mode)}; bucket {warmth} before the request; "
                 f"{seconds:.2f} s in all."]
        for index, item in enumerate(gallery):
            settings = dict(checked.as_dict(), resolution=checked.resolution, seed=checked.seed + index)
            lines.append(f"image {index + 1}: {item['caption']}\n  png: {root}/gradio_api/file={kept[item['image']['path']]}"
                         f"\n  link: {root}/?{links.link_query(settings)}")
        return "\n".join(lines)

    def compare(self, named: dict[str, Any], request: gr.Request | None) -> str:
        *_, (gallery, _, figures) = self.comparer.compare_modes(request=request, **named)  # the last update
        root = _root_url(request)
        lines = [f"Compared on {self.engine.device.badge}, warm against warm, fastest of {figures['timed_rounds']} "
                 f"timed rounds per mode:"]
        for item, run in zip(gallery, figures["modes"]):
            bucket = "warm" if run["warm_before"] else f"cold, warmed first in {run['warmup_seconds'] or 0:.2f} s"
            lines.append(f"{run['mode']} ({run['description']}): {run['denoise_seconds']:.3f} s, "
                         f"{run['steps_per_second']:.1f} steps/s, {run['speedup_vs_strict_eager']:.2f}x strict eager, "
                         f"max pixel diff {run['max_pixel_difference']}, bucket {bucket}\n"
                         f"  png: {root}/gradio_api/file={self._keep(item['image']['path'])}")
        for group in figures["same_code"]:
            lines.append(f"Same code on this device: {' and '.join(group)} (their difference is noise).")
        return "\n".join(lines)

    def models_json(self) -> str:
        modes = self.limits.offered_modes
        models = []
        for model_id in self.engine.specs:
            spec = self.engine.spec(model_id)
            refusal = self.engine.style_refusal(model_id) if spec.styles else None
            warm = {mode.value: sorted({b.resolution for b in self.engine.buckets_for(model_id, mode)
                                        if b.state is BucketState.WARM}) for mode in modes}
            models.append({
                "id": spec.id, "title": spec.title, "default": spec.id == self.handlers.settings.start_model,
                "buckets": [str(b) for b in spec.buckets],
                "steps": {"min": spec.min_steps, "max": spec.max_steps, "default": spec.default_steps},
                "guidance": ({"fixed": spec.default_guidance} if spec.guidance_range is None else
                             {"min": spec.guidance_range[0], "max": spec.guidance_range[1],
                              "default": spec.default_guidance}),
                "negative_prompt": spec.negative_prompt, "warm_buckets": warm,
                "prompt_upsampler": (None if spec.prompt_upsampler is None else
                                     {"kind": spec.prompt_upsampler.kind.value,
                                      "default": spec.prompt_upsampler.default_on}),
                "styles": [{"name": s.name, "title": s.title, "trigger": s.trigger, "default_scale": s.default_scale}
                           for s in spec.styles] if not refusal else [],
                "styles_refused": refusal, "style_scale": {"min": STYLE_SCALE_RANGE[0], "max": STYLE_SCALE_RANGE[1]},
            })
        return json.dumps({"device": self.engine.device.badge, "modes": [m.value for m in modes],
                           "default_mode": self.handlers.settings.start_mode.value,
                           "max_images": self.limits.max_images, "max_prompt_chars": self.limits.max_prompt_chars,
                           "models": models}, indent=1)
