"""The shapes dataset, the shipped tiny-shapes model and a slice of its evaluation."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

from tiny_shapes import captions, dataset as sd
from tpu_demo.core.vocabulary import load_vocabulary
from tpu_demo.core.catalog import get_spec
from tiny_shapes.judge import (METRICS, TARGETS, TWO_SHAPE_METRICS, analyze, evaluate_pipeline, find_objects,
                               judge_image, score)

MODEL_DIR = Path(__file__).resolve().parents[1] / "assets" / "models" / "tiny-shapes"
PROMPTS_FILE = Path(__file__).resolve().parents[1] / "assets" / "tiny_shapes_prompts.txt"


def test_generator_is_deterministic():
    a, b, c = sd.generate(50, seed=3), sd.generate(50, seed=3), sd.generate(50, seed=4)
    assert [x[1] for x in a] == [x[1] for x in b]
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(a, b))
    assert [x[1] for x in a] != [x[1] for x in c]
    assert a[0][0].shape == (64, 64, 3) and a[0][0].dtype == np.uint8


@pytest.mark.parametrize("size", sd.CANVASES)
def test_captions_match_pixels(size):
    """On every canvas, the strict judges read back every training scene's caption (one or two shapes)."""
    checked = 0
    for image, caption, scene in sd.generate(120, seed=11, two_shape_prob=0.5, size=size):
        assert image.shape == (size[1], size[0], 3)
        assert sd.parse_caption(caption) == scene
        assert set(caption.split()) <= set(sd.VOCABULARY)
        result = judge_image(scene, image)
        assert all(result.values()), (size, caption, result)
        checked += len(scene.objects) == 2
    assert checked > 40


def test_layout_per_canvas():
    """Positions are fractions of the canvas; sizes are pixels on every canvas (docs/tiny-shapes.md)."""
    assert sd.layout("top left", "large", (64, 64)) == (16, 16, 26)
    assert sd.layout("bottom right", "small", (128, 128)) == (96, 96, 14)
    assert sd.layout("top right", "large", (96, 64)) == (72, 16, 26)
    assert sd.layout("center", "small", (64, 96)) == (32, 48, 14)


def test_word_attributes_label_each_phrase_with_its_own_object():
    """The binding labels: every word of an object's phrase carries that object's attributes."""
    scene = sd.parse_caption("a small red circle at the top-left and a large blue square in the center "
                             "on a gray background")
    labels = sd.word_attributes(scene)
    words = scene.caption.split()
    assert len(labels) == len(words)
    first = tuple(table.index(v) for table, v in zip(sd.ATTRIBUTES.values(), ("red", "circle", "small", "top left")))
    second = tuple(table.index(v) for table, v in zip(sd.ATTRIBUTES.values(), ("blue", "square", "large", "center")))
    assert labels[:7] == [first] * 7 and labels[7] is None and labels[8:15] == [second] * 7
    assert labels[15:] == [None] * 4


def test_held_out_never_in_training():
    held = sd.held_out_prompts()
    assert len(held) >= 100
    assert len({s.caption for s in held}) == len(held)
    for _, caption, scene in sd.generate(3000, seed=0):
        assert not any(sd.is_held_out(o.colour, o.shape, o.position) for o in scene.objects), caption
    # Every held-out scene is drawn as its caption says.
    for scene in held:
        assert all(score(scene, analyze(sd.render(scene))).values())
    two = sd.held_out_two_shape_prompts()
    assert len(two) == len({s.caption for s in two}) == 100
    for scene in two:  # both objects are held-out triples, of different colours and positions
        assert len(scene.objects) == 2 and all(sd.is_held_out(o.colour, o.shape, o.position) for o in scene.objects)
        assert len({o.colour for o in scene.objects} | {scene.background}) == 3
        assert scene.objects[0].position != scene.objects[1].position
        assert sd.parse_caption(scene.caption) == scene
    tuning = sd.tuning_two_shape_prompts()
    assert not any(sd.is_held_out(o.colour, o.shape, o.position) for s in tuning for o in s.objects)


