"""An independent accessibility audit, keyboard reach, and a page that looks finished before first use.

axe-core (the engine of browsers' own audit tools; its JavaScript comes from the installed
``axe-playwright-python`` wheel, a local file, never a CDN) runs in headless Debian Chromium on the
real page served by the real app on loopback: desktop and 375 px, light and dark, before any run,
after a generation, after Compare modes and another generation (the history then holds a run), and
with Advanced, About and the chart's figures open. Rules: WCAG 2.0 and 2.1, levels A and AA. Any
serious or critical violation fails, unless it sits in Gradio's own markup, cannot be fixed from the
app and is listed in ``GRADIO_OWN`` with the reason (docs/accessibility.md lists the same), so a new
one fails. The same app and browser fixtures as test_browser.py.
"""

from __future__ import annotations

from pathlib import Path

import axe_playwright_python
import pytest

from browser_support import CHROMIUM, GALLERY_IMAGES, gallery_sources, wait_for_gallery_images
from test_browser import app_url, browser, open_page  # noqa: F401 - fixtures shared with test_browser
from test_browser_compare import CHART_BARS, COMPARE_IMAGES, compare

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason=f"{CHROMIUM} missing: install Debian's chromium (scripts/test.sh does)")

AXE_JS = (Path(axe_playwright_python.__file__).parent / "axe.min.js").read_text(encoding="utf-8")
WCAG_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
BLOCKING = {"serious", "critical"}
#: (axe rule, selector) of violations in Gradio's own markup that the app cannot change -> why.
#: Empty today: every one axe found was fixable from the app (docs/accessibility.md says how).
GRADIO_OWN: dict[tuple[str, str], str] = {}
PHONE = {"width": 375, "height": 812}
DESKTOP = {"width": 1280, "height": 900}

RUN_AXE = """(tags) => axe.run(document, {runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']})"""


#: the page at rest: no block in Gradio's pending state (drawn at opacity 0.2 while an event that
#: updates it runs, e.g. the header's load event on a busy machine) and no finite CSS transition or
#: animation under way; axe would read the colours half-way
SETTLED = """() => !document.querySelector('.pending') && document.getAnimations().every(
  a => a.playState !== 'running' || a.effect.getComputedTiming().iterations === Infinity)"""


def audit(page) -> list[str]:
    """axe-core's serious and critical WCAG 2.0/2.1 A/AA violations on the page once it is at rest (SETTLED),
    minus GRADIO_OWN."""
    page.wait_for_function(SETTLED, timeout=30_000)
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.evaluate(AXE_JS)
    found = []
    for violation in page.evaluate(RUN_AXE, WCAG_TAGS)["violations"]:
        if violation["impact"] not in BLOCKING:
            continue
        for node in violation["nodes"]:
            selector = " ".join(str(part) for part in node["target"])
            if (violation["id"], selector) not in GRADIO_OWN:
                summary = " ".join((node.get("failureSummary") or "").split())
                found.append(f"{violation['id']} ({violation['impact']}) at {selector}: {node['html'][:160]} -- "
                             f"{summary[:300]}")
    return found


def test_the_audit_sees_a_violation_when_there_is_one(open_page):
    """axe really runs and its findings reach the assertion: a grey-on-white line added to the page fails."""
    page, _, _ = open_page()
    page.evaluate("""() => { const p = document.createElement('p'); p.id = 'faint';
        p.style.cssText = 'color: #cccccc; background: #ffffff'; p.textContent = 'faint text';
        document.querySelector('#prompt').after(p); }""")
    page.wait_for_timeout(500)  # painted
    found = audit(page)
    assert any(line.startswith("color-contrast (serious) at #faint") for line in found), found


def generate(page, prompt: str, images: int) -> list[str]:
    """Generate and wait for this run's images (new files, decoded); returns their captions."""
    earlier = gallery_sources(page)
    page.fill("#prompt textarea", prompt)
    page.click("#generate")
    wait_for_gallery_images(page, images, timeout_ms=120_000, replacing=earlier)
    page.wait_for_function("([selector, count]) => document.querySelectorAll(selector).length === count",
                           arg=[GALLERY_IMAGES, images])
    return page.eval_on_selector_all("#gallery .caption-label", "labels => labels.map(l => l.innerText)")


