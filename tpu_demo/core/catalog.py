"""The model catalog: everything the app knows about each model, as data.

Code elsewhere reads these fields; it never branches on a model's name. Adding a model means
adding an entry here. Sizes are approximate bf16 gigabytes per component (they drive the
automatic placement); the tiny stand-ins are measured at load time instead.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from tpu_demo.core.buckets import Bucket
from tpu_demo.core.styles import StyleSpec
from tpu_demo.core.upsampling import PromptUpsamplerSpec, UpsamplerKind

#: Where committed assets (prompts, trained tiny weights) live.
ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets"

_PIPELINE_CLASSES = frozenset({"FluxPipeline", "StableDiffusion3Pipeline", "Flux2Pipeline"})
_GUIDANCE_ARGUMENTS = frozenset({"guidance_scale", "true_cfg_scale"})


class Placement(str, enum.Enum):
    """How a model's components are put on the device(s)."""

    WHOLE = "whole"  # pipe.to(device); compiled mode compiles the full transformer
    OFFLOAD = "offload"  # enable_model_cpu_offload(); compiled mode compiles repeated blocks
    #: denoiser and VAE stay on the chip, text encoders run on the host; prompt embeddings are
    #: cached (LRU), so a repeated prompt skips the encoders and no weights move per request
    RESIDENT = "resident"
    TENSOR_PARALLEL = "tensor-parallel"  # transformer/text encoder sharded over chips (torchrun)


class CatalogError(ValueError):
    """A catalog entry that cannot work."""


