"""Saved sessions through the engine (fake model): a restart restores a conversation found
by the digest of its id only, files are private and carry no id, and a state directory we
must not use, old-format files and leftovers are dealt with at start."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.fakes import FakeModel

from appliance.engine.engine import Engine, EngineOptions, EngineState, Handle
from appliance.engine.events import Delta, Done, Failed
from appliance.engine.kv import persist
from appliance.engine.kv.cache import SAVED
from appliance.engine.kv.store import CachePolicy
from appliance.engine.names import saved_key
from appliance.engine.scheduler import Limits
from appliance.sampling import SamplingParams

SECRET = "Zq3-secret_session-id-0123456789"  # what a client sends as X-Session-Id
OTHER = "another-secret-session-id-abcdef"
TURN1 = list(range(100, 130))


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


async def started(state_dir: Path, ttl_s: float = 1800.0) -> Engine:
    limits = Limits(slots=2, batch_tokens=64, kv_tokens=4096, ctx_limit=1024, max_wait_s=0.0, max_queue=8,
                    queue_timeout_s=30.0)
    eng = Engine(lambda: FakeModel(reply="ab"), EngineOptions(limits,
                 CachePolicy(n_seq=4, ttl_s=ttl_s, min_shared=4, state_dir=str(state_dir))))
    eng.start(asyncio.get_running_loop())
    await asyncio.to_thread(eng.ready.wait, 5)
    assert eng.state is EngineState.READY
    return eng


async def turn(eng: Engine, prompt: list[int], session: str) -> Done:
    h: Handle = eng.submit(prompt, SamplingParams(max_tokens=5), client="10.0.0.1", session=session)
    async for ev in h.events():
        if isinstance(ev, Failed):
            raise AssertionError(ev.error)
        if not isinstance(ev, Delta):
            return ev
    raise AssertionError("no Done")


async def stop(eng: Engine) -> None:
    await asyncio.to_thread(eng.stop)
    assert eng.state is EngineState.STOPPED


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_restart_restores_by_digest_from_private_files_without_ids(tmp_path: Path) -> None:
    state = tmp_path / "state"

    async def main() -> None:
        eng = await started(state)
        await turn(eng, TURN1, SECRET)
        await turn(eng, list(range(300, 320)), OTHER)
        await stop(eng)

        files = sorted(state.iterdir())
        assert mode(state) == 0o700 and len(files) == 2
        for f in files:
            assert mode(f) == 0o600 and f.suffix == ".kv"
            raw = f.read_bytes()
            for sid in (SECRET, OTHER):
                assert sid.encode() not in raw and sid not in f.name
        assert {f.name for f in files} == {saved_key(s)[:32] + ".kv" for s in (SECRET, OTHER)}

        eng = await started(state)
        # Known only by digest until a turn of the session claims it.
        assert set(eng.snapshot.sessions) == {SAVED + saved_key(SECRET), SAVED + saved_key(OTHER)}
        # ...and GET /v1/sessions/{id} finds it by its id all the same.
        info = eng.session_info(SECRET)
        assert info is not None and info["id"] == SECRET and info["state"] == "saved"
        assert eng.session_info("never-saved-session") is None
        end = await turn(eng, TURN1 + [ord("a"), ord("b"), 7, 8, 9], SECRET)
        assert end.cached_tokens == len(TURN1) + 2  # the saved KV, not recomputed
        assert eng.snapshot.cache_events["restored"] == 1
        assert SECRET in eng.snapshot.sessions and SAVED + saved_key(OTHER) in eng.snapshot.sessions
        # The unclaimed one is saved again under the same digest at the next shutdown.
        await stop(eng)
        assert {f.name for f in state.iterdir()} == {saved_key(s)[:32] + ".kv" for s in (SECRET, OTHER)}

        eng = await started(state)
        end = await turn(eng, list(range(300, 320)) + [ord("a"), ord("b"), 1], OTHER)
        assert end.cached_tokens == 22 and eng.snapshot.cache_events["restored"] == 1
        await stop(eng)
    run(main())


def test_a_digest_from_the_http_layer_is_hashed_again_and_matches(tmp_path: Path) -> None:
    # The HTTP layer may hand the engine an opaque sha256 hex of the id: the file must not
    # hold that string either, and the same string finds it after a restart.
    state = tmp_path / "state"
    opaque = hashlib.sha256(b"namespace\0" + SECRET.encode()).hexdigest()

    async def main() -> None:
        eng = await started(state)
        await turn(eng, TURN1, opaque)
        await stop(eng)
        (f,) = state.iterdir()
        assert opaque.encode() not in f.read_bytes() and opaque[:32] not in f.name
        eng = await started(state)
        end = await turn(eng, TURN1 + [ord("a"), ord("b"), 5], opaque)
        assert end.cached_tokens == len(TURN1) + 2
        await stop(eng)
    run(main())


def test_deleting_a_saved_session_removes_its_file(tmp_path: Path) -> None:
    state = tmp_path / "state"

    async def main() -> None:
        eng = await started(state)
        await turn(eng, TURN1, SECRET)
        await stop(eng)
        eng = await started(state)
        assert await eng.delete_session(SECRET) is True
        assert list(state.iterdir()) == []
        assert await eng.delete_session(SECRET) is False
        await stop(eng)
        assert list(state.iterdir()) == []
    run(main())


def test_saved_session_expires_and_its_file_goes(tmp_path: Path) -> None:
    state = tmp_path / "state"

    async def main() -> None:
        eng = await started(state)
        await turn(eng, TURN1, SECRET)
        await stop(eng)
        eng = await started(state, ttl_s=0.3)
        deadline = asyncio.get_running_loop().time() + 5
        # The file goes during a loop iteration; the snapshot that shows it gone follows.
        while any(state.iterdir()) or eng.snapshot.sessions:
            assert asyncio.get_running_loop().time() < deadline, "saved session never expired"
            await asyncio.sleep(0.1)
        end = await turn(eng, TURN1 + [ord("a"), ord("b"), 5], SECRET)
        assert end.cached_tokens == 0
        await stop(eng)
    run(main())


def test_older_format_and_leftover_files_are_removed_at_start(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)  # as an older version left it
    header = b'{"session": "%s", "tokens": [1, 2], "shared_len": 0, "idle_s": 1.0}' % SECRET.encode()
    old = state / "0123456789abcdef0123456789abcdef.kv"
    old.write_bytes(persist.FAMILY + b"\x01" + len(header).to_bytes(4, "little") + header + b"state")
    tmp = state / ".0123456789abcdef0123456789abcdef.kv.a1b2c3d4e5f6.tmp"
    tmp.write_bytes(b"half a file")

    async def main() -> None:
        with caplog.at_level(logging.INFO):
            eng = await started(state)
        assert list(state.iterdir()) == [] and mode(state) == 0o700
        assert eng.snapshot.sessions == {}
        await stop(eng)
    run(main())
    log = caplog.text
    assert "discarded 1 session files of an older format" in log
    assert "removed 1 temporary session files left by an interrupted save" in log
    assert "had mode 0755: set to 0700" in log
    assert SECRET not in log


def test_a_symlinked_state_dir_is_refused_with_a_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    state = tmp_path / "state"
    state.symlink_to(real)

    async def main() -> None:
        with caplog.at_level(logging.INFO):
            eng = await started(state)
            await turn(eng, TURN1, SECRET)  # serving is unaffected
            await stop(eng)
    run(main())
    assert list(real.iterdir()) == []
    assert f"not restoring saved sessions: state_dir {state} is a symbolic link" in caplog.text
    assert f"could not save sessions to {state}: state_dir {state} is a symbolic link" in caplog.text


def test_a_turn_without_a_session_never_claims_one_saved_by_the_last_run(tmp_path: Path) -> None:
    # In-process callers may submit without a session: each run names those turns afresh,
    # so the first such turn after a restart is not handed the last run's first (which may
    # be another caller's conversation: its KV would be reused as the new turn's own).
    state = tmp_path / "state"

    async def anonymous(eng: Engine, prompt: list[int], client: str) -> Done:
        h = eng.submit(prompt, SamplingParams(max_tokens=5), client=client)
        async for ev in h.events():
            if not isinstance(ev, Delta):
                assert isinstance(ev, Done)
                return ev
        raise AssertionError("no Done")

    async def main() -> None:
        eng = await started(state)
        await anonymous(eng, TURN1, "10.0.0.1")
        await stop(eng)
        assert len(list(state.iterdir())) == 1

        eng = await started(state)
        end = await anonymous(eng, TURN1 + [1, 2, 3], "10.0.0.2")
        assert end.cached_tokens == 0 and eng.snapshot.cache_events["restored"] == 0
        await stop(eng)
    run(main())


def test_a_stop_ends_a_running_answer_with_shutting_down_and_keeps_its_conversation(tmp_path: Path) -> None:
    """An answer still running when the engine stops (the drain's grace is over) gets what it
    generated, then one Failed with code shutting_down; its KV is saved with the sessions and
    the next start continues the conversation from it."""
    state = tmp_path / "state"

    async def main() -> None:
        limits = Limits(slots=2, batch_tokens=64, kv_tokens=4096, ctx_limit=1024, max_wait_s=0.0, max_queue=8,
                        queue_timeout_s=30.0)
        eng = Engine(lambda: FakeModel(reply="x" * 500, delay=0.01), EngineOptions(limits,
                     CachePolicy(n_seq=4, min_shared=4, state_dir=str(state))))
        eng.start(asyncio.get_running_loop())
        await asyncio.to_thread(eng.ready.wait, 5)
        h = eng.submit(TURN1, SamplingParams(max_tokens=400), client="10.0.0.1", session=SECRET)
        text, end = "", None
        async for ev in h.events():
            if isinstance(ev, Delta):
                text += ev.text
                if len(text) >= 10 and not eng._stop:
                    await asyncio.to_thread(eng.stop)  # mid-answer
            else:
                end = ev
        assert isinstance(end, Failed) and end.error.code == "shutting_down", end
        assert 10 <= len(text) < 400
        assert [f.suffix for f in state.iterdir()] == [".kv"]  # its conversation was saved

        eng = await started(state)
        prompt = TURN1 + [ord(c) for c in text] + [7, 8]
        again = await turn(eng, prompt, SECRET)
        assert again.cached_tokens >= len(TURN1) + len(text) - 1  # read from the file, not recomputed
        await stop(eng)
    run(main())
