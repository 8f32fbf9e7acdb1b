"""The page in a real browser: headless Debian Chromium (Playwright) against the real app on loopback.

One app and one browser for the module; each test opens a fresh context (an empty profile).
"""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from browser_support import (CHROMIUM, GALLERY_IMAGES, guard_network, launch_chromium, start_app, stop_app,
                             wait_for_gallery_images)

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason=f"{CHROMIUM} missing: install Debian's chromium (scripts/test.sh does)")

#: A tiny model runs 50 steps at 128x128 in ~0.3 s here: a run long enough to Stop needs many images.
#: 16 was too few on a loaded CI machine: the run ended before the Stop click reached it (a stop costs
#: only the images made before it, so a longer run costs nothing).
LONG_RUN_IMAGES = 48

# Records the gallery's image count on every DOM mutation (no polling): window.__galleryCounts.
OBSERVE_GALLERY = """(selector) => {
  window.__galleryCounts = [];
  const gallery = document.querySelector('#gallery');
  const record = () => {
    const count = document.querySelectorAll(selector).length;
    if (count !== window.__galleryCounts[window.__galleryCounts.length - 1]) window.__galleryCounts.push(count);
  };
  new MutationObserver(record).observe(gallery, {childList: true, subtree: true, attributes: true});
}"""


@pytest.fixture(scope="module")
def app_url(cache_dir):
    app, url = start_app("--cache-dir", str(cache_dir), "--compile-backend", "aot_eager", "--model", "tiny-flux",
                         "--models", "tiny-flux,tiny-sd3", "--no-warmup",
                         "--max-images", str(LONG_RUN_IMAGES),
                         # a preview every 0.05 s: at the default 0.25 s an image must take over 0.5 s to show
                         # one, and a tiny model's 50 steps at 128x128 take about that here
                         "--preview-seconds", "0.05")
    yield url
    stop_app(app)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        yield browser
        browser.close()


@pytest.fixture
def open_page(browser, app_url):
    """A fresh context (empty profile) with the network guard; returns (page, blocked, console_errors)."""
    contexts = []

    def open_(width: int = 1280, height: int = 900, color_scheme: str = "light"):
        context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=color_scheme)
        contexts.append(context)
        blocked = guard_network(context)
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(app_url)
        page.wait_for_selector("#generate")
        return page, blocked, errors

    yield open_
    for context in contexts:
        context.close()


def set_slider(page, elem_id: str, value: int) -> None:
    """Type into the slider's number box; retried because a late server update can reset it."""
    field, slider = page.locator(f"#{elem_id} input[type=number]"), page.locator(f"#{elem_id} input[type=range]")
    for _ in range(3):
        field.fill(str(value))
        field.press("Tab")
        page.wait_for_timeout(200)
        if slider.input_value() == str(value) and field.input_value() == str(value):
            return
    expect(slider).to_have_value(str(value))


def choose(page, elem_id: str, option: str) -> None:
    page.click(f"#{elem_id} input")
    page.get_by_role("option", name=option).click()


def test_page_loads_offline_without_console_errors(open_page):
    page, blocked, errors = open_page()
    page.wait_for_timeout(1500)  # a status-panel refresh and any late asset requests
    assert blocked == []
    assert errors == []
    header = page.inner_text("#demo-header")
    assert "CPU" in header and "Tiny FLUX" in header and "whole on device" in header
    assert page.locator("#examples").get_by_text("a red circle on a white background").is_visible()


