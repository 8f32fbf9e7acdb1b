"""What previews cost a visitor of the page: the same figure as ``benchmarks.previews``, in Chromium.

``python -m benchmarks.previews_browser [--pairs 6]`` starts ``app.py`` in its own process with
the embedded default, opens the page in headless Debian Chromium (Playwright; never
``playwright install``) and clicks Generate with "Live previews" off and on in interleaved pairs
(2 images, 12 steps, 64x64). Per request it times the click until both finished images are
decoded in the gallery (the browser renders every update too), and reads each image's denoise
time from its caption (two decimals). Reports median ratios on / off and the spread.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from benchmarks.previews import DEFAULT_CASES, _ratio_summary, app_flags, app_process

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# (an app from before the live preview had its own output showed it as a gallery item captioned "preview ...")
FINISHED = '#gallery .grid-container img:not([alt^="preview"])'
PROMPT = "a red circle on a white background"


def _finished(page: Any) -> list[str]:
    return page.eval_on_selector_all(FINISHED, "images => images.filter(i => i.complete && i.naturalWidth > 0)"
                                               ".map(i => i.alt)")


def _one_request(page: Any, images: int) -> dict[str, Any]:
    before = set(_finished(page))
    started = time.perf_counter()
    page.click("#generate")
    page.wait_for_function(
        """([selector, count, before]) => {
             const done = [...document.querySelectorAll(selector)]
               .filter(i => i.complete && i.naturalWidth > 0 && !before.includes(i.alt));
             return done.length >= count;
           }""", arg=[FINISHED, images, sorted(before)], timeout=120_000, polling="raf")
    seconds = time.perf_counter() - started
    captions = [alt for alt in _finished(page) if alt not in before]
    denoise = [float(m.group(1)) for m in (re.search(r"denoise ([0-9.]+)s", c) for c in captions) if m]
    return {"seconds": seconds, "denoise": denoise}


def measure(url: str, pairs: int, images: int = 2) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url)
            page.fill("#prompt textarea", PROMPT)
            page.click("#advanced button.label-wrap")
            previews = page.get_by_label("Live previews while denoising")
            runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
            for index in range(pairs + 1):  # the first pair warms the bucket and the preview fit
                for on in ((False, True) if index % 2 == 0 else (True, False)):
                    previews.set_checked(on)
                    run = _one_request(page, images)
                    if index:
                        runs[on].append(run)
        finally:
            browser.close()
    denoise_on = [d for run in runs[True] for d in run["denoise"]]
    denoise_off = [d for run in runs[False] for d in run["denoise"]]
    return {"pairs": pairs, "denoise_per_image": _ratio_summary(denoise_on, denoise_off),
            "whole_request": _ratio_summary([r["seconds"] for r in runs[True]], [r["seconds"] for r in runs[False]])}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.previews_browser", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "tpu-demo")
    parser.add_argument("--app-repo", type=Path, default=None, help="run app.py from another checkout")
    args = parser.parse_args(argv)
    from benchmarks.measure import free_port

    port = free_port()
    case = DEFAULT_CASES[0]  # the embedded default, the page's start model
    with tempfile.TemporaryDirectory(prefix="gradio-cache-") as gradio_cache, \
            app_process(app_flags(port, args.cache_dir, (case,), 1), port, repo=args.app_repo,
                        gradio_cache=Path(gradio_cache)) as (url, _pid):
        figures = measure(url, args.pairs, case.num_images)
    print(json.dumps(figures, indent=1))
    d, w = figures["denoise_per_image"], figures["whole_request"]
    print(f"Chromium, {case.label}: denoise per image on/off {d['ratio']:.3f}x ({d['pair_ratio_min']:.2f}-"
          f"{d['pair_ratio_max']:.2f}), click to both images {w['ratio']:.3f}x ({w['pair_ratio_min']:.2f}-"
          f"{w['pair_ratio_max']:.2f}; {w['off_ms']:.0f} -> {w['on_ms']:.0f} ms), {figures['pairs']} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
