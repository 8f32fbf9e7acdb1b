"""Render the tiny-shapes example prompts (assets/tiny_shapes_prompts.txt) into a captioned grid.

Each example is drawn at its bucket (a line may end with ``| WIDTHxHEIGHT``; else the first bucket),
scaled to fit a tile.

    python scripts/example_grid.py [--output assets/tiny_shapes_examples.png] [--seed 0]

The README shows the result; rerun it whenever the shipped weights change.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from PIL import Image, ImageDraw, ImageFont  # noqa: E402

from tpu_demo.core.catalog import ASSETS_DIR, get_spec  # noqa: E402
from tpu_demo.device import detect_device  # noqa: E402
from tpu_demo.models.loading import load_pipeline  # noqa: E402
from tpu_demo.core.examples import example_rows  # noqa: E402

TILE, CAPTION, COLUMNS = 128, 80, 4  # a two-shape caption wraps to six lines of 11 px


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ASSETS_DIR / "tiny_shapes_examples.png")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = get_spec("tiny-shapes")
    pipeline = load_pipeline(spec, detect_device("cpu"), ASSETS_DIR.parent / ".cache" / "models")
    examples = example_rows(spec)
    rows = (len(examples) + COLUMNS - 1) // COLUMNS
    grid = Image.new("RGB", (COLUMNS * TILE, rows * (TILE + CAPTION)), "white")
    draw, font = ImageDraw.Draw(grid), ImageFont.load_default()
    for index, (prompt, resolution, _) in enumerate(examples):  # (prompt, bucket, number of images)
        width, height = (int(v) for v in resolution.split("x"))
        image = pipeline(prompt=prompt, height=height, width=width, num_inference_steps=spec.default_steps,
                         generator=torch.Generator("cpu").manual_seed(args.seed),
                         **spec.pipeline_kwargs(spec.default_guidance)).images[0]
        x, y = (index % COLUMNS) * TILE, (index // COLUMNS) * (TILE + CAPTION)
        scale = TILE / max(width, height)
        fitted = image.resize((round(width * scale), round(height * scale)), Image.Resampling.NEAREST)
        grid.paste(fitted, (x + (TILE - fitted.width) // 2, y + (TILE - fitted.height) // 2))
        caption = "\n".join(textwrap.wrap(f"{prompt.removeprefix('a ')} [{resolution}]", 24))
        draw.multiline_text((x + 3, y + TILE + 2), caption, fill="black", font=font, spacing=1)
    grid.save(args.output)
    print(f"wrote {args.output} ({len(examples)} prompts, seed {args.seed})")


if __name__ == "__main__":
    main()
