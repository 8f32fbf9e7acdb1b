"""The tiny-shapes model on people's words: held-out phrasings, left-out attributes, mixed letter case.

Run by ``scripts/evaluate_tiny_model.py`` for ``--kinds phrased,left-out,mixed-case`` (its
default runs them all: one command for every figure of the README's tables). Every prompt is
built from held-out (colour, shape, position) triples, so no training scene contains its objects:

- phrased: every attribute named, written with :data:`tiny_shapes.captions.HELD_OUT_TEMPLATES`
  (phrasings no training caption uses); 110 single-shape and 100 two-shape prompts;
- left-out: size, position and/or background left out (:data:`tiny_shapes.captions.LEFT_OUT_KINDS`
  in turn), ``SEEDS`` seeds each; the named attributes are judged, and the distinct layouts of what
  is left out are counted per prompt (the variety figure counts prompts that leave out the
  position, whose five values let eight seeds differ);
- mixed-case: the phrased prompts and the left-out ones at their first two seeds again, each word
  in lower, Title, UPPER or mixed case, beside the lower-case figures of exactly those images.
"""

from __future__ import annotations

import numpy as np

from tiny_shapes import captions, dataset
from tiny_shapes.prompt_judge import NAMED_METRICS, evaluate_prompts

SEEDS = 8
#: the row of the trained weights read through the app's prompt upsampler
UPSAMPLED = "trained + upsampler"
#: Targets for people's words (all named attributes right; variety: mean distinct layouts over SEEDS seeds).
TARGETS = {"phrased single": 0.95, "phrased two": 0.85, "left-out": 0.95, "variety": 5.0, "mixed-case gap": 0.02}
#: Chance of one attribute for a uniformly random scene of the grammar.
ATTRIBUTE_CHANCE = {"colour": 1 / 8, "shape": 1 / 3, "size": 1 / 2, "position": 1 / 5, "background": 1 / 3}


def prompt_sets() -> dict[str, list[captions.Prompt]]:
    single, two = dataset.held_out_prompts(), dataset.held_out_two_shape_prompts()
    spread = dataset._spread  # noqa: SLF001 (the dataset's own even spread)
    return {
        "phrased single": captions.held_out_phrasings(single, seed=1),
        "phrased two": captions.held_out_phrasings(two, seed=2),
        "left-out single": captions.left_out_prompts(spread(single, 36), seed=3),
        "left-out two": captions.left_out_prompts(spread(two, 24), seed=4),
    }


def chance(prompt: captions.Prompt) -> float:
    """Chance that a uniformly random scene gets every attribute ``prompt`` names right."""
    p = ATTRIBUTE_CHANCE["background"] if prompt.background_named else 1.0
    for i in range(len(prompt.scene.objects)):
        for attribute in ("colour", "shape", "size", "position"):
            if prompt.names(i, attribute):
                p *= ATTRIBUTE_CHANCE[attribute]
    return p


def variety(result: dict, prompts: list[captions.Prompt]) -> float | None:
    """Mean distinct layouts per prompt among the prompts that leave out a position."""
    counts = [d for d, p in zip(result["distinct"], prompts) if not p.names(0, "position")]
    return float(np.mean(counts)) if counts else None


def run(models: dict, kinds: list[str], buckets: list[tuple[int, int]], kwargs: dict,
        upsample=None, without: bool = True) -> tuple[str, dict, bool]:
    """Evaluate ``models`` (name -> pipeline; "trained" is held to the targets) on ``kinds``.
    ``upsample(text, seed)``: the app's prompt upsampler; the trained weights are then evaluated
    with it ("trained + upsampler", held to the targets) and, unless ``without`` is False, without
    it ("trained", the model's own). Returns a markdown report, a JSON-able record and whether every
    target is met."""
    if upsample is not None and "trained" in models:
        plain = {"trained": models["trained"]} if without else {}
        models = {**plain, UPSAMPLED: models["trained"], **{k: v for k, v in models.items() if k != "trained"}}
    held = UPSAMPLED if upsample is not None else "trained"
    sets = prompt_sets()
    lines, record, passed = [], {}, True
    for width, height in buckets:
        size = (width, height)
        rows = []
        for name, pipe in models.items():
            for set_name, prompts in sets.items():
                if set_name.split()[0] not in kinds:
                    continue
                seeds = SEEDS if set_name.startswith("left-out") else 1
                rewrite = upsample if name == UPSAMPLED else None
                result = evaluate_prompts(pipe, prompts, size, seeds=seeds, upsample=rewrite, **kwargs)
                acc = result["accuracy"]
                record[f"{set_name} {width}x{height} {name}"] = {
                    "accuracy": acc, "n": result["n"], "seconds": result["seconds"],
                    "variety": variety(result, prompts), "distinct": result["distinct"]}
                rows.append((f"{set_name}, {name}", acc, result["n"], variety(result, prompts)))
                if name == held:
                    target = TARGETS.get(set_name, TARGETS["left-out"])
                    passed &= acc["all"] >= target
                    if set_name.startswith("left-out"):
                        passed &= (variety(result, prompts) or 0) >= TARGETS["variety"]
                if name == held and "mixed-case" in kinds:
                    first = (lambda r: r) if seeds == 1 else (lambda r: r[:2])
                    mixed = evaluate_prompts(pipe, prompts, size, seeds=min(seeds, 2),
                                             text=lambda p: captions.mixed_case(p.text, seed=hash_text(p.text)),
                                             upsample=rewrite, **kwargs)
                    lower = [r for rs in result["results"] for r in first(rs)]
                    lower_all = float(np.mean([r["all"] for r in lower]))
                    gap = abs(mixed["accuracy"]["all"] - lower_all)
                    passed &= gap <= TARGETS["mixed-case gap"]
                    record[f"{set_name} {width}x{height} {name} mixed case"] = {
                        "accuracy": mixed["accuracy"], "n": mixed["n"], "lower_case_all": lower_all, "gap": gap}
                    rows.append((f"{set_name}, mixed case (lower case: {100 * lower_all:.1f}%)",
                                 mixed["accuracy"], mixed["n"], None))
            if name == held:
                for set_name, prompts in sets.items():
                    if set_name.split()[0] in kinds:
                        rows.append((f"{set_name}, chance", {"all": float(np.mean([chance(p) for p in prompts]))},
                                     len(prompts), None))
        lines.append(f"\n{width}x{height}: named attributes right (all = every named attribute of every object)")
        lines.append(_table(rows))
    return "\n".join(lines), record, passed


def hash_text(text: str) -> int:
    """A stable seed from a caption (Python's ``hash`` of a str changes per process)."""
    return sum((i + 1) * ord(c) for i, c in enumerate(text)) % 100003


def _table(rows) -> str:
    out = ["| prompts | n | " + " | ".join(NAMED_METRICS) + " | distinct layouts (of 8 seeds) |",
           "|---" * (len(NAMED_METRICS) + 3) + "|"]
    for label, acc, n, distinct in rows:
        cells = ["-" if acc.get(m) is None else f"{100 * acc[m]:.1f}%" for m in NAMED_METRICS]
        out.append(f"| {label} | {n} | " + " | ".join(cells) + f" | {'-' if distinct is None else f'{distinct:.2f}'} |")
    return "\n".join(out)
