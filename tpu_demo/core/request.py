"""The engine's request type, validated on the server for every caller (UI or API).

Every door (the page, ``/generate``, ``/compare_modes``, the MCP tools) builds one
``GenerationRequest`` from named inputs through ``validate_request``: every field is checked before
anything reaches the device, each violation raises RequestError naming the field, and every optional
field a caller leaves out is the chosen model's default. Each named input's type and documentation
(``INPUT_TYPES``, ``input_docs``) live here too: the endpoints' signatures are built from them.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Sequence

from tpu_demo.core.buckets import Bucket, BucketError
from tpu_demo.core.catalog import ModelSpec, get_spec
from tpu_demo.core.modes import ExecutionMode
from tpu_demo.core.styles import NO_STYLE, STYLE_SCALE_RANGE, default_scale, style_names

MAX_SEED = 2**32 - 1

#: the named inputs of /generate (and the page's Generate), in the API's order: gradio_client's parameters
GENERATE_INPUTS = ("prompt", "model", "mode", "resolution", "num_inference_steps", "guidance_scale", "seed",
                   "num_images", "previews", "negative_prompt", "style", "style_scale", "upsample_prompt")
#: the named inputs of /compare_modes, in its API's order (it runs every mode, one image each, no previews)
COMPARE_INPUTS = ("prompt", "negative_prompt", "model", "resolution", "num_inference_steps", "guidance_scale",
                  "seed", "style", "style_scale", "upsample_prompt")
#: each named input's type as the API endpoints declare it (an endpoint whose default is None adds ``| None``)
INPUT_TYPES: dict[str, type] = {
    "prompt": str, "model": str, "mode": str, "resolution": str, "num_inference_steps": int, "guidance_scale": float,
    "seed": int, "num_images": int, "previews": bool, "negative_prompt": str, "style": str, "style_scale": float,
    "upsample_prompt": bool}
#: the inputs whose default depends on the chosen model: an endpoint defaults them to None, and a None
#: there is left out (``named_inputs``) so that ``validate_request`` fills the model's default
MODEL_DEFAULTS = frozenset({"resolution", "num_inference_steps", "guidance_scale", "style", "style_scale",
                            "upsample_prompt"})


def named_inputs(inputs: Mapping[str, Any], null_means_left_out: frozenset[str]) -> dict[str, Any]:
    """The raw request a door hands ``validate_request``: its named inputs less those left out (a null in
    ``null_means_left_out``, for a door whose optional arguments default to None), which then take the
    chosen model's defaults. Every other null is kept, and refused."""
    return {name: value for name, value in inputs.items() if not (value is None and name in null_means_left_out)}


class RequestError(ValueError):
    """A request field with a bad value; ``str()`` is safe to show to users."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class RequestLimits:
    """Operator limits on what one request may ask for."""

    max_prompt_chars: int = 1000
    max_images: int = 4
    offered_models: tuple[str, ...] | None = None
    offered_modes: tuple[ExecutionMode, ...] = tuple(ExecutionMode)


@dataclass(frozen=True)
class GenerationRequest:
    """One validated generation: ``num_images`` images, image i seeded with ``seed + i``."""

    prompt: str
    model: str
    mode: ExecutionMode
    width: int
    height: int
    num_inference_steps: int
    guidance_scale: float
    seed: int
    num_images: int = 1
    #: stream latent previews while denoising (never changes the final pixels)
    previews: bool = True
    #: what the image should not show; only for models whose pipeline takes one (ModelSpec.negative_prompt)
    negative_prompt: str = ""
    #: one of the model's style adapters by name, "" for none (core/styles.py), and its strength
    style: str = ""
    style_scale: float = 1.0
    #: rewrite the prompt per image with the model's prompt upsampler (core/upsampling.py); always
    #: False for a model that declares none
    upsample_prompt: bool = False

    @property
    def style_key(self) -> tuple[str, float]:
        """What the transformer's adapter must be for this request: no style has no strength."""
        return (self.style, self.style_scale) if self.style else ("", 0.0)

    @property
    def bucket(self) -> Bucket:
        return Bucket(self.width, self.height)

    @property
    def resolution(self) -> str:
        return str(self.bucket)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["mode"] = self.mode.value
        return data


#: guidance a model with fixed guidance still accepts (and ignores): what any model here takes
ANY_GUIDANCE = (0.0, 20.0)


def _kind(value: Any) -> str:
    """The JSON name of a value's type, for messages (an API caller sent JSON, not Python)."""
    if value is None:
        return "null"
    return {bool: "a boolean", list: "a list", dict: "an object", str: "text"}.get(type(value), type(value).__name__)