def test_balanced_scenes_draw_every_pair_alike_and_still_no_held_out_triple():
    """``sample_scene(..., balanced=True)`` (the `striped` adapter's training scenes): no held-out
    triple, every (colour, shape) pair within a third of the others' count; by default the pairs the
    held-out rule takes 3 positions from, white circles among them, are several times rarer."""
    import collections
    import random

    counts = {}
    for balanced in (False, True):
        rng, seen = random.Random(5), collections.Counter()
        for _ in range(6000):
            scene = sd.sample_scene(rng, 0.6, balanced)
            assert not any(sd.is_held_out(o.colour, o.shape, o.position) for o in scene.objects), scene.caption
            assert len({o.position for o in scene.objects}) == len(scene.objects)
            assert all(o.colour != scene.background for o in scene.objects)
            seen.update((o.colour, o.shape) for o in scene.objects)
        assert len(seen) == len(sd.OBJECT_COLOURS) * len(sd.SHAPES)
        counts[balanced] = seen
    assert max(counts[True].values()) / min(counts[True].values()) < 1.35
    assert max(counts[False].values()) / min(counts[False].values()) > 3
    assert counts[True][("white", "circle")] > 2 * counts[False][("white", "circle")]
    assert sd.trained_positions("white", "circle") == 2 and sd.trained_positions("red", "square") == 5


def _drawn(draw_shape, blur: float = 0.0):
    """A red figure on white, drawn by ``draw_shape(ImageDraw)``, optionally blurred like a generated edge."""
    from PIL import Image, ImageDraw, ImageFilter

    image = Image.new("RGB", (64, 64), sd.PALETTE["white"])
    draw_shape(ImageDraw.Draw(image), sd.PALETTE["red"])
    return image.filter(ImageFilter.GaussianBlur(blur)) if blur else image


def _hexagon(rotation: float, radius: float = 13):
    import math

    return lambda d, fill: d.polygon([(32 + radius * math.cos(rotation + k * math.pi / 3),
                                       32 + radius * math.sin(rotation + k * math.pi / 3)) for k in range(6)], fill=fill)


HEXAGONS = [("pointy hexagon", _hexagon(1.5707963)), ("flat hexagon", _hexagon(0.0)),
            ("small pointy hexagon", _hexagon(1.5707963, 7)), ("small flat hexagon", _hexagon(0.0, 7))]


@pytest.mark.parametrize("name, draw_shape", HEXAGONS)
def test_strict_judge_tells_a_drawn_hexagon_from_a_circle(name, draw_shape):
    """Drawn sharp. Blurred by a pixel a 14-26 px hexagon is as round as a generated circle: not asserted."""
    assert analyze(_drawn(draw_shape)).shape == "other", name


@pytest.mark.parametrize("blur", [0.0, 1.0])
@pytest.mark.parametrize("name, draw_shape", [
    ("26x6 bar", lambda d, fill: d.rectangle((19, 29, 44, 34), fill=fill)),
    ("26x8 ellipse", lambda d, fill: d.ellipse((19, 28, 44, 35), fill=fill)),
    ("ring", lambda d, fill: (d.ellipse((19, 19, 44, 44), fill=fill), d.ellipse((25, 25, 38, 38), fill=(245, 245, 245)))),
    ("upside-down triangle", lambda d, fill: d.polygon((19, 19, 44, 19, 32, 44), fill=fill)),
    ("two squares", lambda d, fill: (d.rectangle((19, 19, 30, 30), fill=fill), d.rectangle((36, 36, 46, 46), fill=fill))),
    ("diamond", lambda d, fill: d.polygon((32, 19, 44, 32, 32, 44, 19, 32), fill=fill)),
])
def test_strict_judge_names_no_dataset_shape_for_other_figures(name, draw_shape, blur):
    """What the old fill-ratio judge got wrong: a bar read as a square, an ellipse and a hexagon as a
    circle, a ring as a triangle."""
    assert analyze(_drawn(draw_shape, blur)).shape in ("other", None), name


def test_strict_judge_reads_every_dataset_shape_also_blurred():
    from PIL import ImageFilter

    for scene in sd.tuning_prompts() + sd.held_out_prompts():
        assert all(score(scene, analyze(sd.render(scene))).values()), scene.caption
        assert analyze(sd.render(scene).filter(ImageFilter.GaussianBlur(1.0))).shape == scene.objects[0].shape


