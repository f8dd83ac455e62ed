"""What the browser tests share: one Debian chromium per test module (Playwright, no browser
download), and pages that fail their test on a console error or a CSP violation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    from helpers import browser as browser_util  # here: Playwright only where a browser test runs

    with browser_util.browser() as b:
        yield b


@pytest.fixture
def page_of(chromium: Any) -> Iterator[Any]:
    """open(url, **kw) -> Watched; every page is checked for errors and closed at the end."""
    from helpers.browser import Watched, open_page

    pages: list[Watched] = []

    def open_(url: str, **kw: Any) -> Watched:
        w = open_page(chromium, url, **kw)
        pages.append(w)
        return w

    yield open_
    for w in pages:
        w.close()