def _integer(field: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or value is None:
        raise RequestError(field, f"must be an integer from {low} to {high}, got {_kind(value)}")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise RequestError(field, f"must be a whole number from {low} to {high}, got {value!r}")
        value = int(value)
    elif isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise RequestError(field, f"must be an integer from {low} to {high}, got {value[:20]!r}") from None
    elif not isinstance(value, int):
        raise RequestError(field, f"must be an integer from {low} to {high}, got {_kind(value)}")
    if not low <= value <= high:
        raise RequestError(field, f"must be from {low} to {high}, got {value}")
    return value


def _number(field: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise RequestError(field, f"must be a number from {low} to {high}, got {_kind(value)}")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise RequestError(field, f"must be a number from {low} to {high}, got {str(value)[:20]!r}") from None
    if not math.isfinite(number) or not low <= number <= high:
        raise RequestError(field, f"must be from {low} to {high}, got {str(value)[:20]}")
    return number


def _boolean(field: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    shown = repr(value)[:20] if isinstance(value, (int, float, str)) else _kind(value)
    raise RequestError(field, f"must be true or false, got {shown}")


def _prompt(value: Any, max_chars: int, field: str = "prompt", required: bool = True) -> str:
    if not isinstance(value, str):
        raise RequestError(field, f"must be text, got {_kind(value)}")
    prompt = value.strip()
    if not prompt and required:
        raise RequestError(field, "is empty; describe the image you want")
    if len(prompt) > max_chars:
        raise RequestError(field, f"is {len(prompt)} characters long; the limit is {max_chars}")
    if any(unicodedata.category(char) in ("Cc", "Cs", "Co") and char not in "\n\t" for char in prompt):
        raise RequestError(field, "contains control or unprintable characters; use plain text")
    return prompt


def _negative_prompt(value: Any, spec: ModelSpec, max_chars: int) -> str:
    """Checked like the prompt, but may be empty; a model whose pipeline takes none refuses a non-empty one."""
    negative = _prompt(value, max_chars, "negative_prompt", required=False)
    if negative and not spec.negative_prompt:
        raise RequestError("negative_prompt", f"{spec.id} does not take a negative prompt; leave it empty")
    return negative


def _style(raw: Mapping[str, Any], spec: ModelSpec) -> tuple[str, float]:
    """The style by name ("" for none: "None", "" or left out) and its scale (the style's default when left out)."""
    value = raw.get("style", "")
    offered = ", ".join(style_names(spec.styles))
    if not isinstance(value, str):
        raise RequestError("style", f"must be one of: {offered}, got {_kind(value)}")
    if value not in style_names(spec.styles) and value != "":
        raise RequestError("style", f"{value[:40]!r} is not a style of {spec.id}; choose one of: {offered}")
    scale = _number("style_scale", raw.get("style_scale", default_scale(spec.styles, value)), *STYLE_SCALE_RANGE)
    return ("" if value == NO_STYLE else value), scale


def check_model(value: Any, limits: RequestLimits = RequestLimits()) -> ModelSpec:
    """The offered model named ``value`` (any handler that takes a model id checks it here)."""
    if not isinstance(value, str):
        raise RequestError("model", f"must be a model id, got {_kind(value)}")
    try:
        return get_spec(value, limits.offered_models)
    except KeyError as error:
        raise RequestError("model", str(error.args[0])) from None


def check_mode(value: Any, limits: RequestLimits = RequestLimits()) -> ExecutionMode:
    """The offered execution mode named ``value``."""
    offered_modes = ", ".join(mode.value for mode in limits.offered_modes)
    if not isinstance(value, str):
        raise RequestError("mode", f"must be one of: {offered_modes}, got {_kind(value)}")
    try:
        mode = ExecutionMode(value)
    except ValueError:
        raise RequestError("mode", f"{value[:40]!r} is not a mode; choose one of: {offered_modes}") from None
    if mode not in limits.offered_modes:
        raise RequestError("mode", f"{mode.value!r} is not offered here; choose one of: {offered_modes}")
    return mode


def validate_request(raw: Mapping[str, Any], limits: RequestLimits = RequestLimits()) -> GenerationRequest:
    """Check every field of a raw request (from the UI or the API) against the model's limits.

    Every field is checked whether or not the model uses it (a NaN guidance is refused even where
    the model's guidance is fixed); the resolution is required, optional fields may be left out (they
    take the chosen model's defaults: its steps, guidance, upsampler setting, the style's strength), but
    none may be sent as null.
    """
    spec = check_model(raw.get("model"), limits)
    mode = check_mode(raw.get("mode"), limits)
    resolution = raw.get("resolution")
    if not isinstance(resolution, str):
        raise RequestError("resolution", f"must be text like \"{spec.buckets[0]}\", got {_kind(resolution)}")
    try:
        bucket = Bucket.parse(resolution, spec.size_multiple)
    except BucketError as error:
        raise RequestError("resolution", str(error)) from None
    if bucket not in spec.buckets:
        allowed = ", ".join(str(b) for b in spec.buckets)
        raise RequestError("resolution", f"{bucket} is not served for {spec.id}; choose one of: {allowed}")
    steps = _integer("num_inference_steps", raw.get("num_inference_steps", spec.default_steps),
                     spec.min_steps, spec.max_steps)
    if spec.guidance_range is None:
        # fixed by the model (e.g. distilled schnell): checked like any number, then not used
        _number("guidance_scale", raw.get("guidance_scale", spec.default_guidance), *ANY_GUIDANCE)
        guidance = spec.default_guidance
    else:
        guidance = _number("guidance_scale", raw.get("guidance_scale", spec.default_guidance), *spec.guidance_range)
    style, style_scale = _style(raw, spec)
    upsampler = spec.prompt_upsampler
    # checked whatever the model; a model without an upsampler ignores it, as a fixed guidance is ignored
    upsample = _boolean("upsample_prompt", raw.get("upsample_prompt", upsampler is not None and upsampler.default_on))
    return GenerationRequest(
        prompt=_prompt(raw.get("prompt"), limits.max_prompt_chars),
        model=spec.id,
        mode=mode,
        width=bucket.width,
        height=bucket.height,
        num_inference_steps=steps,
        guidance_scale=guidance,
        seed=_integer("seed", raw.get("seed", 0), 0, MAX_SEED),
        num_images=_integer("num_images", raw.get("num_images", 1), 1, limits.max_images),
        previews=_boolean("previews", raw.get("previews", True)),
        negative_prompt=_negative_prompt(raw.get("negative_prompt", ""), spec, limits.max_prompt_chars),
        style=style, style_scale=style_scale, upsample_prompt=upsample and upsampler is not None,
    )


def input_docs(specs: Sequence[ModelSpec], limits: RequestLimits, style_refusal: Callable[[str], str | None],
               model: str, mode: str, num_images: int) -> dict[str, str]:
    """Each named input's documentation on this server (the API's docstrings and MCP schemas): its values per
    offered model (``specs``) and its default (``model``, ``mode`` and ``num_images`` where the model does not
    decide it). ``style_refusal``: why a model's placement takes no style here, or None."""
    def per_model(describe: Callable[[ModelSpec], str]) -> str:
        return "; ".join(f"{spec.id}: {describe(spec)}" for spec in specs)

    def guidance(spec: ModelSpec) -> str:
        if spec.guidance_range is None:
            return f"fixed at {spec.default_guidance} (any value {ANY_GUIDANCE[0]:g}-{ANY_GUIDANCE[1]:g} is accepted and ignored)"
        return f"{spec.guidance_range[0]}-{spec.guidance_range[1]}, default {spec.default_guidance}"

    def styles(spec: ModelSpec) -> str:
        refusal = style_refusal(spec.id) if spec.styles else None
        if not spec.styles or refusal:
            return f"{NO_STYLE} only" + (f" ({refusal})" if refusal else "")
        return ", ".join([NO_STYLE] + [f"{s.name} ({s.title!r}" + (f", trigger words {s.trigger!r}" if s.trigger else "")
                                       + ")" for s in spec.styles])

    def upsampling(spec: ModelSpec) -> str:
        upsampler = spec.prompt_upsampler
        if upsampler is None:
            return "none"
        return f"{upsampler.kind.value}, default {'on' if upsampler.default_on else 'off'} ({upsampler.cost_note})"

    modes = ", ".join(f"{m.value} ({m.title})" for m in limits.offered_modes)
    scales = "; ".join(f"{spec.id}: " + ", ".join(f"{s.name} {s.default_scale:g}" for s in spec.styles)
                       for spec in specs if spec.styles) or "no model here has styles"
    takes_negative = ", ".join(spec.id for spec in specs if spec.negative_prompt) or "no model here"
    return {
        "prompt": f"what to draw, 1-{limits.max_prompt_chars} characters of plain text (required).",
        "model": f"one of {', '.join(spec.id for spec in specs)}; default {model}.",
        "mode": f"execution mode, one of {modes}; default {mode}.",
        "resolution": ("WIDTHxHEIGHT, one of the model's buckets ("
                       + per_model(lambda s: ", ".join(str(b) for b in s.buckets)) + "); default: the model's first bucket."),
        "num_inference_steps": "denoising steps (" + per_model(
            lambda s: f"{s.min_steps}-{s.max_steps}, default {s.default_steps}") + "); default: the model's.",
        "guidance_scale": "guidance scale (" + per_model(guidance) + "); default: the model's.",
        "seed": f"0-{MAX_SEED}; image i uses seed + i; default 0.",
        "num_images": f"1-{limits.max_images}; default {num_images} (the tool's: 1).",
        "previews": "stream live previews of the image denoising now; default true.",
        "style": (f"a style adapter (LoRA, swapped on the warm graph without recompiling) by name, or {NO_STYLE!r} "
                  "for none; per model: " + per_model(styles) + f"; default {NO_STYLE!r}."),
        "style_scale": (f"the style's strength, {STYLE_SCALE_RANGE[0]}-{STYLE_SCALE_RANGE[1]} (0 draws as no style; "
                        "ignored without a style); default: the style's own (" + scales + "), 1.0 without a style."),
        "negative_prompt": (f"what the image should not show (only {takes_negative} take one; leave empty for the "
                            "others); default empty."),
        "upsample_prompt": ("rewrite the prompt per image with the model's prompt upsampler before drawing (what "
                            "the prompt leaves out is chosen from the image's seed; each image's caption says "
                            "'drawn as: ...'); per model: " + per_model(upsampling) + "; ignored by a model without one."),
    }