@dataclass(frozen=True)
class ModelSpec:
    """One model the app can serve."""

    id: str
    title: str
    pipeline_class: str
    #: hub repo id ("org/name"), "builtin:<name>" (tiny random stand-in built offline) or
    #: "assets:<dir>" (weights committed under assets/).
    source: str
    default_steps: int
    max_steps: int
    default_guidance: float
    buckets: tuple[Bucket, ...]
    placements: tuple[Placement, ...]
    #: approximate size in GB of each component in ``accelerator_dtype``
    component_gb: Mapping[str, float] = field(default_factory=dict)
    min_steps: int = 1
    #: None means guidance is fixed at ``default_guidance`` (e.g. FLUX.1-schnell, distilled)
    guidance_range: tuple[float, float] | None = (0.0, 20.0)
    #: True when guidance > 1 runs classifier-free guidance by doubling the batch (SD3): another static shape
    cfg_doubles_batch: bool = False
    #: the most images one call of a bucket runs beside the weights on one chip (1, 2 or 4): the default
    #: ``--max-batch``, each size warmed like a bucket (TPU figures: docs/generation.md, "Which sizes")
    max_batch: int = 4
    #: the pipeline argument the guidance control sets: ``guidance_scale`` (distilled guidance, or
    #: SD3's CFG) or ``true_cfg_scale`` (FluxPipeline's true CFG against ``negative_prompt``: a
    #: second transformer call per step at batch 1, so no new shape)
    guidance_argument: str = "guidance_scale"
    accelerator_dtype: str = "bfloat16"
    cpu_dtype: str = "float32"
    #: the pipeline takes ``negative_prompt`` (SD3's CFG, FluxPipeline's true CFG): the page shows the
    #: field and the request carries it; always passed ("" by default), since FluxPipeline runs true CFG
    #: only when one is given
    negative_prompt: bool = False
    #: extra keyword arguments for every pipeline call (static text length etc.)
    call_kwargs: Mapping[str, object] = field(default_factory=dict)
    #: image side lengths must be multiples of this (vae_scale_factor * patch packing)
    size_multiple: int = 16
    #: transformer block classes compiled one by one under CPU offload; empty: the model's own
    #: ``_repeated_blocks`` (SD3's transformer declares none)
    repeated_blocks: tuple[str, ...] = ()
    license_note: str = ""
    example_prompts_file: str = "prompts.txt"
    #: files of the hub repo the app never reads (single-file checkpoints that duplicate the
    #: diffusers folders): ``hf download --exclude`` patterns, the same as deploy/k8s's manifests
    download_exclude: tuple[str, ...] = ()
    #: short name used in page lines ("not in Tiny Shapes' vocabulary"); the title when empty
    short_title: str = ""
    #: style adapters (LoRA) a visitor may pick by name; hot-swapped on the warm graph
    #: (docs/models.md#styles-lora-adapters-that-swap-without-recompiling)
    styles: tuple[StyleSpec, ...] = ()
    #: rewrites the visitor's prompt per image before the pipeline sees it (core/upsampling.py);
    #: None: the model shows no "Upsample prompt" control
    prompt_upsampler: PromptUpsamplerSpec | None = None

    @property
    def language_path(self) -> Path | None:
        """Where a ``language`` upsampler's file lies (beside the weights of an ``assets:`` model); else None."""
        upsampler = self.prompt_upsampler
        if upsampler is None or upsampler.kind is not UpsamplerKind.LANGUAGE or not self.source.startswith("assets:"):
            return None
        return ASSETS_DIR / self.source.removeprefix("assets:") / upsampler.language_file

    @property
    def vocabulary_path(self) -> Path | None:
        """Where the weights declare their vocabulary (``vocabulary.json`` in an ``assets:`` model's
        folder; tiny_shapes writes it when it trains); None for hub and built-in models."""
        if not self.source.startswith("assets:"):
            return None
        return ASSETS_DIR / self.source.removeprefix("assets:") / "vocabulary.json"

    def pipeline_kwargs(self, guidance: float, negative_prompt: str = "") -> dict[str, object]:
        """Keyword arguments of every pipeline call besides prompt, size, steps and generator."""
        negative = {"negative_prompt": negative_prompt} if self.negative_prompt else {}
        return {self.guidance_argument: guidance, **negative, **self.call_kwargs}

    @property
    def is_builtin(self) -> bool:
        return self.source.startswith(("builtin:", "assets:"))

    @property
    def hub_repo(self) -> str | None:
        return None if self.is_builtin else self.source

    @property
    def card(self) -> str | None:
        """Where the model's card is: its hub page, or the README.md beside an ``assets:`` model's weights
        (a path in this repository); None for the built-in random stand-ins."""
        if self.hub_repo is not None:
            return f"https://huggingface.co/{self.hub_repo}"
        if self.source.startswith("assets:") and (ASSETS_DIR / self.source.removeprefix("assets:") / "README.md").exists():
            return f"assets/{self.source.removeprefix('assets:')}/README.md"
        return None

    @property
    def download_command(self) -> str | None:
        """The one command that puts this model's weights in the local hub cache (None: nothing to fetch).

        huggingface_hub 2.x ships only the ``hf`` command; the older CLI name no longer exists."""
        if self.hub_repo is None:
            return None
        token = "HF_TOKEN=... " if "gated" in self.license_note else ""
        excludes = "".join(f" --exclude '{pattern}'" for pattern in self.download_exclude)
        return f"{token}hf download {self.hub_repo}{excludes}"

    @property
    def guidance_fixed(self) -> bool:
        return self.guidance_range is None

    @property
    def total_gb(self) -> float:
        return sum(self.component_gb.values())

    @property
    def largest_component(self) -> tuple[str, float]:
        return max(self.component_gb.items(), key=lambda item: item[1], default=("transformer", 0.0))

    def with_buckets(self, buckets: tuple[Bucket, ...]) -> "ModelSpec":
        from dataclasses import replace

        return replace(self, buckets=buckets)

    def validate(self) -> "ModelSpec":
        """Raise CatalogError naming the entry and the field when the entry cannot work."""
        problems = []
        if self.pipeline_class not in _PIPELINE_CLASSES:
            problems.append(f"pipeline_class {self.pipeline_class!r} is not one of {sorted(_PIPELINE_CLASSES)}")
        if not (1 <= self.min_steps <= self.default_steps <= self.max_steps):
            problems.append(f"steps need 1 <= min_steps <= default_steps <= max_steps, got "
                            f"{self.min_steps}, {self.default_steps}, {self.max_steps}")
        if self.guidance_argument not in _GUIDANCE_ARGUMENTS:
            problems.append(f"guidance_argument {self.guidance_argument!r} is not one of {sorted(_GUIDANCE_ARGUMENTS)}")
        if not self.buckets:
            problems.append("buckets is empty")
        for bucket in self.buckets:
            if bucket.width % self.size_multiple or bucket.height % self.size_multiple:
                problems.append(f"bucket {bucket} is not a multiple of {self.size_multiple}")
        if not self.placements:
            problems.append("placements is empty")
        if self.guidance_range is not None:
            low, high = self.guidance_range
            if not low <= self.default_guidance <= high:
                problems.append(f"default_guidance {self.default_guidance} is outside {self.guidance_range}")
        for style in self.styles:
            problems.extend(style.problems())
        if len({style.name for style in self.styles}) != len(self.styles):
            problems.append("two styles share a name")
        upsampler = self.prompt_upsampler
        if upsampler is not None and upsampler.kind is UpsamplerKind.LANGUAGE and self.language_path is None:
            problems.append("a language prompt_upsampler needs an assets: source (its file lies beside the weights)")
        if upsampler is not None and upsampler.kind is UpsamplerKind.PIPELINE and self.pipeline_class != "Flux2Pipeline":
            problems.append(f"{self.pipeline_class} has no upsample_prompt; only Flux2Pipeline does")
        if not (self.is_builtin or "/" in self.source):
            problems.append(f"source {self.source!r} is neither builtin:, assets: nor a hub repo id")
        if problems:
            raise CatalogError(f"catalog entry {self.id!r}: " + "; ".join(problems))
        return self


