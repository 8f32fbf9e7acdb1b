"""What the engine reports, as plain data (no torch): request events and status snapshots.

The UI renders these; the engine produces them. Images are PIL images.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from PIL import Image


class BucketState(str, enum.Enum):
    COLD = "cold"
    COMPILING = "compiling"
    WARM = "warm"
    FAILED = "failed"


class ShapeKey(NamedTuple):
    """One static shape of one model in one mode: one compiled graph, one row of the Buckets panel."""

    model: str
    mode: str
    resolution: str
    #: the transformer's batch: images per pipeline call (1, 2, 4: --max-batch), times 2 where the
    #: model's classifier-free guidance doubles the batch (SD3)
    batch: int = 1


@dataclass
class BucketStatus:
    """One static shape of one (model, mode): cold until its first call compiled it."""

    model: str
    mode: str
    resolution: str
    batch: int
    state: BucketState = BucketState.COLD
    compile_seconds: float | None = None
    compiles: int = 0
    from_cache: bool | None = None
    error: str | None = None

    @property
    def key(self) -> ShapeKey:
        return ShapeKey(self.model, self.mode, self.resolution, self.batch)

    @classmethod
    def cold(cls, key: ShapeKey) -> "BucketStatus":
        return cls(model=key.model, mode=key.mode, resolution=key.resolution, batch=key.batch)


@dataclass(frozen=True)
class Loading:
    """The request's model is being loaded (weights read and placed) before its first call."""

    model: str
    #: what the page shows, e.g. "loading Stable Diffusion 3.5 Medium, 16 GB ..."
    text: str


@dataclass(frozen=True)
class Compiling:
    """A cold bucket is being compiled (first time for this shape) before the image starts."""

    resolution: str
    mode: str


class Preview(Protocol):
    """A step preview captured by the engine; ``render()`` makes the image where it is shown."""

    #: the denoising step it shows (it may arrive with a later step's progress)
    step: int

    def render(self) -> Image.Image: ...


@dataclass(frozen=True)
class StepProgress:
    """Denoising step ``step`` of ``total`` finished for image ``index``; ``preview`` is optional."""

    index: int
    step: int
    total: int
    elapsed_seconds: float
    preview: "Preview | None" = None


@dataclass(frozen=True)
class ImageResult:
    """Image ``index`` of the request is done."""

    index: int
    image: Image.Image
    seed: int
    parameters: dict[str, Any]
    timings: dict[str, float]
    warm: bool


@dataclass(frozen=True)
class Stopped:
    """The request was stopped; ``completed`` images were finished before."""

    completed: int
    reason: str


@dataclass
class EngineStatus:
    """A snapshot for the status panel and the health endpoint (no paths, no secrets)."""

    device: str
    device_kind: str
    device_count: int
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    buckets: list[BucketStatus] = field(default_factory=list)
    compiles_total: int = 0
    busy: bool = False
    #: "loading <model>, <size> ..." while the device thread loads a model, else None
    loading: str | None = None
