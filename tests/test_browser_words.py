"""The embedded default and a visitor's own words, through the real page in headless Chromium.

Prompts are typed into the page as a visitor would; the gallery's PNGs are fetched from the server
and read by the strict judge (tiny_shapes.prompt_judge) on what each prompt names, and the line
under the prompt names the words the model cannot read. With the prompt upsampler (on by default)
a prompt that leaves attributes out draws a different right picture per image, each captioned with
what was drawn, and an image's link gives its pixels again.
"""

from __future__ import annotations

import io

import httpx
import pytest
from PIL import Image
from playwright.sync_api import expect

from browser_support import CHROMIUM, GALLERY_IMAGES, guard_network, launch_chromium, start_app, stop_app
from tiny_shapes.captions import Prompt
from tiny_shapes.dataset import Scene, ShapeSpec, parse_caption
from tiny_shapes.judge import judge_image
from tiny_shapes.prompt_judge import judge_prompt
from tpu_demo.core.catalog import get_spec

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
    # words the weights never read: the prompt upsampler (on by default) reads them; with it off, the line names them
    page.fill("#prompt textarea", "a little red circle in the upper left on a grey background")
    expect(note).to_be_hidden()
    page.get_by_label("Upsample prompt").uncheck()
    expect(note).to_contain_text("vocabulary: little, upper, left, grey;")
    page.fill("#prompt textarea", "A Large Red Circle In The Center On A White Background")
    expect(note).to_be_hidden()
    page.get_by_label("Upsample prompt").check()
    # a model that declares no vocabulary shows nothing, whatever the words
    page.fill("#prompt textarea", "a cat on a sofa")
    expect(note).to_be_visible()
    page.click("#model input")
    page.get_by_role("option", name="Tiny FLUX (random weights, offline)").click()
    expect(note).to_be_hidden()


def test_a_yellow_triangle_draws_four_different_right_pictures_and_a_link_draws_the_third_again(page_of_words):
    page, url = page_of_words
    if "Tiny Shapes" not in page.input_value("#model input"):  # an earlier test may have left another model
        page.click("#model input")
        page.get_by_role("option", name=get_spec("tiny-shapes").title).click()
    expect(page.get_by_label("Upsample prompt")).to_be_checked()  # the model's default
    images = _generate(page, url, "A Yellow Triangle.", seed=0, images=4)
    captions = page.eval_on_selector_all("#gallery .caption-label", "labels => labels.map(l => l.innerText)")
    assert all("drawn as: " in c for c in captions), captions
    drawn = [caption.split("drawn as: ")[1].split(" ([")[0] for caption in captions]
    assert len(drawn) == 4 and all("[" in d and "yellow triangle" in d for d in drawn), captions
    sentences = [d.replace("[", "").replace("]", "") for d in drawn]
    assert len(set(sentences)) == 4  # four different pictures, each right
    for sentence, image in zip(sentences, images):
        result = judge_image(parse_caption(sentence), image)
        assert result["all"], (sentence, result)
    page.locator(GALLERY_IMAGES).nth(2).click()  # the third image: seed 2
    page.click("#copy-link")
    page.wait_for_function("(document.querySelector('#image-link textarea') || {}).value?.startsWith('http')",
                           timeout=30_000)
    link = page.input_value("#image-link textarea")
    assert "prompt=A+Yellow+Triangle." in link and "upsample=1" in link and "seed=2" in link
    shared = page.context.new_page()
    shared.goto(link)
    shared.wait_for_selector("#generate-this")
    shared.wait_for_function("document.querySelector('#link-note') && document.querySelector('#link-note').innerText")
    assert shared.get_by_label("Upsample prompt").is_checked()
    shared.click("#generate-this")
    shared.wait_for_function("""(selector) => [...document.querySelectorAll(selector)].some(
        img => img.complete && img.naturalWidth > 0)""", arg=GALLERY_IMAGES, timeout=120_000)
    src = shared.eval_on_selector_all(GALLERY_IMAGES, "images => images.map(img => img.src)")[0]
    again = Image.open(io.BytesIO(httpx.get(src, timeout=30).content)).convert("RGB")
    assert (again.tobytes() == images[2].tobytes())
    assert drawn[2] in shared.eval_on_selector_all("#gallery .caption-label", "ls => ls.map(l => l.innerText)")[0]
    shared.close()
