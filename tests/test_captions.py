"""The caption generator of people's words (the ninth attempt's training captions), its held-out
phrasings and judge, the lowercasing tokenizers and the vocabulary line."""

from __future__ import annotations

import os
import random
import re
import sys
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from tiny_shapes import captions, dataset as sd
from tiny_shapes.prompt_judge import judge_prompt
from tpu_demo.core.vocabulary import Vocabulary, vocabulary_note

ROOT = Path(__file__).resolve().parents[1]


def _training_prompts(per_bucket: int | None = None) -> list[captions.Prompt]:
    """The captions the training script's defaults make (every bucket, its seeds and counts)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import train_tiny_model

    args = train_tiny_model.parse_args([])
    labels = args.buckets.split(",")
    counts = train_tiny_model.per_bucket(args.num_images, len(labels))
    prompts = []
    for i, (label, count) in enumerate(zip(labels, counts)):
        size = tuple(int(v) for v in label.split("x"))
        made = captions.generate(per_bucket or count, seed=args.seed + 1000 * i, two_shape_prob=args.two_shape_prob,
                                 size=size, jitter=(0,), full_share=args.full_share, stray_word=args.stray_word)
        prompts += [p for _, p in made]
    return prompts


@pytest.mark.quick
def test_held_out_phrasings_are_never_trained_and_are_written_with_trained_words():
    train = _training_prompts(per_bucket=1000)
    patterns = [re.compile(p) for p, _ in captions.HELD_OUT_TEMPLATES.values()]
    assert not [p.text for p in train if any(r.search(p.text.lower()) for r in patterns)]
    held = captions.held_out_phrasings(sd.held_out_prompts() + sd.held_out_two_shape_prompts())
    trained_words = {w for p in train for w in re.findall(r"[a-z]+", p.text)}
    for name, (pattern, example) in captions.HELD_OUT_TEMPLATES.items():
        assert re.search(pattern, example), name
        written = [p.text for p in held if re.search(pattern, p.text)]
        assert len(written) >= 20, name  # every template is used by the evaluation
    assert all(set(re.findall(r"[a-z]+", p.text)) <= trained_words for p in held)
    assert not {p.text for p in held} & {p.text for p in train}


def test_no_caption_of_the_full_training_run_uses_a_held_out_phrasing():
    train = _training_prompts()
    assert len(train) == 28000
    assert not [p.text for p in train if captions.is_held_out_phrasing(p.text)]


@pytest.mark.quick
def test_generator_writes_synonyms_orders_and_left_out_attributes():
    prompts = _training_prompts(per_bucket=1000)
    text = " | ".join(p.text for p in prompts)
    for phrase in ("top left", "top-left", "upper left", "corner", "centre", "middle", "centered", "grey", "big",
                   "little", "on white", "against a", "background,", "a picture of", "an image of", "draw ", "."):
        assert phrase in text, phrase
    assert any(p.text.endswith("background") and ", " in p.text and " on " not in p.text for p in prompts)  # lists
    full = [p for p in prompts if p.background_named and all(n == {"size", "position"} for n in p.named)]
    assert 0.3 < len(full) / len(prompts) < 0.5
    for attribute in ("size", "position"):
        assert any(attribute not in n for p in prompts for n in p.named)
    assert any(not p.background_named for p in prompts)
    stray = [p for p in prompts if captions.token_count(p.text) > len(re.findall(r"[a-z]+|[^\sa-z]", p.text))]
    assert 0.03 < len(stray) / len(prompts) < 0.15  # made-up words, spelled out in letters
    assert max(captions.token_count(p.text) for p in prompts) <= 31


@pytest.mark.quick
def test_each_object_phrase_names_its_own_attributes_and_nothing_left_out():
    sizes = {w for words in captions.SIZE_WORDS.values() for w in words}
    rng = random.Random(7)
    for _ in range(400):
        prompt = captions.describe(sd.sample_scene(rng, 0.5), rng)
        for i, (obj, (a, b)) in enumerate(zip(prompt.scene.objects, prompt.spans)):
            words = set(re.findall(r"[a-z]+", prompt.text[a:b]))
            assert {obj.colour, obj.shape} <= words, prompt.text
            assert bool(words & sizes) == prompt.names(i, "size"), prompt.text
            if obj.position != "center":
                assert bool(words & {"left", "right"}) == prompt.names(i, "position"), prompt.text
        backgrounds = {"background", "backdrop"} | set(sd.BACKGROUNDS) | {"grey"}
        outside = set(re.findall(r"[a-z]+", prompt.text)) - {w for a, b in prompt.spans
                                                              for w in re.findall(r"[a-z]+", prompt.text[a:b])}
        assert bool(outside & backgrounds) == prompt.background_named, prompt.text


@pytest.mark.quick
def test_left_out_prompts_leave_out_what_they_say_and_the_judge_reads_the_truth():
    scenes = sd.held_out_prompts()[:30] + sd.held_out_two_shape_prompts(30)
    for prompt in captions.left_out_prompts(scenes) + captions.held_out_phrasings(scenes):
        result = judge_prompt(prompt, sd.render(prompt.scene, None, (96, 64)))
        assert result["all"], prompt.text
    prompt = captions.describe(scenes[0], random.Random(0), named=(frozenset(),), background_named=False)
    wrong = sd.Scene(scenes[0].background, (sd.ShapeSpec(
        next(c for c in sd.OBJECT_COLOURS if c not in (scenes[0].objects[0].colour, scenes[0].background)),
        scenes[0].objects[0].shape, "center", "small"),))
    assert not judge_prompt(prompt, sd.render(wrong))["all"]


@pytest.mark.quick
def test_mixed_case_changes_letters_only():
    text = "a small blue square at the top-left, white background."
    mixed = captions.mixed_case(text, seed=3)
    assert mixed != text and mixed.lower() == text


@pytest.mark.quick
def test_tokenizer_lowercases_after_a_save_and_from_pretrained(tmp_path):
    from transformers import AutoTokenizer

    from tiny_shapes.model import VARIED, build_t5_word_tokenizer

    build_t5_word_tokenizer(VARIED).save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    text = "A Small BLUE Square at the Top-Left, white background."
    assert tokenizer(text).input_ids == tokenizer(text.lower()).input_ids
    pieces = tokenizer.tokenize("a little grey triangle, upper-left corner.")
    assert pieces == ["\u2581" + p for p in "a little grey triangle , upper - left corner .".split()]
    assert tokenizer.unk_token_id not in tokenizer("a cat on a sofa").input_ids  # spelled, not unknown


def test_extended_vocabulary_keeps_the_grammar_and_starts_synonyms_from_their_words():
    """Teaching grammar-trained weights people's words (the tenth attempt): every grammar piece keeps its id
    and embedding, people's words become whole pieces (not spelled), a synonym starts as its word."""
    import torch

    from tiny_shapes.model import GRAMMAR, SYNONYM_OF, build_shapes_pipeline, extend_vocabulary

    pipe = build_shapes_pipeline(seed=0, wording=GRAMMAR)
    before = pipe.tokenizer_2.get_vocab()
    table = pipe.text_encoder_2.get_input_embeddings().weight.detach().clone()
    text = "a little grey triangle in the upper-left corner, on a white backdrop."
    assert len(pipe.tokenizer_2.tokenize(text)) > 20  # the grammar's tokenizer spells the new words
    extend_vocabulary(pipe)
    after = pipe.tokenizer_2.get_vocab()
    assert all(after[piece] == i for piece, i in before.items())
    assert pipe.tokenizer_2.tokenize(text) == ["\u2581" + w for w in
                                               "a little grey triangle in the upper-left corner".split()] + \
        [",", "\u2581on", "\u2581a", "\u2581white", "\u2581backdrop", "."]
    assert pipe.tokenizer_2("A LITTLE Grey triangle").input_ids == pipe.tokenizer_2("a little grey triangle").input_ids
    new_table = pipe.text_encoder_2.get_input_embeddings().weight
    assert torch.equal(new_table[: len(before)], table[: len(before)])
    for word, synonym in SYNONYM_OF.items():
        row = new_table[after["\u2581" + word]]
        if synonym is not None:
            assert torch.equal(row, table[before["\u2581" + synonym]]), word
        else:
            assert torch.equal(row, table[after["\u2581" + word]]), word  # its own random start


