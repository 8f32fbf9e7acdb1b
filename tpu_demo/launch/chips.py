"""``--chips``: how one command puts every chip of a host to work (the plan; fleet.py runs it).

``python app.py`` alone computes on one chip whatever the host has. With ``--chips all`` (every
TPU chip of this host) or ``--chips N``:

- every offered model fits one chip (docs/placements.md): **one engine per chip**, each a plain
  ``python app.py`` pinned to its chip through libtpu's environment (``device.one_chip_environment``),
  on a loopback port, behind the nginx of deploy/nginx (session affinity, only ready engines get
  visitors). No collective joins them, so N chips serve N visitors at once. Off TPU the same
  command runs N engines on loopback (CPU: N replicas sharing the host's cores).
- some offered model fits no single chip: **one tensor-parallel group** over the chips
  (``scripts/serve_tp.sh N``, as before), offering the models that can be sharded.

Pure planning: no process is started and no chip is opened here (the PCI scan only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tpu_demo.core.catalog import CATALOG, Placement
from tpu_demo.models.placement_plan import plan_serving

ENGINES = "one engine per chip"
TENSOR_PARALLEL = "tensor parallel"


class ChipsError(ValueError):
    """The host cannot be served the way ``--chips`` asks; the message says why and what to do."""


@dataclass(frozen=True)
class Host:
    """What the launcher sees of this host before any engine starts."""

    kind: str  # "tpu" or "cpu" (anything without TPU chips: engines detect their own device)
    chips: int
    name: str = ""
    chip_gb: float = 0.0


@dataclass(frozen=True)
class ChipsPlan:
    layout: str  # ENGINES or TENSOR_PARALLEL
    count: int  # engines (ENGINES) or ranks (TENSOR_PARALLEL)
    models: tuple[str, ...]
    host: Host
    #: per model, how the chips serve it (docs/placements.md's words), for the start-up log
    serving: dict[str, str]

    def engine_environment(self, index: int) -> dict[str, str]:
        """Extra environment of engine ``index``: its chip alone on a TPU host, nothing elsewhere."""
        from tpu_demo.device import one_chip_environment

        return one_chip_environment(index) if self.host.kind == "tpu" else {}

    def describe(self) -> str:
        where = f"{self.count} x {self.host.name}" if self.host.kind == "tpu" else f"{self.count} engines on CPU"
        models = ", ".join(f"{model} ({how})" for model, how in self.serving.items())
        return f"{self.layout}: {where}; {models}"


def chip_count(text: str) -> str:
    """``--chips`` values: "all" or a positive number."""
    if text != "all" and not (text.isdigit() and int(text) >= 1):
        raise ValueError("must be 'all' or a positive number of chips")
    return text


chip_count.choices = ("all", "N")  # type: ignore[attr-defined]


def plan_chips(requested: str, host: Host, models: Sequence[str]) -> ChipsPlan:
    """The layout for ``--chips requested`` on ``host`` offering ``models``; ChipsError if none works."""
    if requested == "all" and host.kind != "tpu":
        raise ChipsError("--chips all: no TPU chips on this host; give a number (--chips 2) to run that many "
                         "engines on loopback")
    count = host.chips if requested == "all" else int(requested)
    if host.kind == "tpu" and count > host.chips:
        raise ChipsError(f"--chips {count}: this host has {host.chips} {host.name} chips")
    if host.kind != "tpu":
        return ChipsPlan(ENGINES, count, tuple(models), host, {model: "whole, one engine each" for model in models})
    serving = {model: plan_serving(CATALOG[model], host.chip_gb, count) for model in models}
    too_big = [model for model, plan in serving.items() if plan is None]
    if too_big:
        raise ChipsError(f"--chips {requested}: {', '.join(too_big)} fit(s) neither one {host.name} chip nor "
                         f"{count} of them sharded (docs/placements.md); leave it out of --models")
    sharded = [model for model, plan in serving.items() if plan.chips_per_engine > 1]
    if not sharded:
        return ChipsPlan(ENGINES, count, tuple(models), host, {m: p.describe() for m, p in serving.items()})
    # a model no single chip holds: the chips form one tensor-parallel group for every shardable model
    shardable = tuple(m for m in models if Placement.TENSOR_PARALLEL in CATALOG[m].placements)
    return ChipsPlan(TENSOR_PARALLEL, count, shardable, host,
                     {m: f"tensor-parallel over {count} chips" for m in shardable})
