"""Self-pairs (tiny_shapes/self_pairs.py, scripts/make_self_pairs.py, an experiment): the scene a
judged image drew is rebuilt only when training could draw it, the real script writes pairs from a
real pipeline, and training uses each pair's own noise (never for the empty caption)."""

from __future__ import annotations

import random
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import torch

from tiny_shapes import captions
from tiny_shapes.flow_training import bucket_batch
from tiny_shapes.dataset import Scene, ShapeSpec, is_held_out
from tiny_shapes.self_pairs import drawn_scene, is_trainable

ROOT = Path(__file__).resolve().parents[1]


def _prompt(scene: Scene, named, background_named: bool) -> captions.Prompt:
    return captions.describe(scene, random.Random(0), named=named, background_named=background_named, stray_word=0)


def _trainable_colour(shape: str, position: str, background: str) -> str:
    return next(c for c in ("red", "green", "blue", "yellow", "orange", "purple")
                if c != background and not is_held_out(c, shape, position))


def test_the_judged_layout_fills_in_exactly_what_the_caption_left_out():
    colour = _trainable_colour("circle", "top left", "white")
    prompt = _prompt(Scene("gray", (ShapeSpec(colour, "circle", "center", "small"),)), (frozenset(),), False)
    scene = drawn_scene(prompt, ("top left", "large", "white"))  # order: position, size, then background
    assert scene == Scene("white", (ShapeSpec(colour, "circle", "top left", "large"),))
    # a named size stays the caption's, whatever was read for the rest
    named_size = _prompt(Scene("gray", (ShapeSpec(colour, "circle", "center", "small"),)), (frozenset({"size"}),), True)
    assert drawn_scene(named_size, ("top left",)) == Scene("gray", (ShapeSpec(colour, "circle", "top left", "small"),))


def test_readings_training_could_not_draw_are_refused():
    red_sq = ShapeSpec(_trainable_colour("square", "top right", "white"), "square", "top right", "small")
    two = _prompt(Scene("white", (red_sq, ShapeSpec("blue", "circle", "bottom left", "small"))),
                  (frozenset({"size"}), frozenset({"size"})), True)
    assert drawn_scene(two, ("top right", "top right")) is None  # two objects at one place
    assert drawn_scene(two, (None, "bottom left")) is None  # the judge did not find a place
    held = next((c, s, p) for c in ("red", "green", "blue") for s in ("circle", "square") for p in ("center", "top left")
                if is_held_out(c, s, p))
    single = _prompt(Scene("white", (ShapeSpec(held[0], held[1], "bottom right", "small"),)),
                     (frozenset({"size"}),), True)
    assert not is_trainable(Scene("white", (ShapeSpec(held[0], held[1], held[2], "small"),)))
    assert drawn_scene(single, (held[2],)) is None  # the evaluation's triples never reach training
    big_beside_centre = Scene("white", (ShapeSpec("red", "circle", "center", "small"),
                                        ShapeSpec("blue", "square", "top left", "large")))
    assert not is_trainable(big_beside_centre)
    assert not is_trainable(Scene("red", (red_sq,)))  # not a background


def test_a_pairs_noise_is_what_training_starts_its_scene_from():
    count, first, tokens, channels = 6, 4, 4, 3
    bucket = dict(batch=64, packed=torch.arange(count, dtype=torch.float32).view(count, 1, 1).expand(count, tokens, channels),
                  rows=torch.arange(1, count + 1), token_weights=torch.ones(count, tokens), img_ids=None,
                  fixed_from=first, fixed_noise=100 + torch.randn(count - first, tokens, channels))
    args = Namespace(caption_dropout=0.2, timestep_sampling="uniform")
    mb = bucket_batch(bucket, args, torch.linspace(0.1, 1, 10), torch.Generator().manual_seed(0))
    seen_pair = seen_dropped = False
    for x0, row, noise in zip(mb["x0"], mb["rows"], mb["noise"]):
        index = int(x0[0, 0])
        if index >= first and row:
            assert torch.equal(noise, bucket["fixed_noise"][index - first])
            seen_pair = True
        else:  # regular scenes, and a pair whose caption was dropped: a fresh standard normal draw
            assert noise.abs().max() < 50
            seen_dropped |= index >= first
    assert seen_pair and seen_dropped


def test_the_script_writes_pairs_a_training_run_reads(tmp_path):
    """The real script on the shipped pipeline, then a miniature fine-tune on what it wrote."""
    from test_tiny_shapes import MODEL_DIR, _train

    pairs = tmp_path / "pairs.pt"
    run = subprocess.run([sys.executable, "scripts/make_self_pairs.py", "--model", str(MODEL_DIR), "--output", str(pairs),
                          "--captions", "48", "--batch", "16", "--threads", "1", "--two-shape-prob", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    record = torch.load(pairs, weights_only=False)
    assert record["drawn"] == 48 and len(record["prompts"]) == len(record["noise"])
    assert all(is_trainable(p.scene) for p in record["prompts"])
    if not record["prompts"]:  # the shipped weights rarely get a left-out caption right: give the run one pair
        prompt = captions.describe(Scene("white", (ShapeSpec("red", "circle", "top right", "small"),)),
                                   random.Random(1), named=(frozenset(),), background_named=True, stray_word=0)
        record = dict(record, prompts=[prompt], noise=torch.randn(1, 64, 16))
        torch.save(record, pairs)
    out = _train(tmp_path, "with-pairs", 5, "--init-from", str(MODEL_DIR), "--extend-vocabulary", "--captions",
                 "varied", "--self-pairs", str(pairs), "--self-pair-repeat", "3", "--binding-weight", "0")
    assert (out / "transformer/diffusion_pytorch_model.safetensors").is_file()


def test_copies_are_repaired_to_the_most_prominent_one():
    """An image with a large and a small copy of "a red circle": the pair's scene is the large one alone."""
    from tiny_shapes.dataset import render
    from tiny_shapes.self_pairs import repaired_scene

    colour = next(c for c in ("red", "green", "blue", "yellow", "orange", "purple")
                  if not is_held_out(c, "circle", "bottom right") and not is_held_out(c, "circle", "top left"))
    large, small = (ShapeSpec(colour, "circle", "bottom right", "large"), ShapeSpec(colour, "circle", "top left", "small"))
    image = render(Scene("gray", (small, large)))
    prompt = _prompt(Scene("white", (ShapeSpec(colour, "circle", "center", "small"),)), (frozenset(),), False)
    assert repaired_scene(prompt, image) == Scene("gray", (large,))
    # a named position decides among the copies; a colour not drawn at all repairs nothing
    named = _prompt(Scene("gray", (ShapeSpec(colour, "circle", "top left", "large"),)), (frozenset({"position"}),), True)
    assert repaired_scene(named, image) == Scene("gray", (ShapeSpec(colour, "circle", "top left", "small"),))
    other = next(c for c in ("blue", "green", "yellow") if c != colour)
    missing = _prompt(Scene("gray", (ShapeSpec(other, "circle", "center", "small"),)), (frozenset(),), False)
    assert repaired_scene(missing, image) is None
