"""Pick the tiny-shapes example prompts: keep only the candidates the shipped weights draw right.

Each candidate (a caption of the grammar, at a bucket) is drawn at seeds 0-7 with the model's
defaults and read by the strict judge; it is kept when every attribute is right at
``--min-right`` of the seeds or more, seed 0 among them (the seed of the README's example grid).
The first ``MAX_EXAMPLES`` kept lines (what the page lists) are written in the prompts-file format
(``caption | WIDTHxHEIGHT`` for a bucket other than the first).

``VARIED`` candidates leave attributes to the seed and are shown as four images: each is drawn through
the model's prompt upsampler (``language.json``) at seeds 0-7 and judged on the whole sentence it was
drawn as; it is kept when that is right at ``--min-right`` seeds and its first four seeds draw four
different sentences. They are listed first.

    python scripts/pick_examples.py [--varied-only] [--write assets/tiny_shapes_prompts.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from tiny_shapes.dataset import parse_caption  # noqa: E402
from tiny_shapes.judge import evaluate_pipeline  # noqa: E402
from tpu_demo.core.examples import MAX_EXAMPLES  # noqa: E402

MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "models" / "tiny-shapes"

#: (caption, bucket) candidates, in the order the page lists them: the first twelve (the page shows
#: at most MAX_EXAMPLES) are, per bucket, two single shapes and one two-shape scene; the rest are
#: kept in reserve for weights that miss some of them.
CANDIDATES = [
    ("a large red circle in the center on a white background", "64x64"),
    ("a small blue square at the top-left on a white background", "64x64"),
    ("a large red circle at the top-left and a small blue square at the bottom-right on a white background", "64x64"),
    ("a large white circle at the top-left on a gray background", "128x128"),
    ("a small red triangle at the bottom-right on a white background", "128x128"),
    ("a large blue circle at the top-right and a large red triangle at the bottom-left on a gray background",
     "128x128"),
    ("a large green triangle in the center on a black background", "96x64"),
    ("a small orange triangle at the top-right on a black background", "96x64"),
    ("a large orange triangle at the top-left and a large green circle at the bottom-right on a white background",
     "96x64"),
    ("a large yellow circle at the bottom-right on a black background", "64x96"),
    ("a large blue square at the top-right on a white background", "64x96"),
    ("a large purple triangle at the bottom-right and a small white square at the top-left on a black background",
     "64x96"),
    ("a large yellow triangle at the bottom-right on a black background", "64x64"),
    ("a small green circle at the top-right on a gray background", "64x64"),
    ("a large purple square at the bottom-left on a white background", "128x128"),
    ("a large yellow triangle at the bottom-left and a small purple circle at the top-right on a black background",
     "64x64"),
    ("a small green square in the center and a small orange triangle at the top-left on a white background", "128x128"),
    ("a small black circle at the top-right and a large yellow square at the bottom-left on a white background",
     "96x64"),
    ("a large red square at the top-left and a large blue circle at the bottom-right on a white background", "64x96"),
    ("a small yellow circle at the bottom-left on a gray background", "64x96"),
    ("a large blue circle in the center on a white background", "128x128"),
    ("a large green square at the top-left on a white background", "96x64"),
    ("a large blue square in the center on a gray background", "64x96"),
    ("a small red circle at the bottom-right on a white background", "64x96"),
    ("a large red triangle at the top-left on a white background", "64x96"),
    ("a large red circle at the top-left and a large blue square at the bottom-right on a white background", "96x64"),
    ("a large white triangle at the top-right and a small green circle at the bottom-left on a black background",
     "96x64"),
    ("a small yellow square at the top-left and a large red circle at the bottom-right on a gray background", "64x96"),
]


#: (prompt, bucket, images) that leave attributes to the seed: the page shows each as four images
VARIED = [
    ("a yellow triangle", "64x64", 4),
    ("a red circle and a blue square", "128x128", 4),
    ("a big green square on black", "96x64", 4),
    ("two purple circles", "64x96", 4),
]


def varied_line(pipe, language, defaults: dict, prompt: str, bucket: str, images: int, seeds: int,
                min_right: int) -> str | None:
    """The prompts-file line of a VARIED candidate, or None when the model misses it too often."""
    width, height = (int(v) for v in bucket.split("x"))
    drawn = [language.rewrite(prompt, seed).text for seed in range(seeds)]
    right = [evaluate_pipeline(pipe, [parse_caption(text)], seed=seed, size=(width, height),
                               **defaults)["results"][0]["all"] for seed, text in enumerate(drawn)]
    keep = sum(right) >= min_right and len(set(drawn[:images])) == images
    marks = "".join("+" if r else "-" for r in right)
    print(f"{sum(right)}/{seeds} {marks} {'kept' if keep else 'dropped'}: {prompt} | {bucket} | {images} images",
          flush=True)
    return f"{prompt} | {bucket} | {images} images" if keep else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MODEL_DIR)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--min-right", type=int, default=7)
    parser.add_argument("--write", type=Path, default=None, help="write the kept lines to this prompts file")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--varied-only", action="store_true", help="judge only the VARIED candidates")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(args.model, dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    defaults = json.loads((args.model / "demo_defaults.json").read_text())
    first_bucket = f"{defaults['width']}x{defaults['height']}"
    from tpu_demo.core.catalog import get_spec
    from tpu_demo.models.prompt_language import PromptLanguage

    language = PromptLanguage.load(args.model / get_spec("tiny-shapes").prompt_upsampler.language_file)
    kept = [line for prompt, bucket, images in VARIED
            if (line := varied_line(pipe, language, defaults, prompt, bucket, images, args.seeds, args.min_right))]
    for caption, bucket in [] if args.varied_only else CANDIDATES:
        width, height = (int(v) for v in bucket.split("x"))
        right = [evaluate_pipeline(pipe, [parse_caption(caption)], seed=seed, size=(width, height),
                                   **defaults)["results"][0]["all"] for seed in range(args.seeds)]
        keep = sum(right) >= args.min_right and right[0]  # seed 0 is what the README's grid shows
        marks = "".join("+" if r else "-" for r in right)
        print(f"{sum(right)}/{args.seeds} {marks} {'kept' if keep else 'dropped'}: {caption} | {bucket}", flush=True)
        if keep:
            kept.append(caption if bucket == first_bucket else f"{caption} | {bucket}")
    if args.write:  # the page lists the first MAX_EXAMPLES lines
        args.write.write_text("\n".join(kept[:MAX_EXAMPLES]) + "\n", encoding="utf-8")
        print(f"kept {len(kept)} of {len(CANDIDATES)}; wrote the first {len(kept[:MAX_EXAMPLES])} to {args.write}")


if __name__ == "__main__":
    main()