def _buckets(*labels: str) -> tuple[Bucket, ...]:
    return tuple(Bucket.parse(label) for label in labels)


#: trained here (scripts/train_tiny_style.py), committed beside the base weights
_TINY_SHAPES_STYLES = (
    # default_scale: the smallest of 1.0 / 1.05 / 1.1 at which the tuning prompts (trained triples) meet
    # 90% style / 90% attributes in every bucket (docs/tiny-shapes.md#styles-outline-and-shaded-lora-adapters-hot-swapped)
    StyleSpec("outline", "Outline (only the border of each shape)", "assets:models/tiny-shapes/styles/outline.safetensors",
              default_scale=1.05, example="a large blue circle in the center on a white background"),
    StyleSpec("shaded", "Shaded (each shape lit from above)", "assets:models/tiny-shapes/styles/shaded.safetensors",
              example="a large orange circle at the top-left and a large blue square at the bottom-right on a white background"),
)

#: the FLUX.2 Space leaves prompt upsampling to the visitor: off, since it is a text-generation pass of
#: the text encoder (up to 512 new tokens) before every image (docs/generation.md#prompt-upsampling)
_FLUX2_UPSAMPLER = PromptUpsamplerSpec(
    UpsamplerKind.PIPELINE, default_on=False, temperature=0.15,
    cost_note="a text-generation pass of the text encoder (up to 512 new tokens) before each image")

_REAL_BUCKETS = _buckets("1024x1024", "1152x896", "896x1152", "1344x768", "768x1344")
_TINY_BUCKETS = _buckets("64x64", "128x128", "96x64", "64x96")

