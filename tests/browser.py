"""Debian's chromium, driven by Playwright, for the tests and the benchmark of the status page.

No browser is ever downloaded (`playwright install` is not run): Playwright launches
`/usr/bin/chromium`. Where it or Playwright is missing the caller is skipped, except
under CI (`CI=true`), where `.ci/run` installs chromium and a missing one FAILS.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from tests.real_parts import require

CHROMIUM = Path(os.environ.get("PADDLECLOUD_CHROMIUM", "/usr/bin/chromium"))
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def missing() -> str:
    """Why no browser can run here; "" when one can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright; no browser download)"
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    return ""


def require_browser() -> None:
    """Skips the test without a browser; fails it under CI, which must have one."""
    require(missing(), needs="a browser for the status page's test")


@contextlib.contextmanager
def chromium_page(*, width: int = 1400, height: int = 1000) -> Iterator:
    """A Playwright page in a headless Debian chromium; closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            yield page
        finally:
            browser.close()


@contextlib.asynccontextmanager
async def chromium_tab(*, width: int = 1400, height: int = 1000) -> AsyncIterator:
    """`chromium_page` for a test on an event loop (Playwright's async API)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield await browser.new_page(viewport={"width": width, "height": height})
        finally:
            await browser.close()
