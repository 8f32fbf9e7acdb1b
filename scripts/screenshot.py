"""Regenerate assets/screenshot.png from the real page after a real generation.

Starts the app on a free loopback port (embedded tiny model by default), waits for the start
model's buckets to warm, then in headless Debian Chromium types a prompt, fixes the seed,
presses Generate and waits for every image, then presses Compare modes and waits for the three
modes and the speed chart before taking the shot. Run it whenever the UI
changes:

    python scripts/screenshot.py                       # assets/screenshot.png, light theme
    python scripts/screenshot.py --theme dark --out /tmp/dark.png
    python scripts/screenshot.py --before-use --out assets/screenshot-first-use.png          # before any run
    python scripts/screenshot.py --before-use --width 375 --height 812 --viewport-only \
        --out assets/screenshot-first-use-phone.png                                        # a phone's first screen
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # no chips needed for a screenshot
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import tpu_demo  # noqa: E402,F401 - offline environment defaults before gradio is imported

from tpu_demo.core.examples import example_prompts  # noqa: E402
from browser_support import guard_network, launch_chromium, start_app, stop_app, wait_for_gallery_images  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "assets" / "screenshot.png")
    parser.add_argument("--model", default=None, help="model to show (default: the app's start model)")
    parser.add_argument("--prompt", default=None, help="default: the model's first example prompt")
    parser.add_argument("--mode", default=None, help="execution mode at start, e.g. compiled: the Buckets panel then "
                                                      "shows each bucket's compile (default: the app's)")
    parser.add_argument("--num-images", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--theme", choices=("light", "dark"), default="light")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--viewport-only", action="store_true", help="capture only the first screen, not the page")
    parser.add_argument("--no-compare", action="store_true", help="skip Compare modes before the shot")
    parser.add_argument("--before-use", action="store_true", help="shoot the page as a visitor first sees it: no "
                                                                   "prompt typed, nothing run")
    parser.add_argument("--cache-dir", default=None, help="the app's --cache-dir (default: the app's)")
    return parser.parse_args()


def wait_for_warm_buckets(app, model_id: str, timeout_s: float = 300.0) -> None:
    """Let start-up warmup finish so the bucket panel shows warm buckets with compile times."""
    expected = len(app.engine.spec(model_id).buckets)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        warm = [b for b in app.engine.status().buckets if b.model == model_id and b.state.value in ("warm", "failed")]
        if len(warm) >= expected:
            return
        time.sleep(0.5)
    print(f"warning: warmup of {model_id} not finished after {timeout_s:.0f}s; shooting anyway", file=sys.stderr)


def main() -> None:
    from playwright.sync_api import sync_playwright

    args = parse_args()
    flags = ["--compile-backend", "aot_eager", "--threads", "1"]
    flags += ["--model", args.model] if args.model else []
    flags += ["--mode", args.mode] if args.mode else []
    flags += ["--cache-dir", args.cache_dir] if args.cache_dir else []
    app, url = start_app(*flags)
    try:
        model_id = app.ui.settings.start_model
        prompt = args.prompt or next(iter(example_prompts(app.engine.spec(model_id))), "a red circle")
        wait_for_warm_buckets(app, model_id)
        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            context = browser.new_context(viewport={"width": args.width, "height": args.height},
                                          color_scheme=args.theme)
            blocked = guard_network(context)
            page = context.new_page()
            page.goto(url)
            page.wait_for_selector("#examples", state="visible")
            if not args.before_use:
                use_the_page(page, args, prompt)
            shoot(page, args)
            browser.close()
        if blocked:
            raise SystemExit(f"the page requested non-loopback hosts: {blocked}")
        print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")
    finally:
        stop_app(app)


def use_the_page(page, args: argparse.Namespace, prompt: str) -> None:
    """Generate with a fixed seed, then (unless --no-compare) Compare modes and wait for the chart."""
    page.fill("#prompt textarea", prompt)
    page.click("#advanced button.label-wrap")  # open "Advanced" so the shot shows every control
    page.get_by_label("Randomize seed").uncheck()
    page.get_by_label("Seed", exact=True).fill(str(args.seed))
    page.fill("#num-images input[type=number]", str(args.num_images))
    page.press("#num-images input[type=number]", "Tab")
    page.click("#generate")
    wait_for_gallery_images(page, args.num_images, timeout_ms=120_000)
    if not args.no_compare:
        page.click("#compare")
        page.wait_for_function("""() => document.querySelectorAll('#compare-gallery .grid-container img').length === 3
            && document.querySelector('#compare-summary').innerText.includes('Warm against warm')""",
                               timeout=300_000)
        page.wait_for_function("document.querySelectorAll('#speed-chart svg .mark-rect path').length >= 3",
                               timeout=30_000)


def shoot(page, args: argparse.Namespace) -> None:
    page.wait_for_timeout(1500)  # one status-panel refresh and the progress bar gone
    page.mouse.move(0, 0)
    page.evaluate("document.activeElement && document.activeElement.blur()")  # no focus ring, no caret
    args.out.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(args.out), full_page=not args.viewport_only)


if __name__ == "__main__":
    main()