@pytest.mark.parametrize("size", sd.CANVASES)
def test_strict_judges_read_every_canvas_also_blurred(size):
    """Single- and two-shape held-out scenes (a slice) drawn on each canvas, sharp and blurred by one
    pixel, are read right in every attribute."""
    import random

    from PIL import ImageFilter

    rng = random.Random(0)
    for scene in sd.held_out_prompts()[::5] + sd.held_out_two_shape_prompts()[::4]:
        image = sd.render(scene, rng, size)
        for drawn in (image, image.filter(ImageFilter.GaussianBlur(1.0))):
            assert all(judge_image(scene, drawn).values()), (size, scene.caption)


def test_two_shape_judge_catches_duplicates_drops_and_swaps():
    """Each way the old model got two-shape prompts wrong fails `all`, for the reason named."""
    scene = sd.parse_caption("a large red circle at the top-left and a large blue square at the bottom-right "
                             "on a white background")
    base = sd.Scene(scene.background, scene.objects)

    def judged(objects):
        return judge_image(scene, sd.render(sd.Scene(base.background, tuple(objects)), size=(96, 64)))

    red, blue = scene.objects
    assert all(judged([red, blue]).values())
    duplicated = judged([red, blue, sd.ShapeSpec("blue", "square", "top right", "large")])
    assert not duplicated["count"] and not duplicated["all"]
    dropped = judged([red])
    assert not dropped["count"] and not dropped["all"]
    swapped = judged([sd.ShapeSpec("blue", "circle", "top left", "large"), sd.ShapeSpec("red", "square", "bottom right", "large")])
    assert swapped["count"] and not swapped["colour"] and not swapped["all"]
    wrong_shape = judged([red, sd.ShapeSpec("blue", "triangle", "bottom right", "large")])
    assert wrong_shape["colour"] and not wrong_shape["shape"] and not wrong_shape["all"]
    assert len(find_objects(sd.render(base, size=(96, 64)))[1]) == 2


def test_tuning_and_held_out_sets_share_no_prompt():
    tuning, held = sd.tuning_prompts(), sd.held_out_prompts()
    assert len(tuning) == len(held) == 110
    assert not {s.caption for s in tuning} & {s.caption for s in held}
    assert not any(sd.is_held_out(o.colour, o.shape, o.position) for s in tuning for o in s.objects)


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
    from tpu_demo.core.examples import example_rows

    from tpu_demo.models.prompt_language import PromptLanguage

    lines = [line for line in PROMPTS_FILE.read_text().splitlines() if line.strip()]
    rows = example_rows(get_spec("tiny-shapes"))
    assert rows and len(rows) == len(lines) <= 16
    vocabulary = load_vocabulary(MODEL_DIR / "vocabulary.json")
    assert vocabulary is not None
    assert sorted(vocabulary.words) == sorted(captions.vocabulary_record(varied=False)["words"])
    language = PromptLanguage.load(get_spec("tiny-shapes").language_path)
    buckets = [str(b) for b in get_spec("tiny-shapes").buckets]
    scenes, varied = [(r, i) for _, r, i in rows if i == 1], [(p, r, i) for p, r, i in rows if i > 1]
    for prompt, resolution, images in rows:
        assert resolution in buckets
        if images == 1:  # a fully specified scene: within the grammar the weights were trained on
            sd.parse_caption(prompt)
            assert vocabulary.unknown_words(prompt) == [], prompt
        else:  # leaves attributes to the seed: the upsampler draws each image differently, in the grammar
            drawn = {language.rewrite(prompt, seed).text for seed in range(images)}
            assert len(drawn) == images and all(sd.parse_caption(d) for d in drawn), prompt
    # fully specified scenes at every bucket, and left-out prompts shown as four images
    assert {r for r, _ in scenes} == set(buckets) and varied and all(i == 4 for _, _, i in varied)