def visible(page, selector: str) -> bool:
    return page.locator(selector).first.is_visible() if page.locator(selector).count() else False


def test_first_use_shows_the_prompt_generate_and_examples_without_empty_boxes(open_page):
    """Runs first in the module: a fresh server, no run yet (the speed chart has no bar either)."""
    for size in (PHONE, DESKTOP):
        page, blocked, errors = open_page(**size)
        page.wait_for_timeout(1500)  # a timer tick: the chart and the bucket table refreshed
        for empty in ("#gallery", "#compare-gallery", "#history", "#speed-chart", "#reuse", "#compare-json"):
            assert not visible(page, empty), f"{empty} shows before first use at {size['width']} px"
        invitation = page.locator("#compare-summary .compare-empty")
        assert invitation.is_visible() and "Compare" in invitation.inner_text()
        # the first screen: prompt, Generate and the examples row, with nothing empty between them
        bottom = lambda selector: page.eval_on_selector(selector, "e => e.getBoundingClientRect().bottom")  # noqa: E731
        first_example = "#examples button"
        for selector in ("#prompt", "#generate", "#compare", "#stop", first_example):
            assert visible(page, selector) and bottom(selector) <= size["height"], f"{selector} below the first screen"
        assert bottom("#generate") < bottom(first_example)
        assert blocked == [] and errors == []


def test_history_shows_earlier_runs_only(open_page):
    page, blocked, errors = open_page()
    first = generate(page, "a red circle on a white background", 2)
    page.wait_for_timeout(1000)  # the history's update after the run
    assert not visible(page, "#history"), "the run in the gallery is repeated in the history"
    compare(page)
    page.wait_for_timeout(1000)
    assert page.locator("#history .grid-container img").count() == 0  # the comparison is on show, the run too
    second = generate(page, "a small blue square at the top left", 2)
    page.wait_for_function("document.querySelectorAll('#history .grid-container img').length === 2", timeout=30_000)
    captions = page.eval_on_selector_all("#history .caption-label", "labels => labels.map(l => l.innerText)")
    # the first run (its seeds, in its captions), not the second, which is in the gallery
    assert sorted(captions) == sorted(first) and not set(captions) & set(second)
    assert page.locator(COMPARE_IMAGES).count() == 3
    assert blocked == [] and errors == []


@pytest.mark.parametrize("color_scheme", ["light", "dark"])
@pytest.mark.parametrize("size", [DESKTOP, PHONE], ids=["desktop", "375px"])
def test_axe_finds_no_serious_wcag_violation(open_page, size, color_scheme):
    page, blocked, errors = open_page(**size, color_scheme=color_scheme)
    assert page.evaluate("document.body.classList.contains('dark')") == (color_scheme == "dark")
    page.wait_for_timeout(1000)
    found = {"before any run": audit(page)}
    generate(page, "a red circle on a white background", 2)
    page.wait_for_timeout(1200)  # the history, chart and bucket table refreshed
    found["after a generation"] = audit(page)
    compare(page)
    page.wait_for_function(f"document.querySelectorAll('{CHART_BARS}').length >= 3", timeout=30_000)
    generate(page, "a small blue square at the top left", 2)  # the first run moves to the history
    page.wait_for_function("document.querySelectorAll('#history .grid-container img').length >= 2", timeout=30_000)
    found["after Compare modes and a second generation"] = audit(page)
    page.click("#advanced button.label-wrap")
    page.click("#about button.label-wrap")
    page.wait_for_function("document.querySelector('#about-facts')?.innerText.includes('Compile cache')")
    # the page keeps the figures open through the timer's refresh (test_the_figures_stay_open_...)
    page.click("#speed-figures summary")
    page.wait_for_selector("#speed-figures table", state="visible", timeout=5_000)
    found["with Advanced, About and the chart's figures open"] = audit(page)
    failures = {state: nodes for state, nodes in found.items() if nodes}
    assert not failures, f"axe-core, {size['width']} px, {color_scheme}:\n" + "\n".join(
        f"  {state}:\n    " + "\n    ".join(nodes) for state, nodes in failures.items())
    assert blocked == [] and errors == []


