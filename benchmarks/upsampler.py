"""What the prompt upsampler costs: the rewrite alone, and a whole request with it on against off.

    python -m benchmarks.upsampler [--json benchmarks/results/upsampler-cpu-DATE.json]

1. The rewrite (``PromptLanguage.rewrite``) of every prompt of the project's phrasing sets (held-out
   phrasings, left-out attributes, each also in mixed letter case) at 8 seeds: milliseconds per image.
2. Requests of 4 images of tiny-shapes through an engine (eager, 64x64, the model's steps and
   guidance), upsampler on against off, interleaved pairs, with a fully specified sentence of the
   grammar (the upsampler gives the same sentence back, so the pipeline work is identical and the
   difference is the upsampler's). Measured inside the engine, not as a visitor waits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.measure import interleaved_pairs  # noqa: E402

SENTENCE = "a large red circle at the top-left and a small blue square at the bottom-right on a white background"


def rewrite_times(seeds: int = 8) -> dict:
    from tiny_shapes import captions, phrasing_evaluation
    from tpu_demo.core.catalog import get_spec
    from tpu_demo.models.prompt_language import PromptLanguage

    language = PromptLanguage.load(get_spec("tiny-shapes").language_path)
    texts = [p.text for prompts in phrasing_evaluation.prompt_sets().values() for p in prompts]
    texts += [captions.mixed_case(t, seed=i) for i, t in enumerate(texts)]
    times = []
    for text in texts:
        for seed in range(seeds):
            started = time.perf_counter()
            language.rewrite(text, seed)
            times.append(1000 * (time.perf_counter() - started))
    times.sort()
    return {"rewrites": len(times), "ms_median": round(statistics.median(times), 4),
            "ms_p95": round(times[int(0.95 * len(times))], 4), "ms_max": round(times[-1], 4),
            "ms_per_request_of_4_images_p95": round(4 * times[int(0.95 * len(times))], 4)}


def request_ratio(models_dir: Path, pairs: int) -> dict:
    from tpu_demo.core.events import ImageResult
    from tpu_demo.core.request import validate_request
    from tpu_demo.device import detect_device
    from tpu_demo.engine.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(models_dir=models_dir, offered_models=("tiny-shapes",)), detect_device())
    try:
        def run(upsample: bool) -> None:
            request = validate_request(dict(prompt=SENTENCE, model="tiny-shapes", mode="eager", resolution="64x64",
                                            num_images=4, previews=False, upsample_prompt=upsample))
            assert sum(isinstance(e, ImageResult) for e in engine.generate(request)) == 4

        run(True), run(False)  # loaded and warm
        summary = interleaved_pairs(lambda: run(True), lambda: run(False), pairs).summary()
        return {key: summary[key] for key in ("pairs", "ratio", "best_ratio", "median_a_ms", "median_b_ms",
                                               "median_extra_ms")}  # a: upsampler on, b: off
    finally:
        engine.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", type=Path, default=Path.home() / ".cache" / "tpu-demo" / "models")
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    record = {"rewrite": rewrite_times(), "request": request_ratio(args.models_dir, args.pairs)}
    print(json.dumps(record, indent=1))
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