_ENTRIES = (
    ModelSpec(
        id="tiny-shapes", title="Tiny Shapes (trained here on CPU, draws its prompt)", pipeline_class="FluxPipeline",
        source="assets:models/tiny-shapes", default_steps=12, max_steps=50, default_guidance=3.0,
        guidance_range=(1.0, 10.0), guidance_argument="true_cfg_scale", buckets=_TINY_BUCKETS, size_multiple=8,
        placements=(Placement.WHOLE, Placement.OFFLOAD, Placement.TENSOR_PARALLEL),
        negative_prompt=True, call_kwargs={"max_sequence_length": 24}, example_prompts_file="tiny_shapes_prompts.txt",
        short_title="Tiny Shapes", styles=_TINY_SHAPES_STYLES,
        prompt_upsampler=PromptUpsamplerSpec(UpsamplerKind.LANGUAGE, default_on=True,
                                             cost_note="under a millisecond: a reader of the model's own sentence form"),
    ),
    ModelSpec(
        id="tiny-flux", title="Tiny FLUX (random weights, offline)", pipeline_class="FluxPipeline",
        source="builtin:tiny-flux", default_steps=4, max_steps=50, default_guidance=0.0,
        guidance_range=None, buckets=_TINY_BUCKETS,
        placements=(Placement.WHOLE, Placement.RESIDENT, Placement.OFFLOAD, Placement.TENSOR_PARALLEL),
        call_kwargs={"max_sequence_length": 77},
    ),
    ModelSpec(
        id="tiny-sd3", title="Tiny SD3 (random weights, offline)", pipeline_class="StableDiffusion3Pipeline",
        source="builtin:tiny-sd3", default_steps=4, max_steps=50, default_guidance=4.5,
        guidance_range=(0.0, 20.0), cfg_doubles_batch=True, negative_prompt=True, buckets=_TINY_BUCKETS,
        placements=(Placement.WHOLE, Placement.RESIDENT, Placement.OFFLOAD), call_kwargs={"max_sequence_length": 77},
        repeated_blocks=("JointTransformerBlock",),
    ),
    ModelSpec(
        id="tiny-flux2", title="Tiny FLUX.2 (random weights, offline)", pipeline_class="Flux2Pipeline",
        source="builtin:tiny-flux2", default_steps=4, max_steps=50, default_guidance=4.0,
        guidance_range=(0.0, 20.0), buckets=_TINY_BUCKETS,
        placements=(Placement.WHOLE, Placement.RESIDENT, Placement.OFFLOAD, Placement.TENSOR_PARALLEL),
        call_kwargs={"max_sequence_length": 77}, prompt_upsampler=_FLUX2_UPSAMPLER,
    ),
    ModelSpec(
        id="flux.1-schnell", title="FLUX.1 [schnell]", pipeline_class="FluxPipeline",
        source="black-forest-labs/FLUX.1-schnell", default_steps=4, min_steps=1, max_steps=8,
        default_guidance=0.0, guidance_range=None, buckets=_REAL_BUCKETS,
        placements=(Placement.WHOLE, Placement.RESIDENT, Placement.OFFLOAD, Placement.TENSOR_PARALLEL),
        component_gb={"transformer": 23.8, "text_encoder_2": 9.5, "text_encoder": 0.25, "vae": 0.17},
        call_kwargs={"max_sequence_length": 256}, license_note="Apache-2.0",
        download_exclude=("flux1-schnell.safetensors", "ae.safetensors"), max_batch=2,
    ),
    ModelSpec(
        id="sd3.5-medium", title="Stable Diffusion 3.5 Medium", pipeline_class="StableDiffusion3Pipeline",
        source="stabilityai/stable-diffusion-3.5-medium", default_steps=40, max_steps=80,
        default_guidance=4.5, guidance_range=(0.0, 20.0), cfg_doubles_batch=True, negative_prompt=True,
        buckets=_REAL_BUCKETS,
        placements=(Placement.WHOLE, Placement.RESIDENT, Placement.OFFLOAD),
        component_gb={"transformer": 4.9, "text_encoder_3": 9.5, "text_encoder_2": 1.4,
                      "text_encoder": 0.25, "vae": 0.17},
        repeated_blocks=("JointTransformerBlock",),
        license_note="gated: accept the license on the hub and set HF_TOKEN",
        download_exclude=("sd3.5_medium.safetensors", "text_encoders/*"),
    ),
    ModelSpec(
        id="flux.2-dev", title="FLUX.2 [dev]", pipeline_class="Flux2Pipeline",
        source="black-forest-labs/FLUX.2-dev", default_steps=28, max_steps=60, default_guidance=4.0,
        guidance_range=(0.0, 20.0), buckets=_REAL_BUCKETS,
        placements=(Placement.TENSOR_PARALLEL, Placement.RESIDENT),
        component_gb={"transformer": 64.0, "text_encoder": 48.0, "vae": 0.17},
        license_note="gated: accept the license on the hub and set HF_TOKEN",
        download_exclude=("flux2-dev.safetensors", "ae.safetensors"), prompt_upsampler=_FLUX2_UPSAMPLER,
        max_batch=1,
    ),
)

#: Every model the app knows, by id. Read-only.
CATALOG: Mapping[str, ModelSpec] = MappingProxyType({spec.id: spec.validate() for spec in _ENTRIES})

TINY_MODEL_IDS: tuple[str, ...] = tuple(spec.id for spec in _ENTRIES if spec.is_builtin)
REAL_MODEL_IDS: tuple[str, ...] = tuple(spec.id for spec in _ENTRIES if not spec.is_builtin)
DEFAULT_MODEL_ID = "tiny-shapes"


def get_spec(model_id: str, offered: tuple[str, ...] | None = None) -> ModelSpec:
    """The entry for ``model_id``; KeyError with a clear message if unknown or not offered."""
    if model_id not in CATALOG or (offered is not None and model_id not in offered):
        choices = ", ".join(offered if offered is not None else CATALOG)
        raise KeyError(f"{str(model_id)[:60]!r} is not offered here; choose one of: {choices}")
    return CATALOG[model_id]