def test_generate_streams_images_into_the_gallery(open_page):
    page, blocked, errors = open_page()
    page.fill("#prompt textarea", "a yellow circle and a purple square")
    choose(page, "model", "Tiny SD3 (random weights, offline)")
    page.wait_for_function("document.querySelector('#demo-header').innerText.includes('Tiny SD3')")
    page.get_by_label("optimized eager").check()
    choose(page, "resolution", "3:2 \u00b7 96x64")
    page.click("#advanced button.label-wrap")
    set_slider(page, "steps", 8)
    set_slider(page, "num-images", 3)
    page.evaluate(OBSERVE_GALLERY, GALLERY_IMAGES)

    page.click("#generate")
    sizes = wait_for_gallery_images(page, 3)

    counts = [count for count in page.evaluate("window.__galleryCounts") if count]
    assert counts == [1, 2, 3], f"gallery did not grow one image at a time: {counts}"
    assert sizes == [{"width": 96, "height": 64}] * 3
    # the status panel refreshes by itself: the bucket just used shows as warm
    page.wait_for_function("""() => [...document.querySelectorAll('#bucket-status tr')].some(
        row => /96x64/.test(row.innerText) && /eager-fused/.test(row.innerText) && /warm/.test(row.innerText))""",
                           timeout=10_000)
    assert blocked == [] and errors == []


def test_invalid_input_shows_a_visible_message(open_page):
    page, _, _ = open_page()
    page.fill("#prompt textarea", "   ")
    page.click("#generate")
    message = page.get_by_text("prompt: is empty")
    message.wait_for(state="visible", timeout=10_000)
    assert page.locator(GALLERY_IMAGES).count() == 0
    # a seed out of range, typed with Randomize off: a message naming it (not a bare "Error" in place of the box)
    page.fill("#prompt textarea", "a red circle on a white background")
    page.click("#advanced button.label-wrap")
    page.get_by_label("Randomize seed").uncheck()
    for seed in ("-5", "99999999999"):
        page.locator("#seed input").fill(seed)
        page.locator("#seed input").press("Tab")
        page.click("#generate")
        page.get_by_text("seed: must be").first.wait_for(state="visible", timeout=10_000)
        assert page.locator("#seed input").is_visible()
        page.locator(".toast-close").first.click()
        page.get_by_text("seed: must be").first.wait_for(state="hidden", timeout=10_000)
    page.locator("#seed input").fill("3")
    # the server keeps serving, and Enter in the prompt generates (as the placeholder says)
    page.locator("#prompt textarea").press("Enter")
    wait_for_gallery_images(page, 1)
    assert page.input_value("#prompt textarea") == "a red circle on a white background"  # no new line typed


def start_long_run(page) -> None:
    """LONG_RUN_IMAGES images of 50 steps at 128x128 (seconds on CPU); returns once the first is shown."""
    page.fill("#prompt textarea", "a green triangle on a black background")
    choose(page, "resolution", "1:1 \u00b7 128x128")
    page.click("#advanced button.label-wrap")
    set_slider(page, "steps", 50)
    set_slider(page, "num-images", LONG_RUN_IMAGES)
    page.click("#generate")
    wait_for_gallery_images(page, 1)


def test_stop_ends_a_long_run_with_a_message(open_page):
    page, _, _ = open_page()
    start_long_run(page)
    page.wait_for_function("document.querySelector('#bucket-status').innerText.includes('device busy')")
    shown_at_click = page.locator(GALLERY_IMAGES).count()
    page.click("#stop")
    assert shown_at_click < LONG_RUN_IMAGES, "the run ended before Stop: the test needs a longer one"
    page.get_by_text("Stopped").first.wait_for(state="visible", timeout=20_000)
    # the panel's device line turns idle once the run ended; a run that ignored Stop would only
    # get there after its last image
    page.wait_for_function("document.querySelector('#bucket-status').innerText.includes('device idle')",
                           timeout=30_000)
    page.wait_for_timeout(500)
    assert 1 <= page.locator(GALLERY_IMAGES).count() < LONG_RUN_IMAGES
    # the device is free again: the next request runs
    set_slider(page, "steps", 2)
    set_slider(page, "num-images", 1)
    first_before = page.eval_on_selector(GALLERY_IMAGES, "img => img.src")
    page.click("#generate")
    page.wait_for_function("""([selector, before]) => {
        const images = document.querySelectorAll(selector);
        return images.length === 1 && images[0].src !== before && images[0].naturalWidth === 128;
      }""", arg=[GALLERY_IMAGES, first_before], timeout=30_000)