def test_shipped_model_loads_and_draws(shipped_pipeline):
    import torch

    defaults = json.loads((MODEL_DIR / "demo_defaults.json").read_text())
    out = shipped_pipeline(prompt="a large blue square in the center on a white background",
                           generator=torch.Generator("cpu").manual_seed(0), **defaults)
    image = out.images[0]
    assert image.size == (64, 64)
    assert np.asarray(image).std() > 5  # not a flat image
    assert analyze(image).background == "white"


def test_catalog_calls_the_model_as_it_was_evaluated():
    spec = get_spec("tiny-shapes")
    defaults = json.loads((MODEL_DIR / "demo_defaults.json").read_text())
    assert spec.guidance_argument == "true_cfg_scale" and not spec.guidance_fixed
    assert spec.default_guidance == defaults["true_cfg_scale"]
    assert spec.default_steps == defaults["num_inference_steps"]
    # the first bucket is the default size; every bucket is a canvas the weights were trained on
    trained = json.loads((MODEL_DIR / "training.json").read_text())["args"].get("buckets", "64x64").split(",")
    assert str(spec.buckets[0]) == f"{defaults['width']}x{defaults['height']}"
    assert [str(b) for b in spec.buckets] == trained
    kwargs = spec.pipeline_kwargs(spec.default_guidance)  # the negative prompt field defaults to ""
    for key in ("max_sequence_length", "negative_prompt"):
        assert kwargs[key] == defaults[key]


def test_guidance_control_is_true_cfg_in_the_engine(make_engine, shipped_pipeline):
    """The engine's tiny-shapes call is the pipeline's true CFG call, pixel for pixel."""
    import torch

    from conftest import engine_images

    prompt = "a small green triangle at the top-right on a black background"
    engine = make_engine()

    def engine_pixels(guidance: float) -> np.ndarray:
        [result] = engine_images(engine, model="tiny-shapes", prompt=prompt, num_inference_steps=12,
                                 guidance_scale=guidance, seed=3)
        return np.asarray(result.image, dtype=np.int16)

    guided, unguided = engine_pixels(3.0), engine_pixels(1.0)
    assert np.abs(guided - unguided).max() > 10
    direct = shipped_pipeline(prompt=prompt, height=64, width=64, num_inference_steps=12, true_cfg_scale=3.0,
                              negative_prompt="", max_sequence_length=24,
                              generator=torch.Generator("cpu").manual_seed(3)).images[0]
    assert np.abs(guided - np.asarray(direct, dtype=np.int16)).max() <= 2


