"""The prompt upsampler: a visitor's words -> the model's sentence, what they leave out drawn from the seed.

The reader is tested on phrasings it was not written from (HELD_OUT_PHRASINGS: words and orders kept
out of its tables, checked here), on the project's own phrasing sets and thousands of captions of the
wide generator; the engine, on the shipped tiny-shapes weights (the drawn sentence is what the
pipeline got: same pixels as typing it, no new graph) and on the tiny FLUX.2 stand-in through
diffusers' own ``Flux2Pipeline.upsample_prompt``.
"""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from tiny_shapes import captions, dataset, language as shapes_language, phrasing_evaluation
from tpu_demo.core import links, pngmeta
from tpu_demo.core.catalog import CATALOG, get_spec
from tpu_demo.core.request import RequestError, validate_request
from tpu_demo.core.upsampling import UpsamplerKind
from tpu_demo.models.prompt_language import PromptLanguage

from conftest import engine_images

LANGUAGE = PromptLanguage.load(get_spec("tiny-shapes").language_path)

#: Phrasings the reader's tables were not written from: each with the words that make it new (none of
#: them is in the language, so the reader must read the scene around them) and what it names.
HELD_OUT_PHRASINGS: list[tuple[str, tuple[str, ...], dict]] = [
    ("Red circle situated in the upper-right region; backdrop: black", ("situated", "region"),
     {"objects": [{"colour": "red", "shape": "circle", "position": "top right"}], "background": "black"}),
    ("I'd like a TINY blue triangle, lower left, upon a grey canvas please", ("i", "d", "like", "upon"),
     {"objects": [{"size": "small", "colour": "blue", "shape": "triangle", "position": "bottom left"}],
      "background": "gray"}),
    ("Yellow Square — Centre Of The Frame", ("frame",),
     {"objects": [{"colour": "yellow", "shape": "square", "position": "center"}]}),
    ("there should be an orange circle near the top left, plus a white square near the bottom right",
     ("should", "be", "near", "plus"),
     {"objects": [{"colour": "orange", "shape": "circle", "position": "top left"},
                  {"colour": "white", "shape": "square", "position": "bottom right"}]}),
    ("GREEN TRIANGLE!!", (), {"objects": [{"colour": "green", "shape": "triangle"}]}),
    ("a huge purple square occupying the lower-right quadrant", ("occupying", "quadrant"),
     {"objects": [{"size": "large", "colour": "purple", "shape": "square", "position": "bottom right"}]}),
    ("black background featuring a little white circle", ("featuring",),
     {"objects": [{"size": "small", "colour": "white", "shape": "circle"}], "background": "black"}),
    ("Two blue squares", (), {"objects": [{"colour": "blue", "shape": "square"}] * 2}),
    ("make me a red square in the middle, then a green circle in the top-right corner", ("make", "then"),
     {"objects": [{"colour": "red", "shape": "square", "position": "center"},
                  {"colour": "green", "shape": "circle", "position": "top right"}]}),
    ("small circle, colour: orange", ("colour",), {"objects": [{"size": "small", "colour": "orange", "shape": "circle"}]}),
]


def _named(text: str) -> dict:
    reading = LANGUAGE.read(text)
    assert reading is not None, text
    out: dict = {"objects": [dict(o) for o in reading.objects]}
    if reading.scene:
        out["background"] = reading.scene["background"]
    return out


def _keeps_what_is_named(prompt: captions.Prompt, sentence: str) -> bool:
    scene = dataset.parse_caption(sentence)  # always the model's one sentence form
    if len(scene.objects) != len(prompt.scene.objects):
        return False
    if prompt.background_named and scene.background != prompt.scene.background:
        return False
    return all(getattr(drawn, attribute) == getattr(wanted, attribute)
               for i, (drawn, wanted) in enumerate(zip(scene.objects, prompt.scene.objects))
               for attribute in ("colour", "shape", "size", "position") if prompt.names(i, attribute))


def test_the_committed_language_is_generated_from_the_grammar_tables():
    import json

    committed = json.loads(get_spec("tiny-shapes").language_path.read_text(encoding="utf-8"))
    assert committed == json.loads(json.dumps(shapes_language.language_record()))


def test_the_grammar_reads_as_itself_whatever_the_seed():
    """The model's own figures stay its own: a sentence of the grammar is never changed."""
    scenes = dataset.held_out_prompts() + dataset.held_out_two_shape_prompts() + dataset.tuning_prompts()
    for index, scene in enumerate(scenes):
        drawn = LANGUAGE.rewrite(scene.caption, seed=index)
        assert drawn is not None and drawn.text == scene.caption and drawn.seed_chose == ()


@pytest.mark.parametrize("set_name", list(phrasing_evaluation.prompt_sets()))
def test_the_projects_phrasing_sets_keep_every_named_attribute_in_any_case(set_name):
    prompts = phrasing_evaluation.prompt_sets()[set_name]
    for index, prompt in enumerate(prompts):
        for text in (prompt.text, captions.mixed_case(prompt.text, seed=index), prompt.text.upper()):
            drawn = LANGUAGE.rewrite(text, seed=index)
            assert drawn is not None and _keeps_what_is_named(prompt, drawn.text), (text, drawn)


