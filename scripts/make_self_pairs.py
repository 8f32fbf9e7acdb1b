"""Draw self-pairs from a tiny-shapes pipeline (an experiment; tiny_shapes/self_pairs.py).

Left-out-attribute captions of training scenes are drawn from seeded starting noise; the images
the strict judge passes are kept as (noise, caption, the scene drawn), for
``train_tiny_model.py --self-pairs FILE``::

    python scripts/make_self_pairs.py --model /tmp/stage-a --output /tmp/pairs-64.pt --captions 3000
"""

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tiny_shapes import captions as shapes_captions  # noqa: E402
from tiny_shapes.dataset import sample_scene  # noqa: E402
from tiny_shapes.prompt_judge import judge_prompt  # noqa: E402
from tiny_shapes.self_pairs import drawn_scene, kept_prompt, repaired_scene  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--output", type=Path, required=True)
    p.add_argument("--captions", type=int, default=3000, help="left-out captions drawn (one noise each)")
    p.add_argument("--size", default="64x64")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--two-shape-prob", type=float, default=0.5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repair", action="store_true",
                   help="also keep images the judge failed, paired with the most prominent object of each named "
                        "colour (tiny_shapes.self_pairs.repaired_scene)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(args.model, dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    defaults = json.loads((args.model / "demo_defaults.json").read_text())
    call = {k: v for k, v in defaults.items() if k not in ("height", "width")}
    width, height = (int(v) for v in args.size.lower().split("x"))
    rng = random.Random(args.seed)
    prompts = []
    while len(prompts) < args.captions:  # left-out captions only: full_share 0
        prompts.append(shapes_captions.describe(sample_scene(rng, args.two_shape_prob), rng, full_share=0.0))
    channels = pipe.transformer.config.in_channels // 4
    kept_noise, kept, repaired = [], [], 0
    start = time.perf_counter()
    for b in range(0, len(prompts), args.batch):
        chunk = prompts[b:b + args.batch]
        generators = [torch.Generator("cpu").manual_seed(args.seed * 1_000_003 + b + i) for i in range(len(chunk))]
        noise, _ = pipe.prepare_latents(len(chunk), channels, height, width, torch.float32, "cpu", generators)
        kwargs = dict(call, negative_prompt=[call.get("negative_prompt", "")] * len(chunk))
        with torch.inference_mode():
            images = pipe(prompt=[p.text for p in chunk], latents=noise.clone(), width=width, height=height,
                          **kwargs).images
        for i, (prompt, image) in enumerate(zip(chunk, images)):
            result = judge_prompt(prompt, image)
            scene = None
            if result["all"]:
                scene = drawn_scene(prompt, result["layout"])
            elif args.repair:
                scene = repaired_scene(prompt, image)
                repaired += scene is not None
            if scene is not None:
                kept_noise.append(noise[i])
                kept.append(kept_prompt(prompt, scene))
        print(f"{b + len(chunk)} / {len(prompts)}: kept {len(kept)} ({time.perf_counter() - start:.0f} s)", flush=True)
    empty = torch.zeros((0, *noise.shape[1:]))
    record = {"size": (width, height), "noise": torch.stack(kept_noise) if kept else empty, "prompts": kept,
              "repaired": repaired,
              "model": str(args.model), "drawn": len(prompts), "seconds": time.perf_counter() - start}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    torch.save(record, args.output)
    singles = sum(len(p.scene.objects) == 1 for p in kept)
    print(json.dumps({"drawn": len(prompts), "kept": len(kept), "kept_single": singles, "repaired": repaired,
                      "seconds": round(record["seconds"], 1)}))


if __name__ == "__main__":
    main()
