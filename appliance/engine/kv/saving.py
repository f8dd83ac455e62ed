"""Sessions across a restart, on the KV store's side: what a stop writes (`save`, most
recent first, within save_timeout_s) and what a start finds (`load`: 'saved' entries, read
from disk only when their session's next turn comes). The file format is persist.py's."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from appliance.engine.kv import persist
from appliance.engine.kv.cache import SAVED, Entry, SessionCache, SessionTable
from appliance.engine.kv.policy import CachePolicy

log = logging.getLogger(__name__)


class StateOps(Protocol):
    fingerprint: str  # model + llama.cpp version + KV type: what saved state must match

    def seq_state(self, seq_id: int) -> bytes: ...


def discard(saved: persist.Saved | None) -> None:
    """Remove a file a session no longer needs (restored, superseded, forgotten)."""
    if saved is not None:
        try:
            saved.path.unlink(missing_ok=True)
        except OSError as e:  # a stale file is harmless; a crashed engine is not
            log.warning("could not remove %s: %s", saved.path, e)


def load(cache: SessionCache, policy: CachePolicy, fingerprint: str, clock: Callable[[], float]) -> None:
    """Sessions saved by the previous run come back as 'saved' entries, known by the
    digest of their id until their next turn claims them, and read from disk only then."""
    if not policy.state_dir:
        return
    now = clock()
    try:
        saved = persist.scan(Path(policy.state_dir), fingerprint)
    except OSError as e:
        log.error("not restoring saved sessions: %s", e)
        return
    for sv in saved:
        age = sv.last_used_age_s
        cache.add_saved(Entry(SAVED + sv.key, -1, sv.tokens, sv.shared_len, now - age, disk=sv))
    if saved:
        log.info("%d saved sessions found in %s", len(saved), policy.state_dir)


def save(cache: SessionCache, policy: CachePolicy, model: StateOps, clock: Callable[[], float]) -> None:
    """Most recent first, for at most save_timeout_s: a stop must end within systemd's
    TimeoutStopSec even on a slow SD card; sessions left out are recomputed."""
    if not policy.state_dir:
        return
    now = clock()
    deadline = time.monotonic() + policy.save_timeout_s
    records = []
    try:
        for e in sorted(cache.entries.values(), key=lambda e: e.last_used, reverse=True):
            if e.busy:
                continue
            if time.monotonic() > deadline:
                break
            data = _state(e, model)
            if data:
                key = SessionTable.key_of(e.session)
                records.append((key, e.tokens, e.public_len, now - e.last_used, data))
        n = persist.save_all(Path(policy.state_dir), model.fingerprint, records, policy.state_max_bytes,
                             deadline=deadline)
        log.info("saved %d of %d sessions to %s", n, len(records), policy.state_dir)
    except OSError as e:  # StateDirError too: a symlink, not a directory, not ours
        log.error("could not save sessions to %s: %s", policy.state_dir, e)


def _state(e: Entry, model: StateOps) -> bytes | None:
    """The entry's KV state, wherever it is: the KV cache, RAM (parked), or its old file."""
    if e.seq_id >= 0:
        return model.seq_state(e.seq_id)
    if e.parked is not None:
        return e.parked
    if e.disk is not None:
        return persist.load(e.disk)
    return None
