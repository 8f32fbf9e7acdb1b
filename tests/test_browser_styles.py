"""Styles in a real browser: pick a style in Advanced, generate in compiled mode, and the Buckets
panel shows that nothing compiled; the styled image's reproduce link fills the style and makes the same
pixels (headless Debian Chromium against the real app on loopback)."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from PIL import Image

from browser_support import (CHROMIUM, GALLERY_IMAGES, gallery_sources, guard_network, launch_chromium, start_app,
                             stop_app, wait_for_gallery_images)
from tpu_demo.core.catalog import get_spec

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason=f"{CHROMIUM} missing: install Debian's chromium (scripts/test.sh does)")

PROMPT = "a large blue circle in the center on a white background"
DEFAULT_SCALES = {style.name: style.default_scale for style in get_spec("tiny-shapes").styles}


def total_compiles(page) -> int:
    """The panel's "N graphs compiled in total"."""
    text = page.inner_text("#bucket-status")
    return int(re.search(r"(\d+) graphs compiled in total", text).group(1))


def gallery_pixels(page, index: int) -> np.ndarray:
    src = gallery_sources(page)[index]
    with Image.open(io.BytesIO(page.request.get(src).body())) as image:
        return np.asarray(image.convert("RGB"))


def test_a_style_picked_in_the_page_generates_on_the_warm_graph_without_compiling(cache_dir):
    from playwright.sync_api import sync_playwright

    app, url = start_app("--cache-dir", str(cache_dir), "--compile-backend", "aot_eager", "--model", "tiny-shapes",
                         "--models", "tiny-shapes,tiny-flux", "--mode", "compiled", "--buckets", "64x64",
                         "--max-batch", "1")  # one graph to count: batch sizes 2 and 4 would still be warming
    try:
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            context = browser.new_context(viewport={"width": 1280, "height": 1000})
            blocked = guard_network(context)
            page = context.new_page()
            page.goto(url)
            page.wait_for_selector("#generate")
            # start-up warmup: the one bucket goes warm in compiled mode
            page.wait_for_function("""() => [...document.querySelectorAll('#bucket-status tr')].some(
                row => /64x64/.test(row.innerText) && /compiled/.test(row.innerText) && /warm/.test(row.innerText))""",
                                   timeout=120_000)
            compiled_at_warmup = total_compiles(page)
            assert compiled_at_warmup > 0
            page.click("#advanced button.label-wrap")
            # the "Try a style" example sets the prompt and the style together
            page.locator("#style-examples").get_by_text("outline \u00b7 a large blue circle").click()
            page.wait_for_function("document.querySelector('#style input')?.value.startsWith('Outline')")
            page.wait_for_function("(scale) => Number(document.querySelector('#style-scale input[type=number]').value)"
                                   " === scale", arg=DEFAULT_SCALES["outline"], timeout=10_000)  # at its strength
            assert page.input_value("#prompt textarea") == PROMPT
            page.uncheck("text=Randomize seed")
            for title, name in (("Outline (only the border of each shape)", "outline"),
                                ("Shaded (each shape lit from above)", "shaded")):
                page.click("#style input")
                page.get_by_role("option", name=title).click()
                # picked by the visitor: the slider moves to that style's own default strength (catalog)
                page.wait_for_function("(scale) => Number(document.querySelector('#style-scale input[type=number]')"
                                       ".value) === scale", arg=DEFAULT_SCALES[name], timeout=10_000)
                earlier = gallery_sources(page)
                page.click("#generate")
                wait_for_gallery_images(page, 2, replacing=earlier)  # the page's default: two images
                page.wait_for_function(f"document.querySelector('#gallery').innerText.includes('style {name} 1')",
                                       timeout=30_000)
                assert "compiled first" not in page.inner_text("#gallery")
                page.wait_for_timeout(1500)  # the panel refreshes every second
                assert total_compiles(page) == compiled_at_warmup, page.inner_text("#bucket-status")
            # the link of the second shaded image: a new page gets the style too, and the same pixels
            original = gallery_pixels(page, 1)
            page.locator(GALLERY_IMAGES).nth(1).click()
            page.click("#copy-link")
            page.wait_for_function("(document.querySelector('#image-link textarea') || {}).value?.startsWith('http')",
                                   timeout=20_000)
            link = page.input_value("#image-link textarea")
            assert link.endswith("&style=shaded&style_scale=1.0") and "mode=compiled" in link, link
            shared = context.new_page()
            shared.goto(link)
            shared.wait_for_function("(document.querySelector('#link-note') || {}).innerText")
            shared.click("#advanced button.label-wrap")
            assert shared.input_value("#style input").startswith("Shaded")
            assert float(shared.input_value("#style-scale input[type=number]")) == 1.0
            shared.click("#generate-this")
            wait_for_gallery_images(shared, 1)
            assert np.array_equal(gallery_pixels(shared, 0), original)
            tampered = context.new_page()
            tampered.goto(link.replace("style=shaded", "style=sketch"))
            tampered.wait_for_function("(document.querySelector('#link-note') || {}).innerText")
            note = tampered.inner_text("#link-note")
            assert "style: 'sketch' is not a style of tiny-shapes" in note and "Nothing was run" in note
            assert not tampered.locator("#generate-this").is_visible()
            # another model chosen: its own examples, and no style example (tiny-flux has no styles)
            assert tampered.locator("#style-examples").is_visible()
            tampered.click("#model input")
            tampered.get_by_role("option", name=get_spec("tiny-flux").title).click()
            tampered.locator("#style-examples").wait_for(state="hidden", timeout=10_000)
            tampered.locator("#examples").get_by_text("a red circle on a white background").wait_for(timeout=10_000)
            assert tampered.locator("#examples").get_by_text("a large blue circle").count() == 0
            assert blocked == []
            context.close()
            browser.close()
    finally:
        stop_app(app)
