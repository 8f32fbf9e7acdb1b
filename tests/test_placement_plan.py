"""Placement on real chips from real configurations, and the resident placement on real pipelines.

The real architectures are built on the ``meta`` device (no weights) and counted; the counts
must agree with the catalog's sizes, which drive every placement decision. The placement and
transfer tables of docs/placements.md must equal what the code computes. The resident placement
(transformer and VAE on the device, text encoders on the host, cached embeddings) must give
the image the whole placement gives, and a repeated prompt must not run the encoders.
"""

import re
import sys
from pathlib import Path

import pytest
import torch

from conftest import engine_images
from tpu_demo.core.catalog import CATALOG, REAL_MODEL_IDS, Placement
from tpu_demo.device import DeviceInfo
from tpu_demo.models.placement import choose_placement
from tpu_demo.models.placement_plan import (TPU_CHIPS, Serving, embedding_mb, per_chip_gb, placement_table,
                                            plan_placement, plan_serving, transfer_table,
                                            weight_gb_moved_per_request)

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "placements.md"
REAL_SPECS = [CATALOG[model_id] for model_id in REAL_MODEL_IDS]


@pytest.mark.parametrize("model_id", REAL_MODEL_IDS)
def test_meta_device_parameter_counts_match_the_catalog_sizes(model_id):
    from tpu_demo.models.sizing import component_sizes

    sizes = component_sizes(model_id)
    spec = CATALOG[model_id]
    assert set(sizes) == set(spec.component_gb)
    for name, size in sizes.items():
        assert size["gb"] == pytest.approx(spec.component_gb[name], rel=0.03), (model_id, name, size)


def test_published_parameter_counts():
    """Figures the model cards state: FLUX.1 12B, SD3.5 Medium 2.5B, FLUX.2-dev 32B + a 24B Mistral."""
    from tpu_demo.models.sizing import component_sizes

    billions = {m: {n: s["parameters"] / 1e9 for n, s in component_sizes(m).items()} for m in REAL_MODEL_IDS}
    assert billions["flux.1-schnell"]["transformer"] == pytest.approx(11.9, abs=0.1)
    assert billions["flux.1-schnell"]["text_encoder_2"] == pytest.approx(4.76, abs=0.05)  # T5-XXL encoder
    assert billions["sd3.5-medium"]["transformer"] == pytest.approx(2.47, abs=0.05)
    assert billions["sd3.5-medium"]["text_encoder_2"] == pytest.approx(0.69, abs=0.02)  # CLIP-G
    assert billions["flux.2-dev"]["transformer"] == pytest.approx(32.2, abs=0.2)
    assert billions["flux.2-dev"]["text_encoder"] == pytest.approx(24.0, abs=0.1)  # Mistral Small 3.1


def test_placement_and_transfer_tables_in_the_docs_are_the_computed_ones():
    """docs/placements.md is generated (scripts/placements_doc.py); no other page keeps its own copy."""
    sys.path.insert(0, str(REPO / "scripts"))
    from placements_doc import render

    text = DOCS.read_text()
    assert text == render(), "docs/placements.md is stale: run python scripts/placements_doc.py"
    assert placement_table(REAL_SPECS) in text and transfer_table(REAL_SPECS) in text
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for page in pages:
        if page == DOCS:
            continue
        body = page.read_text()
        # a placement table (rows per chip, or a column of placements) typed by hand drifts: link instead
        assert not re.search(r"^\| *(v5e|v6e|v5p) \(", body, re.M), page
        assert "placement on one TPU" not in body, page
        for phrase in ("with model CPU offload; 2 chips", "1 chip (offload) or 2"):
            assert phrase not in body, (page, phrase)


def test_docs_download_commands_are_the_catalogs():
    """The recipe works as written: the `hf` command huggingface_hub 2.x installs, with the
    catalog's patterns (the app's own message and the k8s manifests use the same)."""
    text = (REPO / "docs" / "models.md").read_text()
    for spec in REAL_SPECS:
        assert spec.download_command in text, spec.download_command
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        assert "huggingface-cli" not in page.read_text(), page


