"""Compare modes, the speed chart, history and the phone layout in headless Debian Chromium.

The same real app and browser setup as test_browser.py (its fixtures are reused): the visitor
clicks one button and sees three images, three speedups and the chart, with no console error.
"""

from __future__ import annotations

import pytest

from browser_support import CHROMIUM, gallery_sources, guard_network, start_app, stop_app, wait_for_gallery_images
from test_browser import CONTRASTS, app_url, browser, open_page  # noqa: F401 - fixtures shared with test_browser

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason=f"{CHROMIUM} missing: install Debian's chromium (scripts/test.sh does)")

COMPARE_IMAGES = "#compare-gallery .grid-container img"
CHART_BARS = "#speed-chart svg .mark-rect path"


def compare(page, prompt: str = "a red circle on a white background") -> None:
    page.fill("#prompt textarea", prompt)
    page.click("#compare")
    page.wait_for_function("""(selector) => document.querySelectorAll(selector).length === 3
        && [...document.querySelectorAll(selector)].every(img => img.complete && img.naturalWidth > 0)
        && document.querySelector('#compare-summary').innerText.includes('Warm against warm')""",
                           arg=COMPARE_IMAGES, timeout=120_000)


def test_compare_shows_three_images_speedups_and_the_chart(open_page):
    page, blocked, errors = open_page()
    compare(page)
    rows = page.eval_on_selector_all("#compare-summary tbody tr", "rows => rows.map(row => row.innerText)")
    assert len(rows) == 3
    assert [row.split("\n")[0] for row in rows] == ["strict eager", "optimized eager", "compiled"]
    speedups = page.eval_on_selector_all("#compare-summary .compare-speedup", "cells => cells.map(c => c.innerText)")
    assert len(speedups) == 3 and speedups[0] == "1.00\u00d7" and all(s.endswith("\u00d7") for s in speedups)
    summary = page.inner_text("#compare-summary")
    # off TPU the two eager modes run the same code: said in words next to the numbers
    assert "Same code here" in summary and "measurement noise" in summary
    captions = page.eval_on_selector_all("#compare-gallery .caption-label", "labels => labels.map(l => l.innerText)")
    assert [c.split(" (")[0] for c in captions] == ["strict eager", "optimized eager", "compiled"]
    # the chart draws one bar per mode once the timer has seen the comparison finish
    page.wait_for_function(f"document.querySelectorAll('{CHART_BARS}').length >= 3", timeout=10_000)
    heights = page.eval_on_selector_all(CHART_BARS, "bars => bars.map(b => b.getBBox().height)")
    assert all(height > 0 for height in heights)
    # the results are on show: the history (earlier runs only) stays hidden until a newer comparison
    assert not page.locator("#history").is_visible()
    # About this server: versions, backend, cache state and models, no file paths
    page.click("#about button.label-wrap")
    page.wait_for_function("document.querySelector('#about-facts')?.innerText.includes('Compile cache')")
    about = page.inner_text("#about-facts")
    for fact in ("Device:", "torch ", "torch-tpu ", "diffusers ", "transformers ", "gradio ", "aot_eager",
                 "inductor:", "Tiny FLUX"):
        assert fact in about
    assert "/tmp" not in about and "/root" not in about and ".cache" not in about
    assert blocked == [] and errors == []


@pytest.mark.parametrize("color_scheme", ["light", "dark"])
def test_phone_shows_results_first_without_sideways_scroll(open_page, color_scheme):
    page, blocked, errors = open_page(width=375, height=812, color_scheme=color_scheme)
    top = lambda selector: page.eval_on_selector(selector, "e => e.getBoundingClientRect().top")  # noqa: E731
    # before first use: the prompt, the buttons and the examples, then the comparison's invitation, the
    # settings after it (the empty gallery takes no room: test_accessibility.py)
    for selector in ("#examples", "#comparison", "#model"):
        page.wait_for_selector(selector)
    assert top("#prompt") < top("#generate") < top("#examples") < top("#comparison") < top("#model")
    compare(page)
    page.fill("#prompt textarea", "a small blue square at the top left")
    page.click("#generate")
    wait_for_gallery_images(page, 2)
    # the result comes right after the prompt, the buttons and the examples, the settings after it
    assert top("#examples") < top("#gallery") < top("#comparison") < top("#model")
    assert top("#compare") < top("#gallery")
    page.wait_for_timeout(1500)  # chart and bucket table refreshed
    width = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert width[0] <= width[1], f"horizontal scroll at 375 px: scrollWidth {width[0]} > clientWidth {width[1]}"
    contrasts = page.evaluate(CONTRASTS, ["#compare-summary td", "#compare-summary th", ".compare-speedup",
                                          ".compare-note", "#compare", "#speed-chart span"])
    low = {selector: ratio for selector, ratio in contrasts.items() if ratio < 4.5}
    assert not low, f"text below WCAG AA contrast (4.5) in the {color_scheme} theme: {low}"
    assert blocked == [] and errors == []


def test_negative_prompt_is_shown_only_for_models_that_take_one(open_page):
    page, _, errors = open_page()
    page.click("#advanced button.label-wrap")
    assert not page.locator("#negative-prompt").is_visible()  # tiny FLUX (guidance-distilled): none
    page.click("#model input")
    page.get_by_role("option", name="Tiny SD3 (random weights, offline)").click()
    page.locator("#negative-prompt textarea").wait_for(state="visible", timeout=10_000)
    page.fill("#negative-prompt textarea", "blurry")
    page.fill("#prompt textarea", "a green square")
    page.click("#generate")
    wait_for_gallery_images(page, 2)
    assert errors == []


def test_history_is_freed_when_the_tab_closes(browser, cache_dir):
    """Each visit's history lives in its own folder; closing the tab (Gradio's unload) removes it."""
    import time
    from pathlib import Path

    app, url = start_app("--cache-dir", str(cache_dir), "--compile-backend", "aot_eager", "--model", "tiny-flux",
                         "--models", "tiny-flux", "--no-warmup")
    try:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        guard_network(context)
        page = context.new_page()
        page.goto(url)
        for prompt in ("a red circle on a white background", "a small blue square at the top left"):
            page.fill("#prompt textarea", prompt)
            earlier = gallery_sources(page)
            page.click("#generate")
            wait_for_gallery_images(page, 2, replacing=earlier)  # (the second run: its success fills the history below)
        # the history shows the first run (earlier runs only) and keeps both runs' files
        page.wait_for_function("document.querySelectorAll('#history .grid-container img').length === 2")
        assert app.history.sessions() == 1
        [folder] = [path for path in Path(app.history.root).iterdir()]
        assert len(list(folder.iterdir())) == 4
        context.close()
        deadline = time.monotonic() + 30
        while app.history.sessions() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert app.history.sessions() == 0 and not folder.exists()
    finally:
        stop_app(app)