def test_thousands_of_captions_of_the_wide_generator_keep_every_named_attribute():
    rng = random.Random(11)
    for index in range(2000):
        prompt = captions.describe(dataset.sample_scene(rng, two_shape_prob=0.5), rng)
        drawn = LANGUAGE.rewrite(prompt.text, seed=index)
        assert drawn is not None and _keeps_what_is_named(prompt, drawn.text), (prompt.text, drawn)


def test_held_out_phrasings_are_out_of_the_tables():
    known = set(LANGUAGE.record["words"])
    phrases = {p for values in LANGUAGE.record["slots"].values() for ps in values.values() for p in ps}
    for text, new_words, _ in HELD_OUT_PHRASINGS:
        assert not set(new_words) & known, text
        assert text.lower() not in phrases


@pytest.mark.parametrize("text,new_words,expected", HELD_OUT_PHRASINGS, ids=[p[0][:30] for p in HELD_OUT_PHRASINGS])
def test_held_out_phrasings_are_read(text, new_words, expected):
    assert _named(text) == expected


def test_text_with_no_object_goes_as_typed():
    for text in ("a cat on a sofa", "draw something nice", "!!!", "on a white background"):
        assert LANGUAGE.rewrite(text, seed=3) is None


def test_eight_seeds_of_a_left_out_prompt_are_eight_different_right_sentences():
    for text in ("a red circle", "A Yellow Triangle.", "a big green square"):
        drawn = [LANGUAGE.rewrite(text, seed) for seed in range(100, 108)]
        assert len({d.text for d in drawn}) == 8, text
        named = _named(text)
        for d in drawn:
            scene = dataset.parse_caption(d.text)
            assert all(getattr(scene.objects[0], k) == v for k, v in named["objects"][0].items())
            assert scene.background != scene.objects[0].colour  # never drawn on its own colour
            assert d.seed_chose and "[" in d.marked
    # what the seed chose is marked, what was typed is not
    marked = LANGUAGE.rewrite("a red circle on a white background", seed=5).marked
    assert "red circle" in marked and "[" in marked and "white background" in marked


def test_left_out_attributes_follow_the_training_scenes_distribution():
    positions, two_shape = Counter(), []
    for seed in range(3000):
        positions[dataset.parse_caption(LANGUAGE.rewrite("a blue square", seed).text).objects[0].position] += 1
        two_shape.append(dataset.parse_caption(LANGUAGE.rewrite("a red circle and a blue square", seed).text))
    assert set(positions) == set(dataset.POSITION_NAMES)
    assert all(0.16 <= n / 3000 <= 0.24 for n in positions.values()), positions  # uniform over 5
    for scene in two_shape:
        first, second = scene.objects
        assert first.position != second.position  # two shapes at two different positions
        if "center" in (first.position, second.position):
            assert first.size == second.size == "small"  # as dataset.sample_scene draws them
        assert scene.background not in (first.colour, second.colour)


def test_named_attributes_are_never_changed_even_against_the_rules():
    drawn = dataset.parse_caption(LANGUAGE.rewrite("a large white circle in the center on white", 0).text)
    assert (drawn.background, drawn.objects[0].size, drawn.objects[0].position) == ("white", "large", "center")


def test_the_catalog_declares_who_upsamples():
    declared = {m: s.prompt_upsampler.kind for m, s in CATALOG.items() if s.prompt_upsampler}
    assert declared == {"tiny-shapes": UpsamplerKind.LANGUAGE, "tiny-flux2": UpsamplerKind.PIPELINE,
                        "flux.2-dev": UpsamplerKind.PIPELINE}
    assert get_spec("tiny-shapes").prompt_upsampler.default_on
    assert not get_spec("flux.2-dev").prompt_upsampler.default_on


def test_upsample_prompt_is_validated_and_defaults_to_the_models():
    base = dict(prompt="a red circle", mode="eager", resolution="64x64")
    assert validate_request(dict(base, model="tiny-shapes")).upsample_prompt is True
    assert validate_request(dict(base, model="tiny-shapes", upsample_prompt=False)).upsample_prompt is False
    assert validate_request(dict(base, model="tiny-flux2")).upsample_prompt is False
    assert validate_request(dict(base, model="tiny-flux", upsample_prompt=True)).upsample_prompt is False  # none
    with pytest.raises(RequestError, match="upsample_prompt: must be true or false"):
        validate_request(dict(base, model="tiny-shapes", upsample_prompt="yes"))