def test_placements_per_chip():
    plan = {(m, chip, n): plan_placement(CATALOG[m], gb, n)
            for m in REAL_MODEL_IDS for chip, gb in {"v5e": 16, "v6e": 32, "v5p": 95}.items() for n in (1, 4, 8)}
    # one v6e: SD3.5 whole (the source document), FLUX.1-schnell with its transformer resident
    assert plan["sd3.5-medium", "v6e", 1] is Placement.WHOLE
    assert plan["flux.1-schnell", "v6e", 1] is Placement.RESIDENT
    assert plan["flux.1-schnell", "v5e", 1] is None  # a 24 GB transformer on 16 GB
    # FLUX.1's T5 has no TP plan, so it is whole on every chip: 4 v5e chips are not enough
    assert plan["flux.1-schnell", "v5e", 4] is None
    assert plan["flux.1-schnell", "v5e", 8] is Placement.TENSOR_PARALLEL
    assert plan["flux.2-dev", "v6e", 8] is Placement.TENSOR_PARALLEL  # the source document's 8 chips
    assert plan["flux.2-dev", "v6e", 4] is None
    assert plan["flux.2-dev", "v5p", 1] is Placement.RESIDENT  # 64 GB transformer, Mistral on the host
    # a model that fits one chip runs one engine per chip; one that does not is sharded over all of them
    assert plan_serving(CATALOG["flux.1-schnell"], 32, 4) == Serving(Placement.RESIDENT, engines=4, chips_per_engine=1)
    assert plan_serving(CATALOG["sd3.5-medium"], 32, 8) == Serving(Placement.WHOLE, engines=8, chips_per_engine=1)
    assert plan_serving(CATALOG["flux.2-dev"], 32, 8) == Serving(Placement.TENSOR_PARALLEL, 1, 8)


def test_automatic_choice_prefers_resident_to_offload():
    v6e = DeviceInfo(kind="tpu", count=1, name="TPU v6e", memory_bytes_per_device=32 * 10**9)
    flux = CATALOG["flux.1-schnell"]
    assert choose_placement(flux, v6e) is Placement.RESIDENT
    assert choose_placement(flux, v6e, override=Placement.OFFLOAD) is Placement.OFFLOAD  # still selectable
    assert weight_gb_moved_per_request(flux, Placement.OFFLOAD) == pytest.approx(2 * 33.7, abs=0.2)
    assert weight_gb_moved_per_request(flux, Placement.RESIDENT) == 0
    assert embedding_mb(flux) == pytest.approx(256 * 4096 * 2 / 1e6)
    assert per_chip_gb(flux, Placement.RESIDENT) == pytest.approx(23.97)


@pytest.mark.parametrize("model", ["tiny-flux", "tiny-sd3", "tiny-flux2"])
def test_resident_matches_whole_and_a_repeated_prompt_skips_the_encoders(make_engine, model):
    guidance = CATALOG[model].default_guidance
    whole = make_engine(placement_override=Placement.WHOLE)
    expected = engine_images(whole, model=model, guidance_scale=guidance)[0].image
    whole.close()

    engine = make_engine(placement_override=Placement.RESIDENT)
    first = engine_images(engine, model=model, guidance_scale=guidance)[0].image
    loaded = engine.pool.get(model)
    assert loaded.placement is Placement.RESIDENT
    assert all(getattr(loaded.pipeline, name) is None for name in loaded.pipeline.components
               if name.startswith("text_encoder"))  # the denoising pipeline holds no encoder
    encoder_calls = []
    for name, component in loaded.prompt_encoder.encoder_pipeline.components.items():
        if name.startswith("text_encoder") and component is not None:
            component.register_forward_hook(lambda *args: encoder_calls.append(1))
    second = engine_images(engine, model=model, guidance_scale=guidance, seed=7)[0].image
    assert encoder_calls == []  # the cached embeddings were used
    assert loaded.prompt_encoder.hits >= 1
    engine_images(engine, model=model, guidance_scale=guidance, prompt="a blue square")
    assert encoder_calls  # a new prompt runs them

    diff = (torch.tensor(list(first.getdata()), dtype=torch.float) -
            torch.tensor(list(expected.getdata()), dtype=torch.float)).abs().max().item()
    assert diff <= 1, f"resident differs from whole by {diff} levels"
    assert list(second.getdata()) == list(first.getdata())
    assert "resident" in engine.placement_description(model)


