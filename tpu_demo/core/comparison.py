"""One request run in each execution mode, as plain data: what the comparison panel and API show."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from PIL import Image


@dataclass(frozen=True)
class ComparePhase:
    """A step of a comparison the visitor may wait on: warming a cold bucket, or timing one mode."""

    mode: str
    text: str


@dataclass(frozen=True)
class ModeRun:
    """The request's image in one mode, timed warm."""

    mode: str
    #: what actually ran, e.g. "compiled (inductor on cpu)"
    description: str
    image: Image.Image
    parameters: dict[str, Any]
    denoise_seconds: float
    steps_per_second: float
    #: strict eager's denoise seconds / this mode's (1.0 for strict eager itself)
    speedup: float
    #: the bucket was warm before the comparison; if not, it was warmed first and took ``warmup_seconds``
    warm_before: bool
    warmup_seconds: float | None
    #: graphs compiled while warming this mode's bucket (0 for the eager modes)
    graphs_compiled: int
    #: largest absolute difference of any 8-bit channel from the strict-eager image
    max_pixel_difference: int


@dataclass(frozen=True)
class Comparison:
    """Every mode's run, strict eager first; ``same_code`` lists modes that run identical code here."""

    runs: tuple[ModeRun, ...]
    same_code: tuple[tuple[str, ...], ...] = field(default_factory=tuple)
    #: each mode was timed this many times, interleaved; its fastest run is reported
    timed_rounds: int = 1

    def as_dict(self) -> dict[str, Any]:
        """The figures without the images (the API's JSON output)."""
        return {
            "warm_vs_warm": True,
            "timed_rounds": self.timed_rounds,
            "same_code": [list(group) for group in self.same_code],
            "modes": [{
                "mode": run.mode, "description": run.description, "seed": run.parameters.get("seed"),
                "denoise_seconds": run.denoise_seconds, "steps_per_second": run.steps_per_second,
                "speedup_vs_strict_eager": run.speedup, "warm_before": run.warm_before,
                "warmup_seconds": run.warmup_seconds, "graphs_compiled": run.graphs_compiled,
                "max_pixel_difference": run.max_pixel_difference,
            } for run in self.runs],
        }