def test_links_and_pngs_carry_the_typed_prompt_and_the_checkbox():
    request = validate_request(dict(prompt="A Yellow Triangle.", model="tiny-shapes", mode="eager",
                                    resolution="64x64", seed=9, upsample_prompt=True))
    query = links.link_query(dict(request.as_dict(), resolution=request.resolution))
    assert "upsample=1" in query and "prompt=A+Yellow+Triangle." in query
    assert links.request_from_link(query) == request
    assert links.request_from_link(query.replace("upsample=1", "upsample=0")).upsample_prompt is False
    assert "upsample" not in links.link_query(dict(request.as_dict(), resolution="64x64", upsample_prompt=False))
    assert links.request_from_link(query.replace("&upsample=1", "")).upsample_prompt is False  # older links
    with pytest.raises(RequestError, match="^upsample: must be true or false"):
        links.request_from_link(query.replace("upsample=1", "upsample=maybe"))
    assert pngmeta._restored({"prompt": "x"})["upsample_prompt"] is False  # older PNGs: as they were made


def test_the_engine_draws_each_image_from_its_own_seed_and_shows_it(make_engine, tmp_path):
    from PIL import Image

    engine = make_engine()
    fields = dict(prompt="A Yellow Triangle.", model="tiny-shapes", resolution="64x64", num_inference_steps=4,
                  guidance_scale=3.0, seed=20, num_images=4)
    results = engine_images(engine, **fields, upsample_prompt=True)
    drawn = [r.parameters["drawn_prompt"] for r in results]
    assert drawn == [LANGUAGE.rewrite("A Yellow Triangle.", 20 + i).text for i in range(4)]
    assert len(set(drawn)) == 4 and all(r.parameters["prompt"] == "A Yellow Triangle." for r in results)
    # the PNG keeps the typed and the drawn prompt
    results[2].image.save(path := tmp_path / "third.png", pnginfo=pngmeta.png_info(results[2].image))
    settings = pngmeta.read_settings(Image.open(path))
    assert settings["prompt"] == "A Yellow Triangle." and settings["upsample_prompt"] is True
    assert "Drawn as: " + drawn[2].replace(",", " ") in results[2].image.info["parameters"]
    # what the pipeline was given is the drawn sentence: typed as is, with the upsampler off, same pixels
    typed = engine_images(engine, **dict(fields, prompt=drawn[2], seed=22, num_images=1), upsample_prompt=False)[0]
    assert "drawn_prompt" not in typed.parameters
    assert np.array_equal(np.asarray(typed.image), np.asarray(results[2].image))


def test_upsampling_compiles_nothing_after_warmup(make_engine):
    from tpu_demo.core.buckets import Bucket
    from tpu_demo.core.modes import ExecutionMode

    engine = make_engine(bucket_overrides={"tiny-shapes": (Bucket(64, 64),)})
    engine.warmup("tiny-shapes", ExecutionMode.COMPILED)
    before = engine.counter.count
    for prompt in ("a red circle", "two purple circles", "a big green square on black", "a cat"):
        results = engine_images(engine, prompt=prompt, model="tiny-shapes", mode="compiled", resolution="64x64",
                                num_inference_steps=2, guidance_scale=3.0, num_images=2, upsample_prompt=True)
        assert all(r.warm and r.timings["compiles"] == 0 for r in results)
    assert engine.counter.count == before


def test_flux2_rewrites_through_diffusers_upsample_prompt_before_the_pipeline(make_engine):
    """tiny-flux2: the real ``Flux2Pipeline.upsample_prompt`` on the stand-in's random Mistral3 encoder
    (so the text is noise), sampled from the image's seed: the same seed writes the same prompt."""
    engine = make_engine()
    fields = dict(prompt="a red circle", model="tiny-flux2", resolution="64x64", num_inference_steps=2,
                  guidance_scale=4.0, seed=3)
    first = engine_images(engine, **fields, upsample_prompt=True)[0]
    drawn = first.parameters["drawn_prompt"]
    assert drawn and drawn != "a red circle" and first.parameters["prompt"] == "a red circle"
    loaded = engine.pool.load(get_spec("tiny-flux2"))
    assert loaded.upsampler.rewrite("a red circle", 3).text == drawn  # seeded: reproducible
    plain = engine_images(engine, **fields)[0]  # off by default for FLUX.2
    assert "drawn_prompt" not in plain.parameters


def test_the_model_cards_rewrite_example_prints_what_it_shows():
    """The card's snippet, run as a reader would paste it (from the repository root): its last line
    evaluates to the result written under it."""
    import ast
    import os
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    card = (root / "assets" / "models" / "tiny-shapes" / "README.md").read_text()
    [snippet] = [block for block in re.findall(r"^```python\n(.*?)^```", card, re.S | re.M) if "rewrite(" in block]
    *code, last, shown = snippet.strip().splitlines()
    assert shown.startswith("# "), shown
    scope: dict = {}
    here = os.getcwd()
    os.chdir(root)
    try:
        exec("\n".join(code), scope)
        value = eval(last, scope)
    finally:
        os.chdir(here)
    assert value == ast.literal_eval(shown[2:])
