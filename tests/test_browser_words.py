"""The embedded default and a visitor's own words, through the real page in headless Chromium.

Prompts are typed into the page as a visitor would; the gallery's PNGs are fetched from the server
and read by the strict judge (tiny_shapes.prompt_judge) on what each prompt names, and the line
under the prompt names the words the model was never trained on.
"""

from __future__ import annotations

import io

import httpx
import pytest
from PIL import Image
from playwright.sync_api import expect

from browser_support import CHROMIUM, GALLERY_IMAGES, guard_network, launch_chromium, start_app, stop_app
from tiny_shapes.captions import Prompt
from tiny_shapes.dataset import Scene, ShapeSpec
from tiny_shapes.prompt_judge import judge_prompt

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason=f"{CHROMIUM} missing: install Debian's chromium (scripts/test.sh does)")


@pytest.fixture(scope="module")
def page_of_words(cache_dir):
    from playwright.sync_api import sync_playwright

    app, url = start_app("--cache-dir", str(cache_dir), "--compile-backend", "aot_eager", "--model", "tiny-shapes",
                         "--models", "tiny-shapes,tiny-flux", "--no-warmup", "--max-images", "4")
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        blocked = guard_network(context)
        page = context.new_page()
        page.goto(url)
        page.wait_for_selector("#generate")
        yield page, url
        assert blocked == []
        browser.close()
    stop_app(app)


def _generate(page, url: str, text: str, seed: int, images: int) -> list[Image.Image]:
    """Type ``text``, fix the seed and the number of images, press Generate; the gallery's PNGs."""
    page.fill("#prompt textarea", text)
    advanced = page.locator("#advanced")
    if not page.locator("#num-images").is_visible():
        advanced.locator("button.label-wrap").click()
    for elem_id, value in (("num-images", images),):
        field = page.locator(f"#{elem_id} input[type=number]")
        field.fill(str(value))
        field.press("Tab")
    randomize = page.get_by_label("Randomize seed")
    if randomize.is_checked():
        randomize.uncheck()
    seed_box = page.get_by_label("Seed", exact=True)
    seed_box.fill(str(seed))
    seed_box.press("Tab")
    page.click("#generate")
    page.wait_for_function(
        """([selector, count]) => {
             const images = [...document.querySelectorAll(selector)];
             return images.length === count && images.every(img => img.complete && img.naturalWidth > 0);
           }""", arg=[GALLERY_IMAGES, images], timeout=120_000)
    page.wait_for_function("() => !document.querySelector('#gallery .pending, #gallery .generating')", timeout=60_000)
    sources = page.eval_on_selector_all(GALLERY_IMAGES, "images => images.map(img => img.src)")
    return [Image.open(io.BytesIO(httpx.get(src, timeout=30).content)).convert("RGB") for src in sources]


def _prompt(text: str, objects, background: str | None) -> Prompt:
    """What ``text`` names: objects (colour, shape, position or None, size or None); None = left out."""
    scene = Scene(background or "white", tuple(ShapeSpec(c, s, p or "center", z or "small") for c, s, p, z in objects))
    named = tuple(frozenset(a for a, v in (("position", p), ("size", z)) if v) for _, _, p, z in objects)
    return Prompt(text, scene, named, background is not None, ((0, 0),) * len(objects))


def test_a_prompt_in_capitals_is_drawn_as_in_lower_case(page_of_words):
    """Letter case is the tokenizer's business (it lowercases): a shouted prompt draws what it says."""
    page, url = page_of_words
    text = "A SMALL Blue Square At The Top-Left On A White BACKGROUND"
    [image] = _generate(page, url, text, seed=3, images=1)
    result = judge_prompt(_prompt(text, [("blue", "square", "top left", "small")], "white"), image)
    assert result["all"], result
    expect(page.locator("#vocabulary-note")).to_be_hidden()


def test_the_vocabulary_line_names_words_the_model_cannot_read(page_of_words):
    page, _ = page_of_words
    note = page.locator("#vocabulary-note")
    page.fill("#prompt textarea", "a cat on a sofa")
    expect(note).to_be_visible()
    expect(note).to_contain_text("Not in Tiny Shapes' vocabulary: cat, sofa")
    expect(note).to_contain_text("circles, squares and triangles")
    page.fill("#prompt textarea", "a little red circle in the upper left on a grey background")  # words it never read
    expect(note).to_contain_text("vocabulary: little, upper, left, grey;")
    page.fill("#prompt textarea", "A Large Red Circle In The Center On A White Background")
    expect(note).to_be_hidden()
    # a model that declares no vocabulary shows nothing, whatever the words
    page.fill("#prompt textarea", "a cat on a sofa")
    expect(note).to_be_visible()
    page.click("#model input")
    page.get_by_role("option", name="Tiny FLUX (random weights, offline)").click()
    expect(note).to_be_hidden()
