"""A person removed with everything of theirs: the usage counted under their name goes from
memory at once and from the file at the next flush, and is not written back by counts still
pending then."""

from __future__ import annotations

from pathlib import Path

from appliance.usage.ledger import Ledger
from appliance.usage.store import Tally, UsageStore


def test_forget_removes_a_name_from_memory_and_file(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path, clock=lambda: 1_765_000_000.0)
    ledger.record("Ben", Tally(requests=1, generated_tokens=5))
    ledger.record("Ann", Tally(requests=1, generated_tokens=7))
    ledger.flush()
    ledger.record("Ben", Tally(requests=1))  # pending when he is removed
    ledger.forget("Ben")
    assert [who for _, who, _ in ledger.rows()] == ["Ann"]
    ledger.flush()
    ledger.close()
    store = UsageStore(tmp_path)
    assert [(who, t.generated_tokens) for _, who, t in store.rows()] == [("Ann", 7)]
    store.close()