def test_resident_compiled_mode_compiles_the_full_transformer(make_engine):
    engine = make_engine(placement_override=Placement.RESIDENT)
    images = engine_images(engine, model="tiny-flux", mode="compiled")
    assert images[0].image.size == (64, 64)
    compiles = engine.counter.count
    assert compiles >= 1
    engine_images(engine, model="tiny-flux", mode="compiled", seed=9)
    assert engine.counter.count == compiles
    assert engine.pool.get("tiny-flux").pipeline.transformer._compiled_call_impl is not None


#: how the docs name each real model
MODEL_NAMES = {"flux.1-schnell": ("flux.1-schnell", "FLUX.1-schnell", "FLUX.1 [schnell]", "FLUX.1"),
               "sd3.5-medium": ("sd3.5-medium", "SD3.5 Medium", "SD3.5", "Stable Diffusion 3.5 Medium"),
               "flux.2-dev": ("flux.2-dev", "FLUX.2-dev", "FLUX.2 [dev]", "FLUX.2")}
FITS_ONE = re.compile(r"\bfits? (?:on )?(?:one|a single|1) (?:\w+ )?chip\b|\b1 chip \(", re.I)
FITS_NONE = re.compile(r"\bfits? no single (?:\w+ )?chip\b|\bdoes not fit (?:on )?(?:one|a single) (?:\w+ )?chip\b", re.I)
CHIP_NAMES = re.compile(r"\b(v5e|v6e|v5p|v7x)\b")


def placement_claims(text: str) -> list[tuple[str, str, str, bool]]:
    """(sentence, model, chip, fits one chip) for every sentence or table row that says whether a named real
    model fits one chip; the chip is the one the sentence names, or "any" when it names none."""
    claims = []
    for sentence in re.split(r"(?<=[.;:])\s+|\n", text):
        positive, negative = FITS_ONE.search(sentence), FITS_NONE.search(sentence)
        if not (positive or negative):
            continue
        for model, names in MODEL_NAMES.items():
            if any(re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-]|\.\d)", sentence) for name in names):
                for chip in CHIP_NAMES.findall(sentence) or ["any"]:
                    claims.append((sentence.strip(), model, chip, bool(positive) and not negative))
    return claims


def test_no_other_page_contradicts_the_placement_table():
    """docs/placements.md is the one place the docs state placements; a sentence elsewhere that says a real
    model fits one chip (or fits none) must hold for the chip it names, or for every chip of the table when
    it names none ("FLUX.1 and SD3.5 each fit one chip" does not: FLUX.1 fits no v5e chip)."""
    assert placement_claims("FLUX.1-schnell and SD3.5 Medium each fit one chip.")  # the checker sees such a sentence
    wrong = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        if page == DOCS:
            continue
        for sentence, model, chip, fits in placement_claims(page.read_text()):
            chips = [chip] if chip != "any" else list(TPU_CHIPS)
            truth = [plan_serving(CATALOG[model], TPU_CHIPS[c], 1) is not None for c in chips]
            if (fits and not all(truth)) or (not fits and any(truth)):
                wrong.append(f"{page.name}: {model} on {chip}: {sentence[:160]}")
    assert not wrong, "\n".join(wrong)