def test_true_cfg_never_recompiles_in_compiled_mode(make_engine):
    """Warm-up compiles one graph per bucket in the catalog's order, except 64x96, which FLUX packs
    into the same 96 tokens as 96x64 (the same graph); the second (unconditional) transformer call
    per step has the same shapes, so true CFG never recompiles."""
    from tpu_demo.core.events import BucketState
    from tpu_demo.core.modes import ExecutionMode

    from conftest import engine_images

    engine = make_engine()
    warm = engine.warmup("tiny-shapes", ExecutionMode.COMPILED)
    tokens = [b.width * b.height // 64 for b in get_spec("tiny-shapes").buckets]  # 8x8 pixels per packed token
    expected = [(f"{b}", BucketState.WARM, int(n not in tokens[:i]))
                for i, (b, n) in enumerate(zip(get_spec("tiny-shapes").buckets, tokens))]
    assert [(w.resolution, w.state, w.compiles) for w in warm] == expected
    after_warmup = engine.counter.count
    for guidance, prompt in ((1.0, "a large red circle in the center on a white background"),
                             (3.0, "a small blue square at the top-left on a gray background"),
                             (6.5, "a large yellow triangle at the bottom-right on a black background")):
        results = engine_images(engine, model="tiny-shapes", mode="compiled", prompt=prompt, num_inference_steps=4,
                                guidance_scale=guidance)
        assert results and all(r.warm and r.timings["compiles"] == 0 for r in results)
    assert engine.counter.count == after_warmup


#: The CI slice of the held-out evaluation: every 14th single-shape prompt (8 of 110) and every 12th
#: two-shape prompt (9 of 100), on every bucket, with the shipped inference defaults.
SLICE = {"single": slice(None, None, 14), "two": slice(None, None, 12)}
#: What the slice must reach, a guard against regressions set from the shipped weights' figures
#: (the base weights trained with `--jitter 0`; the slice measured 8/8 single shapes all right at every
#: bucket, two shapes 9/9, 8/9, 9/9, 8/9 at 64x64 / 128x128 / 96x64 / 64x96), one image of margin
#: below the worst bucket. The whole held-out sets meet the targets (single all >= 95%, two
#: shapes both objects all right >= 80%, at every bucket: 98.2% and 96-100%); a slice of 8 or 9
#: prompts is too small to assert them without that margin.
SLICE_FLOOR = {
    "single": {"background": 0.95, "colour": 0.85, "position": 0.85, "shape": 0.85, "size": 0.85, "all": 0.85},
    "two": {"background": 0.95, "count": 0.75, "colour": 0.85, "position": 0.85, "shape": 0.75, "size": 0.85,
            "all": 0.75},
}
#: The single-shape targets (tiny_shapes.judge.TARGETS) hold on the bucket the
#: weights were first shipped for.
TARGET_BUCKET = (64, 64)


def _slice(kind: str) -> list:
    prompts = sd.held_out_prompts() if kind == "single" else sd.held_out_two_shape_prompts()
    return prompts[SLICE[kind]]


#: the buckets the app offers for the model, as (width, height)
BUCKETS = [(b.width, b.height) for b in get_spec("tiny-shapes").buckets]


@pytest.fixture(scope="module")
def held_out_slices(shipped_pipeline):
    defaults = json.loads((MODEL_DIR / "demo_defaults.json").read_text())
    return {(size, kind): evaluate_pipeline(shipped_pipeline, _slice(kind), seed=0, batch_size=9, size=size, **defaults)
            for size in BUCKETS for kind in SLICE}


@pytest.mark.parametrize("size", BUCKETS, ids=[f"{w}x{h}" for w, h in BUCKETS])
def test_held_out_slice_per_bucket_holds_its_figures(held_out_slices, size):
    single, two = (held_out_slices[size, kind]["accuracy"] for kind in ("single", "two"))
    assert set(single) == set(METRICS) and set(two) == set(TWO_SHAPE_METRICS)
    if size == TARGET_BUCKET:
        for metric, target in TARGETS.items():
            assert single[metric] >= target, (size, metric, single)
    for kind, accuracy in (("single", single), ("two", two)):
        for metric, floor in SLICE_FLOOR[kind].items():
            assert accuracy[metric] >= floor, (size, kind, metric, accuracy)


def test_random_weights_are_at_chance_on_the_same_slice():
    """The same evaluation fails an untrained pipeline of the same architecture: it measures the training."""
    from tiny_shapes.model import build_shapes_pipeline

    defaults = json.loads((MODEL_DIR / "demo_defaults.json").read_text())
    pipe = build_shapes_pipeline(seed=1)
    single = evaluate_pipeline(pipe, _slice("single"), seed=0, batch_size=9, **defaults)["accuracy"]
    two = evaluate_pipeline(pipe, _slice("two"), seed=0, batch_size=9, **defaults)["accuracy"]
    assert single["colour"] < 0.5 and single["shape"] < TARGETS["shape"] and single["all"] < 0.2, single
    assert two["all"] < 0.2, two


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Miniature training runs by arguments, each run once per module: the tests below compare
    runs, and several of them need the same one (a plain seed-5 run, one with decoder steps)."""
    root, runs = tmp_path_factory.mktemp("runs"), {}

    def run(seed: int, *extra: str) -> Path:
        key = (seed, *extra)
        if key not in runs:
            # --save-vae only writes a file: the run's weights are those of the same run without it
            runs[key] = _train(root, f"run{len(runs)}", seed, *extra, "--save-vae", str(root / f"vae{len(runs)}.pt"))
        return runs[key]
    return run


#: the miniature runs' decoder steps (the shipped recipe's are 800, on plain and styled scenes)
POLISH = ("--vae-decoder-steps", "4", "--vae-decoder-styles", "outline,striped")


def _train(tmp_path: Path, name: str, seed: int, *extra: str, own_process: bool = False) -> Path:
    """A miniature run of scripts/train_tiny_model.py (in this process unless ``own_process``, as a user runs it)."""
    import subprocess
    import sys

    from support import run_script_main

    out = tmp_path / name
    args = ["--output", str(out), "--seed", str(seed), "--threads", "1", "--num-images", "24", "--vae-steps", "6",
            "--vae-full-steps", "4", "--vae-batch-size", "8", "--steps", "6", "--batch-sizes", "8,2,4,4",
            "--log-every", "1", "--vae-decoder-steps", "0", *extra]
    if not own_process:
        run_script_main("train_tiny_model", *args)
        return out
    run = subprocess.run([sys.executable, "scripts/train_tiny_model.py", *args], cwd=MODEL_DIR.parents[2],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def test_training_script_is_reproducible_from_its_seed(tmp_path, trained):
    """A miniature run of the real training script, twice with one seed (the second in a process of its own,
    as a user runs it) and once with another."""
    from safetensors.numpy import load_file

    first, again, other = trained(5), _train(tmp_path, "again", 5, own_process=True), trained(6)
    for component in ("transformer/diffusion_pytorch_model", "vae/diffusion_pytorch_model", "text_encoder_2/model"):
        a, b, c = (load_file(run / f"{component}.safetensors") for run in (first, again, other))
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), component
        assert any(not np.array_equal(a[k], c[k]) for k in a), component
    log = [json.loads(line) for line in (first / "train_log.jsonl").read_text().splitlines()]
    assert {"vae", "latents", "transformer", "done"} <= {r["stage"] for r in log}
    assert all(np.isfinite(r["loss"]) for r in log if r["stage"] == "transformer")
    [latents] = [r for r in log if r["stage"] == "latents"]
    assert latents["buckets"] == ["64x64", "128x128", "96x64", "64x96"] and latents["tokens"] == [64, 256, 96, 96]
    assert json.loads((first / "demo_defaults.json").read_text())["true_cfg_scale"] > 1


def test_bucket_mixing_and_a_loaded_vae_continue_the_run_as_documented(tmp_path, trained):
    """The default --bucket-mixing sum takes a batch of every bucket each step (the log names all
    four), draw one bucket a step; the two give different weights. A run that loads the VAE a full
    run saved (--load-vae, how the shipped weights were trained) gives that full run's weights bit
    for bit, decoder steps included: each stage has its own generator."""
    from safetensors.numpy import load_file

    full = trained(5, *POLISH)
    saved_vae = full.parent / f"vae{full.name.removeprefix('run')}.pt"
    loaded = _train(tmp_path, "loaded", 5, "--load-vae", str(saved_vae), *POLISH)
    drawn = _train(tmp_path, "draw", 5, "--bucket-mixing", "draw")
    for component in ("transformer/diffusion_pytorch_model", "text_encoder_2/model", "vae/diffusion_pytorch_model"):
        a, b, d = (load_file(run / f"{component}.safetensors") for run in (full, loaded, drawn))
        assert all(np.array_equal(a[k], b[k]) for k in a), component
        if component.startswith("transformer"):
            assert any(not np.array_equal(a[k], d[k]) for k in a)
    assert json.loads((full / "vae/config.json").read_text()) == json.loads((loaded / "vae/config.json").read_text())
    steps = {run: [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
             for run in (full, drawn)}
    steps = {run: [r["bucket"] for r in log if r["stage"] == "transformer"] for run, log in steps.items()}
    assert steps[full] == ["64x64+128x128+96x64+64x96"] * 6
    assert all(name in {"64x64", "128x128", "96x64", "64x96"} for name in steps[drawn]), steps[drawn]


def test_decoder_steps_move_the_decoder_alone_so_the_transformer_is_unchanged(trained):
    """The VAE's decoder steps (encoder frozen) change the decoder and nothing the transformer
    learns from: the encoder, the latent normalisation and the transformer are bit for bit those of
    a run without them. So the decoder of a shipped pipeline can be polished without retraining."""
    from safetensors.numpy import load_file

    polished, plain = trained(5, *POLISH), trained(5)
    vae, vae_plain = (load_file(run / "vae/diffusion_pytorch_model.safetensors") for run in (polished, plain))
    assert all(np.array_equal(vae[k], vae_plain[k]) for k in vae if not k.startswith("decoder."))
    assert any(not np.array_equal(vae[k], vae_plain[k]) for k in vae if k.startswith("decoder."))
    a, b = (load_file(run / "transformer/diffusion_pytorch_model.safetensors") for run in (polished, plain))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    configs = [json.loads((run / "vae/config.json").read_text()) for run in (polished, plain)]
    assert [c["shift_factor"] for c in configs] == [configs[1]["shift_factor"]] * 2
    log = [json.loads(line) for line in (polished / "train_log.jsonl").read_text().splitlines()]
    assert [r["bucket"] for r in log if r["stage"] == "vae_decoder"] == ["64x64", "128x128", "96x64", "64x96"]


def test_polishing_a_saved_decoder_gives_the_decoder_of_a_run_from_scratch(tmp_path, trained):
    """--decoder-only on a saved pipeline (how the shipped decoder was polished for the styles) runs
    the same decoder stage as a run from scratch with the same flags: the same weights bit for bit,
    every other component as loaded, and the loaded record kept with the polish's arguments added."""
    from safetensors.numpy import load_file

    plain, from_scratch = trained(5), trained(5, *POLISH)
    polished = _train(tmp_path, "polished", 5, "--init-from", str(plain), "--decoder-only", *POLISH)
    for component in ("vae/diffusion_pytorch_model", "transformer/diffusion_pytorch_model", "text_encoder_2/model"):
        a, b = (load_file(run / f"{component}.safetensors") for run in (polished, from_scratch))
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), component
    record = json.loads((polished / "training.json").read_text())
    assert record["args"] == json.loads((plain / "training.json").read_text())["args"]
    assert record["decoder_polish"]["args"]["vae_decoder_styles"] == "outline,striped"
    assert "earlier_decoder_polishes" not in record
    stages = {json.loads(line)["stage"] for line in (polished / "train_log.jsonl").read_text().splitlines()}
    assert stages == {"vae_decoder"}
    # polished again (how the shipped decoder got its second polish): both polishes on record, oldest first
    again = _train(tmp_path, "again", 6, "--init-from", str(polished), "--decoder-only", *POLISH)
    chain = json.loads((again / "training.json").read_text())
    assert chain["earlier_decoder_polishes"] == [record["decoder_polish"]]
    assert chain["decoder_polish"]["args"]["seed"] == 6 and chain["args"] == record["args"]


