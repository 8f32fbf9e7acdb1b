"""Write docs/placements.md from the code that decides placements; a test checks it is current.

    python scripts/placements_doc.py

Every other page that needs a placement links here instead of stating it: a table typed by
hand in three docs drifted into three answers (FLUX.1-schnell on one v6e: offload, "offload or
2 chips", resident), while the app chose resident.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tpu_demo.core.catalog import CATALOG, REAL_MODEL_IDS  # noqa: E402
from tpu_demo.models.placement_plan import (MEMORY_HEADROOM, placement_table,  # noqa: E402
                                            transfer_table)

HEADER = """# Placements

For an operator sizing a TPU host: how each real model of the catalog is placed on each chip and
chip count, and what one request moves between host and chip. This page is generated from the code
that makes the decision (`tpu_demo/models/placement_plan.py`, fed by the catalog's per-component
sizes, which `tests/test_placement_plan.py` checks against the real architectures within 3%) by
`python scripts/placements_doc.py`, and a test fails when it is out of date. Other pages link here
rather than repeat it.

The rules: a chip keeps {headroom:.0%} of its memory free for activations, the VAE decode and the
compiler. On one chip the first placement that fits wins: **whole** (every component on the chip),
then **resident** (transformer and VAE on the chip, text encoders on the host with cached prompt
embeddings), then **offload** (`enable_model_cpu_offload()`: each component on the chip only while it
runs). On a host with several chips, a model that fits one chip runs **one engine per chip**: independent
processes, each pinned to its chip, behind one balancer, so every chip serves visitors and no
collective joins them. A model that fits no single chip is sharded over all of them (**tensor-parallel**,
one process per chip in one group, `scripts/serve_tp.sh N`), when each chip's share fits; a component
without a tensor-parallel plan (FLUX.1's T5 and CLIP, every VAE) is whole on each chip.
`--placement` overrides the choice.

These are computed from weights, not measured on chips (no TPU has run this app yet).

## Placement each model gets

HBM per chip: v5e 16 GB, v6e 32 GB, v5p 95 GB (Cloud TPU's published figures).

"""

TRANSFER = """

## What one request moves

Per single-chip placement (bf16). CPU offload copies every component onto the chip when it runs
and off again afterwards: for FLUX.1-schnell that is 67 GB per request, seconds on a TPU host's PCIe
link and more than its 4 denoising steps. The resident placement sends only the prompt embeddings.

"""


def render() -> str:
    specs = [CATALOG[model] for model in REAL_MODEL_IDS]
    return (HEADER.format(headroom=1 - MEMORY_HEADROOM) + placement_table(specs) + TRANSFER
            + transfer_table(specs) + "\n")


if __name__ == "__main__":
    (ROOT / "docs" / "placements.md").write_text(render(), encoding="utf-8")
