"""The strict judge for captions in people's words: only what a caption names is checked.

A caption from :mod:`tiny_shapes.captions` may leave out the size, the position or the
background; the image then draws them as the seed chose. :func:`judge_prompt` checks every
attribute the caption names, with the same pixel readers as :mod:`tiny_shapes.judge` (``analyze``
for one shape, ``find_objects`` for two), and returns the ``layout`` it saw for what the caption
left open, so the variety over seeds can be counted (:func:`distinct_layouts`).
"""

from __future__ import annotations

import time

import numpy as np

from tiny_shapes.captions import Prompt
from tiny_shapes.dataset import layout as expected_layout
from tiny_shapes.judge import analyze, find_objects

#: Per-prompt metrics: each named attribute (right for every object), ``count`` (two shapes:
#: exactly two objects found), and ``all`` (everything named right).
NAMED_METRICS = ("background", "count", "colour", "shape", "size", "position", "all")


def judge_prompt(prompt: Prompt, image) -> dict:
    """``{metric: bool or None}`` (None: the caption does not name it) plus ``layout``: the seen
    (position, size) of each object and the background, for the attributes the caption leaves out."""
    if len(prompt.scene.objects) == 1:
        a = analyze(image)
        found = [a] if a.colour is not None else []
        background, count_right = a.background, True
    else:
        background, objects = find_objects(image)
        found = match_objects(prompt, objects, np.asarray(image).shape[1::-1])
        count_right = len(objects) == len(prompt.scene.objects)
    result: dict = {"background": background == prompt.scene.background if prompt.background_named else None,
                    "count": count_right if len(prompt.scene.objects) > 1 else None}
    for attribute in ("colour", "shape", "size", "position"):
        named = [i for i in range(len(prompt.scene.objects)) if prompt.names(i, attribute)]
        result[attribute] = None if not named else all(
            found[i] is not None and getattr(found[i], attribute) == getattr(prompt.scene.objects[i], attribute)
            for i in named) if len(found) == len(prompt.scene.objects) else False
    result["all"] = all(v for v in result.values() if v is not None)
    seen = []
    for i, obj in enumerate(found):
        for attribute in ("position", "size"):
            if not prompt.names(i, attribute):
                seen.append(getattr(obj, attribute, None) if obj is not None else None)
    if not prompt.background_named:
        seen.append(background)
    result["layout"] = tuple(seen)
    return result


def match_objects(prompt: Prompt, objects, size) -> list:
    """The found object for each of the caption's objects: the one of its colour (nearest to where
    the caption puts it, when it names a position), or None; each found object serves one."""
    taken: set[int] = set()
    out = []
    for i, obj in enumerate(prompt.scene.objects):
        candidates = [k for k, f in enumerate(objects) if f.colour == obj.colour and k not in taken]
        if not candidates:
            out.append(None)
            continue
        if prompt.names(i, "position"):
            x, y, _ = expected_layout(obj.position, obj.size, size)
            candidates.sort(key=lambda k: np.hypot(objects[k].centre[0] - x, objects[k].centre[1] - y))
        taken.add(candidates[0])
        out.append(objects[candidates[0]])
    return out


def distinct_layouts(results: list[dict]) -> int:
    """How many different layouts (of the attributes left out) a prompt's images show."""
    return len({r["layout"] for r in results})


def evaluate_prompts(pipe, prompts: list[Prompt], size: tuple[int, int], seeds: int = 1, seed: int = 0,
                     batch_size: int = 16, text=lambda p: p.text, upsample=None, **call_kwargs) -> dict:
    """Generate ``seeds`` images per prompt (seed ``seed + 1000 * k + i`` for prompt i, seed k) and
    judge them: accuracy per metric over the images where it applies, the mean number of distinct
    layouts per prompt over its seeds, and the per-image results. ``text`` renders a prompt's
    caption (e.g. in mixed letter case); ``upsample(text, seed)``, when given, rewrites it per image
    from that image's seed, as the app's prompt upsampler does."""
    import torch

    call = dict(call_kwargs, width=size[0], height=size[1])
    results: list[list[dict]] = [[] for _ in prompts]
    images: list[list] = [[] for _ in prompts]
    start = time.perf_counter()
    jobs = [(i, k) for k in range(seeds) for i in range(len(prompts))]
    for b in range(0, len(jobs), batch_size):
        chunk = jobs[b:b + batch_size]
        generators = [torch.Generator("cpu").manual_seed(seed + 1000 * k + i) for i, k in chunk]
        kwargs = dict(call)
        if isinstance(kwargs.get("negative_prompt"), str):
            kwargs["negative_prompt"] = [kwargs["negative_prompt"]] * len(chunk)
        texts = [text(prompts[i]) for i, _ in chunk]
        if upsample is not None:
            texts = [upsample(t, seed + 1000 * k + i) for t, (i, k) in zip(texts, chunk)]
        out = pipe(prompt=texts, generator=generators, **kwargs).images
        for (i, _), image in zip(chunk, out):
            results[i].append(judge_prompt(prompts[i], image))
            images[i].append(image)
    flat = [r for rs in results for r in rs]
    accuracy = {}
    for metric in ("background", "count", "colour", "shape", "size", "position", "all"):
        values = [r[metric] for r in flat if r[metric] is not None]
        accuracy[metric] = float(np.mean(values)) if values else None
    return {"accuracy": accuracy, "n": len(flat), "prompts": len(prompts), "seconds": time.perf_counter() - start,
            "distinct": [distinct_layouts(rs) for rs in results], "results": results, "images": images}