def test_the_decoder_learns_the_styles_from_their_drawings():
    """The decoder's styled scenes are the same scenes as its plain ones, drawn in each style, each
    with its own object mask (what the loss weighs)."""
    import sys

    sys.path.insert(0, str(MODEL_DIR.parents[2] / "scripts"))
    import train_tiny_model as train
    from tiny_shapes.styles import render_styled
    from tiny_shapes.vae_training import object_pixel_mask

    size = (96, 64)
    rendered = sd.generate(5, seed=3, two_shape_prob=0.5, size=size, jitter=(0,))
    images, scenes = np.stack([r[0] for r in rendered]), [r[2] for r in rendered]
    [(out, masks)] = train.with_styles([(images, object_pixel_mask(images, scenes))], [(images, None, scenes)],
                                       [size], ["outline", "striped"])
    assert out.shape == (15, 64, 96, 3) and masks.shape == (15, 64, 96)
    assert np.array_equal(out[:5], images)
    assert np.array_equal(out[5 + 2], np.asarray(render_styled(scenes[2], "outline", size)))
    assert np.array_equal(out[10 + 4], np.asarray(render_styled(scenes[4], "striped", size)))
    assert (masks[5:10].sum((1, 2)) < masks[:5].sum((1, 2)) + 1).all() and masks[5:].any((1, 2)).all()


