"""Which placement fits which chips, and how many weight bytes each placement moves per request.

Pure arithmetic on the catalog's per-component sizes; docs/placements.md's tables are computed from it,
never typed. On one chip it prefers whole, then resident, then CPU offload; a model no single chip holds
is sharded over the chips when each chip's share fits.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_demo.core.architectures import ARCHITECTURES
from tpu_demo.core.catalog import ModelSpec, Placement

#: Keep this share of device memory free for activations, the VAE decode and the compiler.
MEMORY_HEADROOM = 0.85

#: The chips of the placement table: name -> HBM one engine addresses, in GB (Cloud TPU's published
#: figures; a v7x chip's 192 GB is split between its 2 TensorCore devices, and an engine uses one device,
#: as torch-tpu's ``hardware.get_hbm_bytes_per_device`` counts it).
TPU_CHIPS: dict[str, float] = {"v5e": 16.0, "v6e": 32.0, "v5p": 95.0, "v7x": 96.0}
CHIP_COUNTS: tuple[int, ...] = (1, 4, 8)

#: Components that stay on the chip under the resident placement; text encoders stay on the host.
RESIDENT_COMPONENTS = ("transformer", "vae")


def tensor_parallel_components(spec: ModelSpec) -> tuple[str, ...]:
    """Components sharded over the chips: those with a TP plan in the real architecture, else the transformer."""
    architecture = ARCHITECTURES.get(spec.id)
    if architecture is None:
        return ("transformer",)
    return tuple(name for name, component in architecture.components.items() if component.tensor_parallel)


def resident_gb(spec: ModelSpec) -> float:
    return sum(spec.component_gb.get(name, 0.0) for name in RESIDENT_COMPONENTS)


def per_chip_gb(spec: ModelSpec, placement: Placement, chips: int = 1) -> float:
    """Weights one chip holds at the peak of a request under ``placement``."""
    if placement is Placement.WHOLE:
        return spec.total_gb
    if placement is Placement.RESIDENT:
        return resident_gb(spec)
    if placement is Placement.OFFLOAD:
        return spec.largest_component[1]
    sharded = tensor_parallel_components(spec)
    # sharded components split over the chips; the others are whole on every chip
    return sum(gb / chips if name in sharded else gb for name, gb in spec.component_gb.items())


def embedding_mb(spec: ModelSpec) -> float:
    """MB of prompt embeddings one request sends to the chip (bf16): the text tokens the
    transformer attends to, at its text width; doubled when classifier-free guidance doubles the batch."""
    architecture = ARCHITECTURES.get(spec.id)
    if architecture is None:
        return 0.0
    config = architecture.components["transformer"].config
    tokens = architecture.joint_text_tokens
    batch = 2 if spec.cfg_doubles_batch else 1
    return batch * tokens * int(config["joint_attention_dim"]) * 2 / 1e6


def weight_gb_moved_per_request(spec: ModelSpec, placement: Placement) -> float:
    """Weight bytes (GB) copied between host and chip per request: CPU offload moves every
    component onto the chip when it runs and back off when the next one runs; the others move
    none (the resident placement moves only the prompt embeddings, a few MB)."""
    return 2 * spec.total_gb if placement is Placement.OFFLOAD else 0.0


@dataclass(frozen=True)
class Serving:
    """How a host's chips serve one model: ``engines`` independent processes (one per chip,
    behind a balancer) of ``chips_per_engine`` chips each (more than one: tensor parallel)."""

    placement: Placement
    engines: int
    chips_per_engine: int

    def describe(self) -> str:
        if self.chips_per_engine > 1:
            return f"{self.placement.value} over {self.chips_per_engine} chips"
        return self.placement.value if self.engines == 1 else f"{self.placement.value}, one engine per chip"


def plan_serving(spec: ModelSpec, chip_gb: float, chips: int = 1) -> Serving | None:
    """How ``chips`` chips of ``chip_gb`` each serve ``spec``; None when nothing fits.

    A model that fits one chip (whole, else resident, else CPU offload) runs one engine per chip
    (``python app.py --chips all``: every chip serves visitors, no collective between them);
    one that does not is sharded over all the chips when the model supports it and each chip's
    share fits (one tensor-parallel group, ``--chips all`` starts it through scripts/serve_tp.sh).
    """
    usable = chip_gb * MEMORY_HEADROOM
    for placement in (Placement.WHOLE, Placement.RESIDENT, Placement.OFFLOAD):
        if placement in spec.placements and per_chip_gb(spec, placement) <= usable:
            return Serving(placement, chips, 1)
    if chips > 1 and Placement.TENSOR_PARALLEL in spec.placements:
        if per_chip_gb(spec, Placement.TENSOR_PARALLEL, chips) <= usable:
            return Serving(Placement.TENSOR_PARALLEL, 1, chips)
    return None


def plan_placement(spec: ModelSpec, chip_gb: float, chips: int = 1) -> Placement | None:
    """The placement each process gives ``spec`` on ``chips`` chips of ``chip_gb``; None when nothing fits."""
    serving = plan_serving(spec, chip_gb, chips)
    return None if serving is None else serving.placement


def placement_table(specs: list[ModelSpec]) -> str:
    """The markdown table of docs/placements.md: one row per chip count, how each model is served
    and the GB of weights it moves per request (CPU offload only)."""
    lines = ["| chips | " + " | ".join(spec.id for spec in specs) + " |", "|---" * (len(specs) + 1) + "|"]
    for chip, chip_gb in TPU_CHIPS.items():
        for count in CHIP_COUNTS:
            cells = []
            for spec in specs:
                serving = plan_serving(spec, chip_gb, count)
                moved = weight_gb_moved_per_request(spec, serving.placement) if serving else 0.0
                cells.append("does not fit" if serving is None else
                             f"{serving.describe()}, {moved:.0f} GB moved" if moved else serving.describe())
            lines.append(f"| {chip} ({chip_gb:.0f} GB) x {count} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def transfer_table(specs: list[ModelSpec]) -> str:
    """Per model and single-chip placement: what one request moves between host and chip, and on
    which chips that placement fits (markdown, for docs/placements.md)."""
    lines = ["| model | placement | moved per request | " + " | ".join(
        f"fits one {chip} ({gb:.0f} GB)" for chip, gb in TPU_CHIPS.items()) + " |", "|---" * (3 + len(TPU_CHIPS)) + "|"]
    for spec in specs:
        for placement in (Placement.WHOLE, Placement.RESIDENT, Placement.OFFLOAD):
            if placement not in spec.placements:
                continue
            if placement is Placement.OFFLOAD:
                moved = f"{weight_gb_moved_per_request(spec, placement):.0f} GB of weights (all, there and back)"
            elif placement is Placement.RESIDENT:
                moved = f"{embedding_mb(spec):.1f} MB of prompt embeddings (a cached prompt skips the encoders)"
            else:
                moved = "0"
            fits = ["yes" if per_chip_gb(spec, placement) <= gb * MEMORY_HEADROOM else "no"
                    for gb in TPU_CHIPS.values()]
            lines.append(f"| {spec.id} | {placement.value} ({per_chip_gb(spec, placement):.1f} GB on the chip) | "
                         f"{moved} | " + " | ".join(fits) + " |")
    return "\n".join(lines)
