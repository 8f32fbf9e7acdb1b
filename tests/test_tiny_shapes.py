"""The shapes dataset, the shipped tiny-shapes model and a slice of its evaluation."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from tpu_demo import shapes_dataset as sd
from tpu_demo.shapes_eval import METRICS, TARGETS, analyze, evaluate_pipeline, score

MODEL_DIR = Path(__file__).resolve().parents[1] / "assets" / "models" / "tiny-shapes"
PROMPTS_FILE = Path(__file__).resolve().parents[1] / "assets" / "tiny_shapes_prompts.txt"


def test_generator_is_deterministic():
    a, b, c = sd.generate(50, seed=3), sd.generate(50, seed=3), sd.generate(50, seed=4)
    assert [x[1] for x in a] == [x[1] for x in b]
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(a, b))
    assert [x[1] for x in a] != [x[1] for x in c]
    assert a[0][0].shape == (64, 64, 3) and a[0][0].dtype == np.uint8


def test_captions_match_pixels():
    checked = 0
    for image, caption, scene in sd.generate(400, seed=11):
        assert sd.parse_caption(caption) == scene
        assert set(caption.split()) <= set(sd.VOCABULARY)
        if len(scene.objects) == 1:
            result = score(scene, analyze(image))
            assert all(result.values()), (caption, result)
            checked += 1
    assert checked > 200


def test_held_out_never_in_training():
    held = sd.held_out_prompts()
    assert len(held) >= 100
    assert len({s.caption for s in held}) == len(held)
    for _, caption, scene in sd.generate(3000, seed=0):
        assert not any(sd.is_held_out(o.colour, o.shape, o.position) for o in scene.objects), caption
    # Every held-out scene is drawn as its caption says.
    for scene in held:
        assert all(score(scene, analyze(sd.render(scene))).values())


@pytest.fixture(scope="module")
def shipped_pipeline():
    import torch
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(MODEL_DIR, dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_shipped_files():
    files = [p for p in MODEL_DIR.rglob("*") if p.is_file()]
    weights = [p for p in files if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".safetensors")]
    assert weights and all(p.suffix == ".safetensors" for p in weights)
    assert sum(p.stat().st_size for p in files) <= 15 * 1024 * 1024
    defaults = json.loads((MODEL_DIR / "demo_defaults.json").read_text())
    assert defaults["height"] == defaults["width"] == 64
    prompts = [line for line in PROMPTS_FILE.read_text().splitlines() if line.strip()]
    assert prompts
    for prompt in prompts:
        sd.parse_caption(prompt)  # within the grammar and vocabulary


def test_shipped_model_loads_and_draws(shipped_pipeline):
    import torch

    defaults = json.loads((MODEL_DIR / "demo_defaults.json").read_text())
    out = shipped_pipeline(prompt="a large blue square in the center on a white background",
                           generator=torch.Generator("cpu").manual_seed(0), **defaults)
    image = out.images[0]
    assert image.size == (64, 64)
    assert np.asarray(image).std() > 5  # not a flat image
    assert analyze(image).background == "white"


@pytest.fixture(scope="module")
def held_out_subset_result(shipped_pipeline):
    defaults = json.loads((MODEL_DIR / "demo_defaults.json").read_text())
    held = sd.held_out_prompts()
    subset = held[:: len(held) // 12][:12]
    return subset, evaluate_pipeline(shipped_pipeline, subset, seed=0, batch_size=12, **defaults)


#: What the shipped model reliably gets right on held-out prompts (see docs/tiny-shapes.md).
REACHED = ("background", "position")


def test_held_out_subset_beats_chance(held_out_subset_result):
    subset, result = held_out_subset_result
    accuracy = result["accuracy"]
    assert set(accuracy) == set(METRICS)
    for metric in REACHED:
        assert accuracy[metric] >= TARGETS[metric] - 0.1, (metric, accuracy)
    # Colour is well above chance (12.5%; the phase-3 model gets 75% on this slice, 80.9% on all 110);
    # shape is not reliably above chance (33%) on 12 prompts (see the xfail below).
    assert accuracy["colour"] >= 0.5, accuracy


@pytest.mark.xfail(reason="the shipped model is below the colour and shape targets (docs/tiny-shapes.md)",
                   strict=False)
def test_held_out_subset_meets_targets(held_out_subset_result):
    subset, result = held_out_subset_result
    accuracy = result["accuracy"]
    for metric, target in TARGETS.items():
        assert accuracy[metric] >= target, (metric, accuracy)
