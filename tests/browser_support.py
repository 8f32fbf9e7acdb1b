"""Real-browser helpers shared by the browser tests and scripts/screenshot.py.

Debian's Chromium (``apt-get install chromium``) driven by Python Playwright: never
``playwright install`` (it downloads a browser). The flags keep Chromium itself off the
network; the route guard proves the page makes no request beyond loopback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from app_runner import free_port, start_app, stop_app  # noqa: F401 - re-exported for the browser tests and scripts

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}

#: The gallery's finished images (live previews are shown apart, in #live-preview).
GALLERY_IMAGES = '#gallery .grid-container img'


def launch_chromium(playwright: Any) -> Any:
    """Headless Debian Chromium; each ``browser.new_context()`` is a fresh, empty profile."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)


def guard_network(context: Any) -> list[str]:
    """Abort every request to a non-loopback host; returns the (live) list of blocked URLs."""
    blocked: list[str] = []

    def route(route: Any) -> None:
        url = route.request.url
        scheme = urlparse(url).scheme
        if scheme in ("data", "blob") or urlparse(url).hostname in LOOPBACK_HOSTS:
            route.continue_()
        else:
            blocked.append(url)
            route.abort()

    context.route("**/*", route)
    return blocked


def gallery_sources(page: Any) -> list[str]:
    """The gallery images' URLs now: pass them as ``replacing`` to wait for the next run's images."""
    return page.eval_on_selector_all(GALLERY_IMAGES, "images => images.map(img => img.src)")


def wait_for_gallery_images(page: Any, count: int, timeout_ms: float = 60_000,
                            replacing: list[str] | None = None) -> list[dict]:
    """Wait until ``count`` gallery images exist and are decoded; returns their natural sizes.

    With ``replacing`` (an earlier run's ``gallery_sources``), only images not among them count: a second
    run's images stream in one by one, so without it the first run's images would satisfy the wait.
    """
    page.wait_for_function(
        """([selector, count, replacing]) => {
             const images = [...document.querySelectorAll(selector)].filter(img => !replacing.includes(img.src));
             return images.length >= count && images.every(img => img.complete && img.naturalWidth > 0);
           }""", arg=[GALLERY_IMAGES, count, replacing or []], timeout=timeout_ms)
    return page.eval_on_selector_all(
        GALLERY_IMAGES, "images => images.map(img => ({width: img.naturalWidth, height: img.naturalHeight}))")
