"""The coupling of starting noise and left-out attributes (tiny_shapes.coupling): the noise
names exactly what a caption leaves out, stays a standard normal draw, and leaves named attributes
and the empty caption to plain noise."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from tiny_shapes import captions
from tiny_shapes.coupling import (FREE, coupled_noise, layout_alternatives, left_out_code, nearest_noise,
                                  pointed_layout, read_noise, region_masks)
from tiny_shapes.dataset import BACKGROUNDS, POSITION_NAMES, SIZES, Scene, ShapeSpec

GRIDS = [(8, 8), (16, 16), (8, 12), (12, 8)]  # the token grids of 64x64, 128x128, 96x64, 64x96


@pytest.mark.parametrize("rows, cols", GRIDS)
def test_the_five_regions_split_every_grid_and_sit_where_the_positions_are(rows, cols):
    regions = region_masks(rows, cols)
    assert regions.sum(0).eq(1).all()  # every token in exactly one region
    counts = regions.sum(1)
    assert counts[:4].eq(counts[0]).all() and counts[4] > 0  # four equal quadrants, a centre
    grid = regions.view(5, rows, cols)
    top_left = grid[POSITION_NAMES.index("top left")]
    assert top_left[0, 0] and not top_left[-1, -1]
    assert grid[POSITION_NAMES.index("center")][rows // 2, cols // 2]
    assert grid[POSITION_NAMES.index("bottom right")][-1, -1]


def test_plain_noise_names_each_position_size_and_background_equally_often():
    """The statistics are symmetric, so conditioning on a uniformly drawn layout keeps the noise a
    standard normal draw overall."""
    regions = region_masks(8, 8)
    noise = torch.randn(20000, 64, 16, generator=torch.Generator().manual_seed(0))
    for position in range(5):
        code = torch.tensor([position, FREE, FREE, FREE, FREE, FREE])
        assert abs(read_noise(noise, code, regions).float().mean().item() - 0.2) < 0.015, position
    large = torch.tensor([0, FREE, SIZES.index("large"), FREE, FREE, FREE])
    assert abs(read_noise(noise, large, regions).float().mean().item() - 0.1) < 0.01
    for background in range(3):
        code = torch.tensor([FREE, FREE, FREE, FREE, background, 0b111])
        assert abs(read_noise(noise, code, regions).float().mean().item() - 1 / 3) < 0.015


def test_the_coupled_noise_of_visitors_captions_names_what_they_leave_out():
    data = captions.generate(300, seed=3, two_shape_prob=0.5, jitter=(0,), full_share=0.3)
    codes = torch.from_numpy(np.stack([left_out_code(p.scene, p.named, p.background_named) for _, p in data]))
    assert (codes[:, 0] >= 0).any() and (codes[:, 2] >= 0).any() and (codes[:, 4] >= 0).any()
    regions = region_masks(8, 8)
    noise = coupled_noise(codes, (64, 16), regions, torch.Generator().manual_seed(1))
    assert all(read_noise(noise[i:i + 1], codes[i], regions).item() for i in range(len(codes)))
    assert abs(noise.mean().item()) < 0.01 and abs(noise.std().item() - 1) < 0.01
    # the same code twice: two different draws, both naming it (the seed still varies the rest)
    twice = coupled_noise(codes[:1].repeat(2, 1), (64, 16), regions, torch.Generator().manual_seed(2))
    assert not torch.equal(twice[0], twice[1])


def test_a_different_seed_names_a_different_layout_for_the_same_left_out_caption():
    """The point of it: at inference a left-out position is whatever the seed's noise names."""
    regions = region_masks(8, 8)
    named = []
    for seed in range(8):
        noise = torch.randn(1, 64, 16, generator=torch.Generator().manual_seed(seed))
        named.append(next(p for p in range(5) if read_noise(noise, torch.tensor([p, FREE, FREE, FREE, FREE, FREE]),
                                                            regions).item()))
    assert len(set(named)) >= 3, named


def test_named_attributes_and_fixed_sizes_are_never_coupled():
    red, blue = ShapeSpec("red", "circle", "center", "small"), ShapeSpec("blue", "square", "top left", "small")
    scene = Scene("white", (red, blue))
    everything = (frozenset({"size", "position"}),) * 2
    assert left_out_code(scene, everything, True).tolist() == [-2 - 4, -2 - 0, FREE, FREE, FREE, FREE]
    # sizes left out, but with an object in the centre both are small by rule: nothing to choose
    positions_only = (frozenset({"position"}),) * 2
    assert left_out_code(scene, positions_only, True)[2:4].tolist() == [FREE, FREE]
    # the background left out: only those neither object's colour rules out
    white = Scene("black", (ShapeSpec("white", "circle", "top left", "large"),))
    code = left_out_code(white, (frozenset({"size", "position"}),), False)
    assert code[4] == BACKGROUNDS.index("black") and code[5] == 0b110
    # nothing left out: the noise is exactly the plain draw of the same generator
    codes = torch.from_numpy(np.stack([left_out_code(scene, everything, True)] * 3))
    plain = torch.randn(3, 64, 16, generator=torch.Generator().manual_seed(4))
    coupled = coupled_noise(codes, (64, 16), region_masks(8, 8), torch.Generator().manual_seed(4))
    assert torch.equal(plain, coupled)


