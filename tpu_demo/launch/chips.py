"""``--chips``: how one command puts every chip of a host to work (the plan; fleet.py runs it).

When every offered model fits one chip: one engine per chip, pinned through libtpu's environment, behind
nginx, with no collective between them. Otherwise: one tensor-parallel group over the chips. Every
offered model is served, or ``plan_chips`` refuses naming each one that cannot be; it never leaves a
model out. Pure planning: it starts no process and opens no chip (the PCI scan only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tpu_demo.core.catalog import CATALOG, Placement
from tpu_demo.models.placement_plan import CHIP_COUNTS, TPU_CHIPS, Serving, plan_serving

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
    """The layout for ``--chips requested`` on ``host`` serving every one of ``models``.

    ChipsError when no layout serves them all: the message names each model that cannot be served
    there and the options (fewer models, tensor parallel over more chips, another host). A model is
    never left out of the plan silently."""
    if requested == "all" and host.kind != "tpu":
        raise ChipsError("--chips all: no TPU chips on this host; give a number (--chips 2) to run that many "
                         "engines on loopback")
    count = host.chips if requested == "all" else int(requested)
    if host.kind == "tpu" and count > host.chips:
        raise ChipsError(f"--chips {count}: this host has {host.chips} {host.name} chips")
    if host.kind != "tpu":
        return ChipsPlan(ENGINES, count, tuple(models), host, {model: "whole, one engine each" for model in models})
    serving, sharded, unserved = _serving(host, count, models)
    if unserved:
        raise ChipsError(refusal(requested, host, count, tuple(models), unserved))
    if not sharded:
        return ChipsPlan(ENGINES, count, tuple(models), host, {m: p.describe() for m, p in serving.items()})
    return ChipsPlan(TENSOR_PARALLEL, count, tuple(models), host,
                     {m: f"tensor-parallel over {count} chips" for m in models})


def _serving(host: Host, count: int, models: Sequence[str]) -> tuple[dict, list[str], dict[str, str]]:
    """(each model's Serving, the models that need sharding, model -> why it cannot be served) on ``count`` chips."""
    serving = {model: plan_serving(CATALOG[model], host.chip_gb, count) for model in models}
    sharded = [model for model, plan in serving.items() if plan is not None and plan.chips_per_engine > 1]
    # a model no single chip holds makes the chips one tensor-parallel group, which serves only shardable models
    unserved = {model: _why_not(model, plan, sharded, host, count) for model, plan in serving.items()
                if plan is None or (sharded and Placement.TENSOR_PARALLEL not in CATALOG[model].placements)}
    return serving, sharded, unserved


def _why_not(model: str, serving: Serving | None, sharded: list[str], host: Host, count: int) -> str:
    if serving is None:
        return (f"it does not fit one {host.name} chip" if count == 1 else
                f"it fits neither one {host.name} chip nor {count} of them sharded")
    verb = "fits" if len(sharded) == 1 else "fit"
    return (f"{', '.join(sharded)} {verb} no single chip, so the {count} chips form one tensor-parallel group, "
            f"and {model} has no tensor-parallel plan")


def hosts_serving_all(models: Sequence[str], count: int) -> list[str]:
    """Hosts of the placement table with ``count`` chips on which ``--chips all`` serves every one of ``models``."""
    return [f"{chip} x {count}" for chip, gb in TPU_CHIPS.items()
            if not _serving(Host("tpu", count, f"TPU {chip}", gb), count, models)[2]]


def refusal(requested: str, host: Host, count: int, models: tuple[str, ...], unserved: dict[str, str]) -> str:
    """One message: which offered models this host cannot serve, why, and what the operator can do."""
    lines = [f"--chips {requested} on {count} x {host.name} ({host.chip_gb:.0f} GB each) cannot serve every "
             f"offered model ({', '.join(models)}):"]
    for model, why in unserved.items():
        spec = CATALOG[model]
        options = []
        others = [m for m in models if m not in unserved]
        if others:
            options.append(f"offer fewer models (--models {','.join(others)})")
        if not why.startswith("it "):  # it fits here, only not in the group the others need
            options.append(f"serve {model} on its own (--models {model}: one engine per chip)")
        more = next((n for n in CHIP_COUNTS if n > count and Placement.TENSOR_PARALLEL in spec.placements
                     and plan_serving(spec, host.chip_gb, n) is not None), None)
        if more is not None:
            options.append(f"tensor parallel over {more} chips of this kind (a host with {more})")
        lines.append(f"- {model}: {why}. Options: {'; '.join(options) or 'another host'}.")
    hosts = hosts_serving_all(models, count)
    lines.append(f"Another host serves all of them: {', '.join(hosts)}." if hosts else
                 f"No host of {count} chips in the placement table serves all of them: split them over hosts.")
    lines.append("Each model's placement per TPU and chip count: docs/placements.md.")
    return "\n".join(lines)
