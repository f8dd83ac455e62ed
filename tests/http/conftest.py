"""What the in-process HTTP tests share: `client`, the app over the fake model (one per module).

A module whose app is built differently overrides `serve` (how the app is served), never
`client` itself; a module that needs a client of another kind names it differently."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest
from helpers.inprocess import serving
from starlette.testclient import TestClient


@pytest.fixture(scope="module")
def serve() -> Callable[[], AbstractContextManager[TestClient]]:
    """The app's defaults (helpers.inprocess.build): two slots over the fake model's "hello"."""
    return serving


@pytest.fixture(scope="module")
def client(serve: Callable[[], AbstractContextManager[TestClient]]) -> Iterator[TestClient]:
    with serve() as c:
        yield c
