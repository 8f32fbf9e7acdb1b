"""The reproduce link in headless Debian Chromium: copy the link of a generated image, open it in a new
page (controls filled, nothing run), click "Generate this" and get the same pixels; a tampered link names
the wrong field and runs nothing. The real app and browser of test_browser.py (its fixtures are reused)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from browser_support import CHROMIUM, GALLERY_IMAGES, wait_for_gallery_images
from test_browser import app_url, browser, open_page  # noqa: F401 - fixtures shared with test_browser

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason=f"{CHROMIUM} missing: install Debian's chromium (scripts/test.sh does)")


def image_pixels(page, index: int) -> np.ndarray:
    src = page.eval_on_selector_all(GALLERY_IMAGES, "images => images.map(img => img.src)")[index]
    with Image.open(io.BytesIO(page.request.get(src).body())) as image:
        return np.asarray(image.convert("RGB"))


def open_link(page, link: str) -> None:
    page.goto(link)
    page.wait_for_selector("#generate")
    page.wait_for_function("document.querySelector('#link-note') && document.querySelector('#link-note').innerText")


def test_a_copied_link_fills_a_new_page_and_generates_the_same_pixels(open_page):
    page, blocked, errors = open_page()
    page.fill("#prompt textarea", "a blue square at the top-left")
    page.click("#generate")
    wait_for_gallery_images(page, 2)
    # the run over (the panel refreshes each second): a click made while its last update lands can be lost
    page.wait_for_function("document.querySelector('#bucket-status').innerText.includes('device idle')",
                           timeout=30_000)
    original = image_pixels(page, 1)
    page.locator(GALLERY_IMAGES).nth(1).click()  # select the second image (seed + 1)
    page.click("#copy-link")
    try:
        page.wait_for_function("(document.querySelector('#image-link textarea') || {}).value?.startsWith('http')",
                               timeout=30_000)
    except Exception as error:  # say what the page showed instead
        shown = page.evaluate("""() => ({box: (document.querySelector('#image-link textarea') || {}).value,
                                        toasts: [...document.querySelectorAll('.toast-body')].map(t => t.innerText)})""")
        raise AssertionError(f"no link after Copy link: {shown}") from error
    link = page.input_value("#image-link textarea")
    assert link.startswith(page.url.split("?")[0] + "?prompt=a+blue+square")
    for name in ("model=tiny-flux", "mode=eager", "resolution=", "steps=", "guidance=", "seed="):
        assert name in link, name

    shared = page.context.new_page()
    open_link(shared, link)
    assert "Generate this" in shared.inner_text("#generate-this") and shared.locator("#generate-this").is_visible()
    assert "nothing has run yet" in shared.inner_text("#link-note")
    assert shared.input_value("#prompt textarea") == "a blue square at the top-left"
    shared.wait_for_timeout(1000)
    assert shared.locator(GALLERY_IMAGES).count() == 0  # opening the link ran nothing
    shared.click("#generate-this")
    wait_for_gallery_images(shared, 1)
    shared.wait_for_timeout(500)
    assert shared.locator(GALLERY_IMAGES).count() == 1
    assert np.array_equal(image_pixels(shared, 0), original)

    tampered = shared.context.new_page()
    open_link(tampered, link.replace("steps=", "steps=999&x="))
    note = tampered.inner_text("#link-note")
    assert "This link cannot be used" in note and "steps: must be from" in note and "Nothing was run" in note
    assert not tampered.locator("#generate-this").is_visible()
    assert tampered.locator(GALLERY_IMAGES).count() == 0
    assert blocked == [] and errors == []


def test_the_restore_controls_say_why_nothing_was_restored(open_page, tmp_path):
    """Reuse with no image selected, a PNG not made here, a file that is not a PNG: each gets a message on the
    page (Gradio shows a handler's messages only for an event that runs through its queue), and the controls
    keep what the visitor typed."""
    foreign, not_png = tmp_path / "foreign.png", tmp_path / "notpng.png"
    Image.new("RGB", (100, 80), "white").save(foreign)
    not_png.write_text("not an image")
    page, blocked, _ = open_page()
    page.fill("#prompt textarea", "a red circle")
    page.click("#generate")
    wait_for_gallery_images(page, 1)  # the reuse row shows under finished images
    page.fill("#prompt textarea", "kept as typed")
    page.click("#reuse")
    page.get_by_text("Select an image in the gallery first.").wait_for(state="visible", timeout=10_000)
    assert page.input_value("#prompt textarea") == "kept as typed"
    for path, message in ((foreign, "This image carries no settings from this app."),
                          (not_png, "this file is not a PNG")):
        page, blocked, _ = open_page()
        page.fill("#prompt textarea", "kept as typed")
        page.locator("#restore-png input[type=file]").set_input_files(str(path))
        page.get_by_text(message).first.wait_for(state="visible", timeout=10_000)
        assert page.input_value("#prompt textarea") == "kept as typed" and page.locator("#demo-header h1").is_visible()
        assert blocked == []
