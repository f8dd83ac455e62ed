"""A pytest plugin compat/llama-suite.sh loads into llama.cpp's server tests (-p): their
session fixture ServerPreset.load_all() starts every preset's server once, to download its
model. The appliance serves the bundled model whatever a test names (llama-server-shim.py), so
there is nothing to download, and the presets it refuses (embeddings, reranking, the router)
would end the session before its first test. The tests and their assertions are unchanged."""

from __future__ import annotations

from typing import Any


def pytest_sessionstart(session: Any) -> None:
    import utils  # the suite's tests/utils.py, on the path once its conftest is loaded

    utils.ServerPreset.load_all = staticmethod(lambda: None)