def test_a_left_out_position_avoids_the_other_objects_named_one():
    regions = region_masks(8, 8)
    rng = random.Random(0)
    for _ in range(20):
        first, second = rng.sample(range(5), 2)
        code = torch.tensor([first, -2 - second, FREE, FREE, FREE, FREE])
        noise = coupled_noise(code[None], (64, 16), regions, torch.Generator().manual_seed(rng.randrange(1000)))
        sums = torch.einsum("t,rt->r", noise[0, :, 0], regions.float()) / regions.sum(1).float().sqrt()
        sums[second] = float("-inf")
        assert sums.argmax().item() == first


@pytest.mark.parametrize("coupling", ["statistic", "nearest"])
def test_training_with_the_coupling_runs_and_is_reproducible(tmp_path, coupling):
    """A miniature fine-tune on visitors' words with --couple-left-out, twice with one seed."""
    from safetensors.numpy import load_file
    from test_tiny_shapes import MODEL_DIR, _train

    runs = [_train(tmp_path, f"{coupling}-{name}", 5, "--init-from", str(MODEL_DIR), "--extend-vocabulary",
                   "--captions", "varied", "--couple-left-out", coupling, "--binding-weight", "0")
            for name in ("a", "b")]
    a, b = (load_file(run / "transformer/diffusion_pytorch_model.safetensors") for run in runs)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    record = json.loads((runs[0] / "training.json").read_text())
    assert record["args"]["couple_left_out"] == coupling


def test_the_alternatives_change_only_what_a_caption_leaves_out_as_a_training_scene_allows():
    red = ShapeSpec("red", "circle", "top left", "large")
    blue = ShapeSpec("blue", "square", "bottom right", "large")
    size, both = frozenset({"size"}), frozenset({"size", "position"})
    single = Scene("white", (red,))
    moved = layout_alternatives(single, (size,), random.Random(0))
    assert sorted(s.objects[0].position for s in moved) == sorted(set(POSITION_NAMES) - {"top left"})
    assert all(s.objects[0].size == "large" and s.background == "white" for s in moved)
    assert {(s.objects[0].position, s.objects[0].size) for s in layout_alternatives(single, (frozenset(),),
                                                                                   random.Random(0))} == {
        (p, z) for p in POSITION_NAMES for z in SIZES} - {("top left", "large")}
    assert layout_alternatives(single, (both,), random.Random(0)) == []
    # two large shapes: never one in the centre; the named one stays where it is
    pair = Scene("white", (red, blue))
    moved = layout_alternatives(pair, (both, size), random.Random(0))
    assert {s.objects[1].position for s in moved} == {"top right", "bottom left"}
    assert all(s.objects[0] == red for s in moved)
    pairs = layout_alternatives(pair, (size, size), random.Random(0), limit=50)
    assert len(pairs) == 11 and all(len({o.position for o in s.objects}) == 2 for s in pairs)  # 4 * 3 - 1
    # a small shape may go to the centre once the other is small too
    assert any("center" in {o.position for o in s.objects}
               for s in layout_alternatives(pair, (frozenset(), frozenset()), random.Random(0), limit=100))
    assert len(layout_alternatives(pair, (size, size), random.Random(0), limit=7)) == 7


def test_nearest_noise_points_to_its_scene_and_stays_a_standard_normal_draw_overall():
    """Five layouts of one object (a bump of +2 on one of five token groups): the noise drawn for
    each points towards it more than towards the others, and over layouts drawn evenly it is N(0, 1)
    again."""
    layouts = torch.zeros(5, 20, 4)
    for k in range(5):
        layouts[k, 4 * k:4 * k + 4] = 2.0
    gen = torch.Generator().manual_seed(0)
    draws = []
    for k in range(5):
        order = [k] + [j for j in range(5) if j != k]
        for _ in range(400):
            noise = nearest_noise(layouts[order], gen)
            assert pointed_layout(noise[None], layouts).item() == k
            draws.append(noise)
    noise = torch.stack(draws)
    assert abs(noise.mean().item()) < 0.02 and abs(noise.std().item() - 1) < 0.02


def test_nearest_noise_gives_a_large_and_a_small_layout_about_the_same_share():
    """Plain L2 nearness would hand most noise to the layout of smaller norm (a small shape): the
    projection on unit directions splits it about evenly, so a seed picks either size."""
    layouts = torch.zeros(4, 20, 4)
    layouts[0, 0:2] = layouts[1, 10:12] = 2.0  # small at two places
    layouts[2, 0:6] = layouts[3, 10:16] = 2.0  # large at the same two
    noise = torch.randn(40000, 20, 4, generator=torch.Generator().manual_seed(0))
    shares = torch.bincount(pointed_layout(noise, layouts), minlength=4).float() / len(noise)
    assert (shares - 0.25).abs().max() < 0.05, shares
    by_distance = torch.cdist(noise.flatten(1), layouts.flatten(1)).argmin(1)
    nearest = torch.bincount(by_distance, minlength=4).float() / len(noise)
    assert nearest[:2].sum() > 0.7  # what the plain distance would have done