@pytest.mark.quick
def test_vocabulary_line_names_unknown_words_only():
    record = captions.vocabulary_record()
    vocabulary = Vocabulary(frozenset(record["words"]), record["summary"])
    assert vocabulary.unknown_words("A cat on a SOFA, a cat.") == ["cat", "sofa"]
    assert vocabulary.unknown_words("a top-left cat-like square") == ["cat", "like"]
    grammar = Vocabulary(frozenset(sd.VOCABULARY), "")
    assert grammar.unknown_words("a red circle at the TOP-LEFT") == []  # one word of the grammar
    assert grammar.unknown_words("a red circle at the top left, upper-left") == ["top", "left", "upper"]
    note = vocabulary_note(vocabulary, "Tiny Shapes", "a cat on a sofa")
    assert note.startswith("Not in Tiny Shapes' vocabulary: cat, sofa; it draws circles")
    rng = random.Random(2)
    for _ in range(200):
        text = captions.describe(sd.sample_scene(rng, 0.5), rng, stray_word=0.0).text
        assert vocabulary_note(vocabulary, "Tiny Shapes", captions.mixed_case(text)) == "", text
    assert vocabulary_note(None, "FLUX.1 [schnell]", "a cat on a sofa") == ""


def test_shipped_tokenizer_lowercases_and_keeps_the_ids_the_weights_were_trained_with():
    """The shipped weights' T5 tokenizer (tiny_shapes.model.GRAMMAR) loads with its normaliser through
    the pipeline's own from_pretrained: capitals read as lower case, lower case gives the plain
    whole-word tokenizer's ids (the ones the weights were trained on)."""
    import torch
    from diffusers import FluxPipeline

    from tiny_shapes.model import GRAMMAR
    from tpu_demo.models.tiny_models import build_t5_tokenizer

    pipe = FluxPipeline.from_pretrained(ROOT / "assets" / "models" / "tiny-shapes", dtype=torch.float32,
                                        local_files_only=True)
    plain = build_t5_tokenizer(words=GRAMMAR.words, max_length=GRAMMAR.max_sequence_length)
    kwargs = dict(padding="max_length", max_length=GRAMMAR.max_sequence_length, truncation=True)
    for scene in sd.held_out_prompts()[::7] + sd.held_out_two_shape_prompts(15):
        assert pipe.tokenizer_2(scene.caption, **kwargs).input_ids == plain(scene.caption, **kwargs).input_ids
        shouted = captions.mixed_case(scene.caption, seed=len(scene.caption))
        assert pipe.tokenizer_2(shouted, **kwargs).input_ids == plain(scene.caption, **kwargs).input_ids


def test_binding_labels_of_the_grammar_are_the_word_labels_the_shipped_weights_trained_with():
    """The training script reads an object's phrase from character offsets now (people's words put
    several pieces in a word); on the grammar's captions that gives exactly the per-word labels of
    ``dataset.word_attributes`` the shipped recipe used, so the default command trains as before."""
    import numpy as np
    import torch

    from tiny_shapes.flow_training import binding_labels
    from tiny_shapes.model import build_shapes_pipeline

    pipe = build_shapes_pipeline(seed=0)
    rng = random.Random(5)
    scenes = [sd.sample_scene(rng, 0.5) for _ in range(60)]
    prompts = {s.caption: captions.describe_grammar(s) for s in scenes}
    unique = [""] + sorted(prompts)
    labels = binding_labels(pipe, unique, prompts)
    for row, caption in enumerate(unique[1:], start=1):
        expected = torch.full(labels.shape[1:], -100)
        for i, ids in enumerate(sd.word_attributes(sd.parse_caption(caption))):
            if ids is not None:
                expected[i] = torch.tensor(ids)
        assert np.array_equal(labels[row].numpy(), expected.numpy()), caption
