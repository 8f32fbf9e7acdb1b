"""Write docs/placements.md from the code that decides placements; a test checks it is current.

    python scripts/placements_doc.py

Every other page that needs a placement links here instead of stating it: a table typed by
hand in three docs drifted into three answers (FLUX.1-schnell on one v6e: offload, "offload or
2 chips", resident), while the app chose resident.
"""

import sys
from itertools import combinations
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tpu_demo.core.catalog import CATALOG, REAL_MODEL_IDS  # noqa: E402
from tpu_demo.launch.chips import ChipsError, Host, plan_chips  # noqa: E402
from tpu_demo.models.placement_plan import (CHIP_COUNTS, MEMORY_HEADROOM, TPU_CHIPS,  # noqa: E402
                                            placement_table, transfer_table)

HEADER = """# Placements

For an operator sizing a TPU host: how each real model is placed on each chip and chip count, and
what one request moves. Generated from the code that decides (`tpu_demo/models/placement_plan.py`,
fed by the catalog's per-component sizes) by `python scripts/placements_doc.py`; a test fails when it
is out of date. Computed from weights, not measured on chips.

The rules: a chip keeps {headroom:.0%} of its memory free. On one chip the first placement that fits
wins: **whole**, then **resident** (text encoders on the host, prompt embeddings cached), then
**offload** (`enable_model_cpu_offload()`). On several chips, a model that fits one chip runs **one
engine per chip** behind one balancer; one that fits no chip is sharded over all of them
(**tensor-parallel**, `scripts/serve_tp.sh N`) when each share fits, a component without a
tensor-parallel plan (FLUX.1's T5 and CLIP, every VAE) whole on each chip. `--placement` overrides it.

## Placement each model gets

HBM one engine addresses: {hbm} (Cloud TPU's published figures; a v7x chip's 192 GB is shared by
its two TensorCore devices, and one engine uses one device, as torch-tpu's
`hardware.get_hbm_bytes_per_device` counts it).

"""

TRANSFER = """

## What one request moves

Per single-chip placement (bf16). CPU offload copies every component onto the chip when it runs
and off again afterwards: for FLUX.1-schnell that is 67 GB per request, seconds on a TPU host's PCIe
link and more than its 4 denoising steps. The resident placement sends only the prompt embeddings.

"""


CHIPS_ALL = """

## What `--chips all` does with several models offered

`python app.py --chips all --models <ids>` on each host of the table (`tpu_demo/launch/chips.py`): it
serves every offered model, or refuses at start with one message naming each model it cannot serve
there and the options (fewer models, tensor parallel over more chips, another host). It never leaves
a model out. `python app.py --check --chips all` prints the same verdict before any weights are loaded.

"""


def chips_all_table() -> str:
    """One row per host, one column per set of offered real models: the layout ``--chips all`` starts, or
    the models it refuses to start without."""
    offered = [models for size in range(2, len(REAL_MODEL_IDS) + 1) for models in combinations(REAL_MODEL_IDS, size)]
    lines = ["| host | " + " | ".join(" + ".join(models) for models in offered) + " |", "|---" * (len(offered) + 1) + "|"]
    for chip, gb in TPU_CHIPS.items():
        for count in CHIP_COUNTS:
            cells = []
            for models in offered:
                try:
                    cells.append(plan_chips("all", Host("tpu", count, f"TPU {chip}", gb), models).layout)
                except ChipsError as error:
                    refused = [line[2:].split(":")[0] for line in str(error).splitlines() if line.startswith("- ")]
                    cells.append(f"refused: {', '.join(refused)}")
            lines.append(f"| {chip} x {count} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render() -> str:
    specs = [CATALOG[model] for model in REAL_MODEL_IDS]
    hbm = ", ".join(f"{chip} {gb:.0f} GB" for chip, gb in TPU_CHIPS.items())
    return (HEADER.format(headroom=1 - MEMORY_HEADROOM, hbm=hbm) + placement_table(specs) + CHIPS_ALL
            + chips_all_table() + TRANSFER + transfer_table(specs) + "\n")


if __name__ == "__main__":
    (ROOT / "docs" / "placements.md").write_text(render(), encoding="utf-8")
