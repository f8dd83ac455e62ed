from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

# Test helpers (fakes.py, live.py) are imported by name.
sys.path.insert(0, str(Path(__file__).parent))

from helpers.live import Live, bundled, live_server, own_mount  # noqa: E402

# Tests live with the package they test; the kind of test is a mark. A test that starts the real
# model (by its file name, *_live.py or *_browser.py, or by a fixture it uses) must carry the mark,
# or `-m "not integration and not browser"` (the README's quick run) would pick it up.
REAL_MODEL = frozenset({"bundled_model"})  # every live server fixture and factory depends on it
BROWSER = frozenset({"chromium", "page_of"})


def missing_marks(item: pytest.Item) -> list[str]:
    """The marks this test needs by its file's name and the fixtures it uses, and lacks."""
    used = set(getattr(item, "fixturenames", ()))
    stem = item.path.stem
    browser = stem.endswith("_browser") or bool(used & BROWSER)
    integration = browser or stem.endswith("_live") or bool(used & REAL_MODEL)
    wanted = ["integration"] * integration + ["browser"] * browser
    return [mark for mark in wanted if not item.get_closest_marker(mark)]


@pytest.hookimpl(tryfirst=True)  # before -m deselects: a filtered run checks its files too
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unmarked = [f"{item.nodeid} (needs {' and '.join(missing)})" for item in items if (missing := missing_marks(item))]
    if unmarked:
        raise pytest.UsageError("a test named *_live.py or *_browser.py, or using the real model (bundled_model, "
                                "a live server) or the browser (chromium, page_of), must be marked integration "
                                "(and browser): pytestmark = [pytest.mark.integration, pytest.mark.browser]. "
                                "Unmarked: " + ", ".join(unmarked))


@pytest.fixture(scope="session")
def bundled_model() -> Path:
    """The real model (helpers.live.bundled). A test that starts a server asks for it, directly
    or through the fixtures below: that use is what marks it as needing the integration mark."""
    return bundled()


@pytest.fixture(scope="session")
def server(bundled_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """One shared server for the API tests; a small context keeps overflow tests quick."""
    with live_server(tmp_path_factory.mktemp("server"), model=bundled_model,
                     slots=8, ctx_per_slot=1024, kv_tokens=8192, max_tokens_limit=512) as live:
        yield live


@pytest.fixture
def start_server(bundled_model: Path, tmp_path: Path) -> Iterator[Callable[..., Live]]:
    """start_server(**config) -> a server of the test's own (helpers.live.live_server; with
    `state`, on that state directory; `mounted`, in a mount namespace of its own; `read_only`,
    that directory read-only from the start); every one is stopped when the test ends, its exit
    code the test's to check (some are killed or broken on purpose)."""
    with ExitStack() as stack:
        def run(*, state: Path | None = None, mounted: bool = False, read_only: bool = False,
                **config: Any) -> Live:
            if state is not None:
                config["state_dir"] = state
            prefix = own_mount(state, read_only) if (mounted or read_only) and state is not None else ()
            return stack.enter_context(live_server(tmp_path, model=bundled_model, prefix=prefix, check_exit=False,
                                                       **config))

        yield run


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """One PostgreSQL cluster for the session's tests on it (a fresh database per test)."""
    from helpers.postgres import INSTALL, cluster, pg_bin

    if pg_bin() is None:
        pytest.skip(f"no PostgreSQL server: install it with  {INSTALL}")
    with cluster() as url:
        yield url


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