# Records the live preview's alt text on every DOM mutation: window.__previews.
OBSERVE_PREVIEW = """() => {
  window.__previews = [];
  const record = () => {
    const img = document.querySelector('#live-preview img');
    if (img && img.alt !== window.__previews[window.__previews.length - 1]) window.__previews.push(img.alt);
  };
  new MutationObserver(record).observe(document.querySelector('#live-preview'),
                                       {childList: true, subtree: true, attributes: true});
}"""


def test_live_preview_shows_beside_the_gallery_and_clears_when_an_image_lands(open_page):
    page, blocked, errors = open_page()
    page.fill("#prompt textarea", "a green triangle on a black background")
    choose(page, "resolution", "1:1 \u00b7 128x128")
    page.click("#advanced button.label-wrap")
    set_slider(page, "steps", 50)
    set_slider(page, "num-images", 4)
    page.evaluate(OBSERVE_PREVIEW)
    page.click("#generate")
    wait_for_gallery_images(page, 4)
    previews = page.evaluate("window.__previews")
    assert previews and all(re.fullmatch(r"preview \u00b7 image [1-4] \u00b7 step \d+/50", alt) for alt in previews), previews
    assert page.locator(GALLERY_IMAGES).count() == 4  # previews never enter the gallery
    page.wait_for_function("!document.querySelector('#live-preview img')", timeout=10_000)  # cleared at the end
    assert blocked == [] and errors == []


@pytest.mark.parametrize("color_scheme", ["light", "dark"])
def test_phone_width_has_no_horizontal_scroll_and_text_reads(open_page, color_scheme):
    page, _, _ = open_page(width=375, height=812, color_scheme=color_scheme)
    page.fill("#prompt textarea", "a small blue square at the top left")
    page.click("#generate")
    wait_for_gallery_images(page, 2)
    # the results sit below the example list on a phone: Generate brought them into view
    top, bottom = page.evaluate("[document.querySelector('#gallery').getBoundingClientRect().top,"
                                " document.querySelector('#gallery').getBoundingClientRect().bottom]")
    assert top < 812 * 0.75 and bottom > 812 * 0.25, f"the gallery spans {top}-{bottom} px of an 812 px screen"
    page.wait_for_timeout(1200)  # the bucket table (the widest element) refreshed
    width = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert width[0] <= width[1], f"horizontal scroll at 375 px: scrollWidth {width[0]} > clientWidth {width[1]}"
    assert page.evaluate("document.body.classList.contains('dark')") == (color_scheme == "dark")
    contrasts = page.evaluate(CONTRASTS, ["#demo-header h1", "#demo-header .chip", "#run-details p",
                                          "#bucket-status td", "#prompt textarea", "#generate"])
    low = {selector: ratio for selector, ratio in contrasts.items() if ratio < 4.5}
    assert not low, f"text below WCAG AA contrast (4.5) in the {color_scheme} theme: {low}"


# WCAG contrast ratio of each element's text colour against the first opaque background behind it
# (an opaque gradient stop counts).
CONTRASTS = """(selectors) => {
  const rgb = (text) => (text.match(/[\\d.]+/g) || []).map(Number);
  const luminance = ([r, g, b]) => {
    const channel = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b);
  };
  const background = (element) => {
    for (let e = element; e; e = e.parentElement) {
      const style = getComputedStyle(e);
      for (const stop of style.backgroundImage.match(/rgba?\\([^)]*\\)/g) || []) {
        const [r, g, b, a = 1] = rgb(stop);  // an opaque gradient stop (e.g. the Generate button)
        if (a === 1) return [r, g, b];
      }
      const [r, g, b, a = 1] = rgb(style.backgroundColor);
      if (a > 0.9) return [r, g, b];
    }
    return [255, 255, 255];
  };
  const result = {};
  for (const selector of selectors) {
    const element = document.querySelector(selector);
    if (!element) { result[selector] = 0; continue; }
    const [l1, l2] = [luminance(rgb(getComputedStyle(element).color)), luminance(background(element))];
    result[selector] = Math.round(100 * (Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05)) / 100;
  }
  return result;
}"""