def test_training_scenes_stand_exactly_at_their_positions():
    """The training script's default scenes have no jitter: every object is drawn at its layout
    position, so a caption is one picture on each canvas (docs/tiny-shapes.md#what-the-attempts-taught).
    The judges are still tested on jittered scenes (test_captions_match_pixels)."""
    import sys

    sys.path.insert(0, str(MODEL_DIR.parents[2] / "scripts"))
    import train_tiny_model as train

    jitter = tuple(int(v) for v in train.parse_args(["--output", "unused"]).jitter.split(","))
    assert jitter == sd.TRAINING_JITTER == (0,)
    for size in sd.CANVASES:
        scenes = sd.generate(30, seed=7, two_shape_prob=0.5, size=size, jitter=jitter)
        assert all(np.array_equal(image, np.asarray(sd.render(scene, None, size))) for image, _, scene in scenes)
        jittered = sd.generate(30, seed=7, two_shape_prob=0.5, size=size)
        assert any(not np.array_equal(a[0], b[0]) for a, b in zip(scenes, jittered))


def test_timestep_sampling_draws_the_noise_levels_it_names():
    """--timestep-sampling: uniform draws the scheduler's own training sigmas (shift applied),
    logit-normal draws sigmoid(N(0, 1)): a third of the samples beyond sigmoid(+-1), where uniform
    puts 54%."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler

    from tiny_shapes.flow_training import sample_sigmas

    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(MODEL_DIR, subfolder="scheduler")
    table = scheduler.sigmas[: scheduler.config.num_train_timesteps]
    draw = {kind: sample_sigmas(kind, table, 20000, torch.Generator().manual_seed(0))
            for kind in ("uniform", "logit-normal")}
    assert torch.isin(draw["uniform"], table).all()
    tails = {kind: ((s < torch.sigmoid(torch.tensor(-1.0))) | (s > torch.sigmoid(torch.tensor(1.0)))).float().mean()
             for kind, s in draw.items()}
    assert abs(tails["logit-normal"] - 0.317) < 0.02 and abs(tails["uniform"] - 0.54) < 0.03, tails
    assert 0 < draw["logit-normal"].min() and draw["logit-normal"].max() < 1
    again = sample_sigmas("logit-normal", table, 20000, torch.Generator().manual_seed(0))
    assert torch.equal(again, draw["logit-normal"])


def test_training_from_saved_weights_is_reproducible(tmp_path):
    """--init-from (fine-tuning a saved pipeline; how the first multi-bucket run was made): the VAE
    and its latent normalisation are kept, the transformer moves, and one seed gives the same
    weights twice."""
    from safetensors.numpy import load_file

    # No binding loss: the smallest run that moves the transformer.
    runs = [_train(tmp_path, name, 5, "--init-from", str(MODEL_DIR), "--binding-weight", "0") for name in ("a", "b")]
    for component in ("transformer/diffusion_pytorch_model", "vae/diffusion_pytorch_model"):
        a, b, shipped = (load_file(path / f"{component}.safetensors") for path in (*runs, MODEL_DIR))
        assert all(np.array_equal(a[k], b[k]) for k in a), component
        moved = any(not np.array_equal(a[k], shipped[k]) for k in a)
        assert moved == component.startswith("transformer"), component
    vae = [json.loads((path / "vae" / "config.json").read_text()) for path in (runs[0], MODEL_DIR)]
    assert [v["shift_factor"] for v in vae] == [vae[1]["shift_factor"]] * 2


def test_example_rows_may_name_their_bucket(tmp_path):
    """A prompts-file line ending in `| WIDTHxHEIGHT` (one of the model's buckets) is drawn there;
    any other line, or an unknown size, keeps the first bucket and the whole line as the prompt."""
    from dataclasses import replace

    from tpu_demo.core.examples import example_prompts, example_rows

    path = tmp_path / "prompts.txt"
    path.write_text("a red circle\na blue square | 96x64\na | b | 64x96\nodd | 100x100\n\n"
                    "a green square | 128x128 | 4 images\na cat | 1 image\n", encoding="utf-8")
    spec = replace(get_spec("tiny-flux"), example_prompts_file=str(path))  # buckets 64x64, 128x128, 96x64, 64x96
    assert example_rows(spec) == [("a red circle", "64x64", 1), ("a blue square", "96x64", 1), ("a | b", "64x96", 1),
                                  ("odd | 100x100", "64x64", 1), ("a green square", "128x128", 4), ("a cat", "64x64", 1)]
    assert example_prompts(spec) == ["a red circle", "a blue square", "a | b", "odd | 100x100", "a green square", "a cat"]
