"""A real headless Chromium for the browser tests (Debian's package, driven by playwright):
fixtures that test modules import by name (a conftest.py here would shadow tests/conftest.py,
which other test modules import as ``conftest``).

Chromium comes from scripts/install-chromium (root and apt; .ci/run calls it); a browser
that playwright would download cannot be fetched on these machines, so playwright drives
the system one (``executable_path``).  Without it the browser tests skip and say how to
enable them.  ``SHOAL_SCREENSHOTS=DIR`` saves each page's screenshot there (docs/img).
"""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic", "--disable-gpu",
                 "--disable-dev-shm-usage"]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


@contextlib.contextmanager
def chromium(profile, extra_args=(), **options):
    """A headless Chromium context (playwright's persistent context) on the profile folder
    ``profile``, with ``CHROMIUM_ARGS`` and ``extra_args``; the calling test skips, saying how
    to enable it, when Chromium or playwright is absent."""
    path = chromium_path()
    if path is None:
        pytest.skip("Chromium is not installed: run scripts/install-chromium (needs root and apt) "
                    "to enable the browser tests")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed: pip install 'shoal[dev]'")
    with sync_api.sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(profile), executable_path=path, headless=True, args=[*CHROMIUM_ARGS, *extra_args],
            **options)
        ctx.set_default_timeout(30_000)
        try:
            yield ctx
        finally:
            ctx.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One headless Chromium per module, with a fresh profile; a new page per test."""
    with chromium(tmp_path_factory.mktemp("chromium-profile"),
                  viewport={"width": 1400, "height": 800}) as ctx:
        yield ctx


@pytest.fixture
def page(browser):
    p = browser.new_page()
    try:
        yield p
    finally:
        p.close()


def screenshot(page, name: str) -> None:
    folder = os.environ.get("SHOAL_SCREENSHOTS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        page.screenshot(path=os.path.join(folder, name), full_page=True)