FIGURE_IMAGES = """() => [...document.querySelectorAll('#speed-figures tbody td:last-child')]
    .reduce((sum, cell) => sum + Number(cell.textContent), 0)"""


def test_the_figures_stay_open_when_a_run_refreshes_them(open_page):
    """The timer replaces the table's HTML after every run; a visitor who opened it keeps it open."""
    page, blocked, errors = open_page()
    generate(page, "a red circle on a white background", 2)  # the page's default count; may compile first
    generate(page, "a red circle on a white background", 2)  # warm: the chart and its table have figures
    page.wait_for_function(f"({FIGURE_IMAGES})() >= 2", timeout=30_000)
    page.click("#speed-figures summary")
    page.wait_for_selector("#speed-figures table", state="visible", timeout=5_000)
    counted = page.evaluate(FIGURE_IMAGES)
    generate(page, "a small blue square at the top left", 2)
    page.wait_for_function(f"({FIGURE_IMAGES})() >= {counted + 2}", timeout=30_000)  # a new table arrived
    assert page.evaluate("document.querySelector('details.speed-figures').open")
    assert page.locator("#speed-figures table").is_visible()
    page.click("#speed-figures summary")  # closed by the visitor: the next refresh leaves it closed
    generate(page, "a green triangle", 2)
    page.wait_for_function(f"({FIGURE_IMAGES})() >= {counted + 4}", timeout=30_000)
    assert not page.evaluate("document.querySelector('details.speed-figures').open")
    assert blocked == [] and errors == []


ACTIVE = """() => { const e = document.activeElement; const owner = e.closest('[id]');
  return {id: e.id, owner: owner ? owner.id : '', thumbnail: e.matches('#gallery .thumbnail-item'),
          example: e.matches('#examples button'), text: e.innerText}; }"""


def tab_to(page, test, limit: int = 60, key: str = "Tab") -> dict:
    """Press Tab until the focused element passes ``test``; fails after ``limit`` presses."""
    seen = []
    for _ in range(limit):
        page.keyboard.press(key)
        active = page.evaluate(ACTIVE)
        if test(active):
            return active
        seen.append(active["id"] or active["owner"])
    raise AssertionError(f"not reached with {key}: focus went through {seen}")


def test_keyboard_reaches_generate_stop_compare_examples_and_the_gallery_actions(open_page):
    page, blocked, errors = open_page()
    page.focus("#prompt textarea")
    example = tab_to(page, lambda a: a["example"])  # the examples are buttons: Enter fills the prompt
    page.keyboard.press("Enter")
    # the label may start with the bucket and count it sets ("96x64 \u00b7 ...") and end cut ("...")
    shown = example["text"].split(" \u00b7 ")[-1].removesuffix("...")
    page.wait_for_function("(shown) => document.querySelector('#prompt textarea').value.startsWith(shown)", arg=shown)
    page.fill("#prompt textarea", "")
    page.focus("#prompt textarea")
    page.keyboard.type("a green triangle on a black background")
    tab_to(page, lambda a: a["id"] == "generate")
    page.keyboard.press("Enter")
    wait_for_gallery_images(page, 1, timeout_ms=120_000)  # (the example may have set the number of images)
    tab_to(page, lambda a: a["id"] == "compare")
    tab_to(page, lambda a: a["id"] == "stop")
    # the gallery's images are buttons: Enter on one selects it, then "Reuse settings" restores its prompt
    page.fill("#prompt textarea", "something else")
    page.focus("#prompt textarea")
    tab_to(page, lambda a: a["thumbnail"])
    page.keyboard.press("Enter")
    tab_to(page, lambda a: a["id"] == "reuse")
    page.keyboard.press("Enter")
    page.wait_for_function("document.querySelector('#prompt textarea').value === 'a green triangle on a black background'",
                           timeout=15_000)
    assert blocked == [] and errors == []
