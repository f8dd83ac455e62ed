"""What the live tests share beyond tests/conftest.py: servers a test starts for itself."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.live import Live, start


def own_mount(state: Path, read_only: bool = False) -> tuple[str, ...]:
    """A command prefix: the server in a mount namespace of its own, its state directory a
    bind mount there that a test may cover or make read-only (test_faults_live.py), or that
    is read-only from the start."""
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    ro = ' && mount -o remount,bind,ro "$0"' if read_only else ""
    return ("unshare", "-m", "--propagation", "private", "sh", "-c", f'mount --bind "$0" "$0"{ro} && exec "$@"',
            str(state))


@pytest.fixture
def servers(bundled_model: Path, tmp_path: Path) -> Iterator[Callable[..., Live]]:
    """Start servers on the bundled model (with `state`, on that state directory; `mounted`,
    in a mount namespace of their own); every one still running is stopped at the end."""
    started: list[Live] = []

    def run(*args: str, env: dict[str, str] | None = None, state: Path | None = None, mounted: bool = False,
            read_only: bool = False) -> Live:
        state_args = ("--state-dir", str(state)) if state is not None else ()
        prefix = own_mount(state, read_only) if (mounted or read_only) and state is not None else ()
        live = start(bundled_model, tmp_path, *args, *state_args, env=env, prefix=prefix)
        started.append(live)
        live.wait_ready()
        return live

    yield run
    for live in started:
        if live.proc.poll() is None:
            live.stop()
