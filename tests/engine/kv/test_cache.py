"""SessionCache on its own: prefix matching and the isolation rule, the sequence id pool,
put/drop/take, TTL expiry, LRU order, eviction and parking within the RAM budget.
Pure Python with a fake clock; no model."""

from __future__ import annotations

import random

from helpers.fakes import FakeClock

from appliance.engine.kv.cache import TAKEOVER_SLACK, Entry, Match, SessionCache
from appliance.model.prompt import common_prefix

SYS = [101, 102, 103, 104, 105, 106, 107, 108]  # a "system prompt"


def make(n_ids: int = 4, **kw: object) -> tuple[SessionCache, FakeClock]:
    clock = FakeClock()
    return SessionCache(range(n_ids), clock, **kw), clock  # type: ignore[arg-type]


def brute_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def cached(c: SessionCache, session: str, tokens: list[int], public_len: int = len(SYS), copied: int = 0,
           owner: str = "A", named: bool = True) -> Entry:
    """An idle entry in the KV cache, as a finished turn of client `owner` leaves it."""
    sid = c.alloc_id()
    assert sid is not None
    assert c.put(session, sid, tokens, public_len, copied, owner, named) is None
    return c.entries[session]


def all_ids_accounted(c: SessionCache, n_ids: int, running: set[int] = frozenset()) -> None:  # type: ignore[assignment]
    """Every id is exactly once either free, held by an idle entry in KV, or running."""
    held = [e.seq_id for e in c.entries.values() if e.seq_id >= 0 and not e.busy]
    assert len(c.free_ids) == len(set(c.free_ids)), f"duplicate free ids {c.free_ids}"
    assert len(held) == len(set(held)), f"two entries share an id {held}"
    assert not set(c.free_ids) & set(held)
    assert not set(c.free_ids) & set(running)
    assert not set(held) & set(running)
    assert set(c.free_ids) | set(held) | set(running) == set(range(n_ids))


# -- common_prefix ----------------------------------------------------------------------

def test_common_prefix_empty() -> None:
    assert common_prefix([], []) == 0
    assert common_prefix([], [1, 2]) == 0
    assert common_prefix([1, 2], []) == 0


def test_common_prefix_equal_and_one_a_prefix_of_the_other() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([1, 2, 3], [1, 2]) == 2
    big = list(range(1000))
    assert common_prefix(big, list(big)) == 1000
    assert common_prefix(big, big[:513]) == 513
    assert common_prefix(big[:256], big) == 256


def test_common_prefix_diverging_at_start_middle_end() -> None:
    assert common_prefix([9, 2, 3], [1, 2, 3]) == 0
    assert common_prefix([1, 2, 9, 4], [1, 2, 3, 4]) == 2
    assert common_prefix([1, 2, 3, 9], [1, 2, 3, 4]) == 3


def test_common_prefix_long_lists_diverging_around_the_block_size() -> None:
    for length in (255, 256, 257, 511, 512, 513, 1000, 2048):
        base = list(range(length))
        for at in {0, 1, 254, 255, 256, 257, 300, 511, 512, 513, 767, 768, length - 2, length - 1}:
            if not 0 <= at < length:
                continue
            other = list(base)
            other[at] = -1
            assert common_prefix(base, other) == at, (length, at)
            assert common_prefix(other, base) == at, (length, at)
            # Shorter list ending exactly at the divergence point.
            assert common_prefix(base, base[:at]) == at


def test_common_prefix_matches_brute_force_on_random_lists() -> None:
    rng = random.Random(1234)
    for _ in range(400):
        n = rng.randrange(0, 1200)
        a = [rng.randrange(3) for _ in range(n)]
        b = list(a)
        choice = rng.random()
        if choice < 0.3 and b:
            b[rng.randrange(len(b))] += 1  # one change anywhere
        elif choice < 0.5:
            b = b[:rng.randrange(len(b) + 1)]  # truncated
        elif choice < 0.7:
            b = b + [rng.randrange(3) for _ in range(rng.randrange(300))]  # extended
        elif choice < 0.85:
            b = [rng.randrange(2) for _ in range(rng.randrange(1200))]  # unrelated, small alphabet
        assert common_prefix(a, b) == brute_prefix(a, b)
        assert common_prefix(b, a) == brute_prefix(a, b)


# -- match: the session's own entry -------------------------------------------------------

def test_match_own_idle_entry_is_taken_over() -> None:
    c, _ = make()
    e = cached(c, "a", SYS + [1, 2, 3])
    m = c.match("a", "A", SYS + [1, 2, 3, 4, 5], len(SYS))
    assert m == Match(e, len(SYS) + 3, True)


def test_match_own_session_is_found_from_any_client() -> None:
    # Session ids are bearer secrets: whoever sends one continues it (e.g. a laptop whose
    # address changed). Keys will bind sessions to their key.
    c, _ = make()
    e = cached(c, "a", SYS + [1, 2, 3], owner="A")
    assert c.match("a", "B", SYS + [1, 2, 3, 4], 0) == Match(e, len(SYS) + 3, True)


def test_match_own_leaves_at_least_one_prompt_token_to_compute() -> None:
    c, _ = make()
    e = cached(c, "a", SYS + [1, 2, 3])
    # Same prompt again (a retry): everything is cached, but the last token is recomputed.
    m = c.match("a", "A", SYS + [1, 2, 3], len(SYS))
    assert m.entry is e and m.own and m.n_common == len(SYS) + 2
    # A prompt shorter than the cached history (a regenerate after an edit).
    m = c.match("a", "A", SYS + [1], len(SYS))
    assert m.entry is e and m.own and m.n_common == len(SYS)


def test_match_own_edited_history_reuses_what_still_matches() -> None:
    c, _ = make()
    e = cached(c, "a", SYS + [1, 2, 3, 4])
    m = c.match("a", "A", SYS + [1, 9, 9, 9, 9], len(SYS))
    assert m == Match(e, len(SYS) + 1, True)


def test_match_own_single_token_prompt_cannot_reuse_anything() -> None:
    c, _ = make()
    cached(c, "a", [5, 6, 7])
    assert c.match("a", "A", [5], 0) == Match(None, 0, False)
    assert c.match("a", "A", [], 0) == Match(None, 0, False)


def test_match_own_busy_entry_is_not_taken_falls_back_to_sharing() -> None:
    c, _ = make()
    own = cached(c, "a", SYS + [1, 2, 3])
    other = cached(c, "b", SYS + [7, 7])
    c.take(own, "a")
    m = c.match("a", "A", SYS + [1, 2, 3, 4], len(SYS))
    assert not m.own
    assert m.entry is other and m.entry.seq_id >= 0
    assert m.n_common == len(SYS)  # what the other conversation has in common, no more
    c.take(other, "b")
    m = c.match("a", "A", SYS + [1, 2, 3, 4], len(SYS))
    assert not m.own


def test_match_own_parked_entry_is_not_own() -> None:
    c, _ = make(park_budget_bytes=1000)
    e = cached(c, "a", SYS + [1, 2, 3])
    c.evict(e, b"state")
    assert e.seq_id == -1 and e.parked == b"state"
    m = c.match("a", "A", SYS + [1, 2, 3, 4], len(SYS))
    assert m == Match(None, 0, False)  # the engine restores it separately


def test_match_own_entry_with_nothing_in_common_falls_back_to_sharing() -> None:
    c, _ = make()
    cached(c, "a", [1, 2, 3])
    donor = cached(c, "b", SYS + [4])
    m = c.match("a", "A", SYS + [5, 6], len(SYS))
    assert m == Match(donor, len(SYS), False)


# -- match: the same client's other conversations ------------------------------------------

def test_match_same_client_reuses_its_other_conversations_fully() -> None:
    c, _ = make()
    donor = cached(c, "b", SYS + [1, 2, 3, 4], public_len=0)  # a private system prompt
    m = c.match("a", "A", SYS + [1, 2, 3, 9], 0)
    assert m == Match(donor, len(SYS) + 3, False)  # named: copied, never taken over


def test_match_anonymous_continuation_is_taken_over_under_the_new_id() -> None:
    # A client that sends no session id: its next turn continues its last one.
    c, _ = make()
    e = cached(c, "anon-1", SYS + [1, 2, 3], named=False)
    m = c.match("anon-2", "A", SYS + [1, 2, 3, 4, 5], len(SYS))
    assert m == Match(e, len(SYS) + 3, True)
    c.take(e, "anon-2")
    assert c.entries == {"anon-2": e} and e.session == "anon-2" and e.busy


def test_match_parked_anonymous_continuation_is_taken_over_by_its_client_only() -> None:
    # Parked to RAM, a client's conversation without a session id is still found by its
    # next turn (the engine restores it); another client's, or a mere branch, is not.
    c, _ = make(park_budget_bytes=1000)
    history = SYS + list(range(1, 40))
    e = cached(c, "anon-1", history, named=False)
    c.evict(e, b"state")
    assert e.seq_id == -1 and e.parked == b"state"
    assert c.match("anon-2", "A", history + [4, 5], len(SYS)) == Match(e, len(history), True)
    assert c.match("anon-3", "B", history + [4, 5], len(SYS)) == Match(None, 0, False)
    branch = SYS + [1] + [99] * 40  # shares a beginning only: more than TAKEOVER_SLACK tokens are lost
    assert c.match("anon-4", "A", branch, len(SYS)).entry is None
    # A named session's own id finds it first; a parked named session is never taken over by another id.
    n = cached(c, "named", SYS + [7, 7, 7], named=True)
    c.evict(n, b"state2")
    assert c.match("anon-5", "A", SYS + [7, 7, 7, 8], len(SYS)).entry is None


def test_match_anonymous_branch_is_copied_and_the_original_kept() -> None:
    # A regenerated or edited turn shares only a beginning: the original stays cached.
    c, _ = make()
    history = SYS + list(range(1, 41))
    e = cached(c, "anon-1", history, named=False)
    m = c.match("anon-2", "A", SYS + [1, 2, 99], len(SYS))
    assert m == Match(e, len(SYS) + 2, False)


def test_match_takeover_slack_allows_a_retokenized_tail() -> None:
    c, _ = make()
    history = SYS + list(range(1, 41))
    e = cached(c, "anon-1", history, named=False)
    cut = len(history) - TAKEOVER_SLACK
    m = c.match("anon-2", "A", history[:cut] + [999, 998], len(SYS))
    assert m == Match(e, cut, True)
    m = c.match("anon-2", "A", history[:cut - 1] + [999, 998], len(SYS))
    assert m == Match(e, cut - 1, False)


def test_match_named_session_is_never_taken_over_by_another_id() -> None:
    c, _ = make()
    e = cached(c, "b", SYS + [1, 2], named=True)
    assert c.match("anon-9", "A", SYS + [1, 2, 3], len(SYS)) == Match(e, len(SYS) + 2, False)


def test_match_no_takeover_when_the_session_has_an_entry_of_its_own() -> None:
    c, _ = make(park_budget_bytes=100)
    own = cached(c, "x", [7, 7, 7])
    c.evict(own, b"p")
    e = cached(c, "anon-1", SYS + [1, 2], named=False)
    assert c.match("x", "A", SYS + [1, 2, 3], len(SYS)) == Match(e, len(SYS) + 2, False)


# -- match: other clients (isolation) ------------------------------------------------------

def test_match_another_clients_conversation_is_never_reused() -> None:
    c, _ = make()
    cached(c, "b", SYS + [1, 2, 3, 4], owner="B", public_len=len(SYS))
    cached(c, "anon-1", SYS + [1, 2, 3, 4], owner="B", named=False)
    assert c.match("a", "A", SYS + [1, 2, 3, 4, 5], len(SYS)) == Match(None, 0, False)


def test_match_public_prefix_is_shared_with_every_client() -> None:
    c, _ = make()
    c.add_public(10, SYS)
    (pub,) = c.public
    cached(c, "b", SYS + [1, 2, 3, 4], owner="B")
    assert c.match("a", "A", SYS + [1, 2, 3, 4, 5], len(SYS)) == Match(pub, len(SYS), False)
    # Capped at the public part the new prompt declares, and nothing for a private one.
    assert c.match("a", "A", SYS + [1, 2], 3) == Match(pub, 3, False)
    assert c.match("a", "A", SYS + [1, 2], 0) == Match(None, 0, False)


def test_match_public_prefix_is_never_taken_over() -> None:
    c, _ = make()
    c.add_public(10, SYS)
    m = c.match("anon-1", "", SYS + [1], len(SYS))
    assert m.entry is c.public[0] and not m.own


def test_match_isolation_tokens_diverging_inside_the_public_prefix() -> None:
    c, _ = make()
    c.add_public(10, SYS)
    other_sys = SYS[:3] + [0] + SYS[4:]
    m = c.match("a", "A", other_sys + [1, 2, 3], len(SYS))
    assert m == Match(c.public[0], 3, False)


def test_match_share_all_reuses_the_full_common_prefix_across_clients() -> None:
    c, _ = make(share_all=True)
    donor = cached(c, "b", SYS + [1, 2, 3, 4], owner="B")
    m = c.match("a", "A", SYS + [1, 2, 3, 9], len(SYS))
    assert m == Match(donor, len(SYS) + 3, False)
    # Still leaves the last prompt token to compute.
    m = c.match("a", "A", SYS + [1, 2, 3, 4], len(SYS))
    assert m == Match(donor, len(SYS) + 3, False)
    # Not limited by the public length.
    m = c.match("a", "A", SYS + [1, 2, 3, 4, 5], 0)
    assert m == Match(donor, len(SYS) + 4, False)


def test_match_picks_the_donor_with_the_longest_usable_prefix() -> None:
    c, _ = make(n_ids=8)
    cached(c, "short", SYS[:3] + [0, 0, 0])
    best = cached(c, "best", SYS + [1, 2])
    cached(c, "mid", SYS[:6] + [0])
    cached(c, "other", SYS + [1, 2, 3], owner="B")  # longer, but another client's
    m = c.match("a", "A", SYS + [1, 2, 3], len(SYS))
    assert m == Match(best, len(SYS) + 2, False)


def test_match_longest_usable_prefix_counts_after_the_isolation_cap() -> None:
    # Another client's entry matches more tokens but may give none; a public prefix with
    # fewer matching tokens is what is usable.
    c, _ = make(n_ids=8)
    cached(c, "many_tokens", SYS + [1, 2, 3], owner="B")
    c.add_public(10, SYS[:6])
    m = c.match("a", "A", SYS + [1, 2, 3, 4], len(SYS))
    assert m == Match(c.public[0], 6, False)


def test_match_ignores_parked_donors() -> None:
    c, _ = make(park_budget_bytes=1000)
    donor = cached(c, "b", SYS + [1, 2])
    c.evict(donor, b"parked")
    assert "b" in c.entries and donor.seq_id == -1
    assert c.match("a", "A", SYS + [1, 2, 3], len(SYS)) == Match(None, 0, False)
    # Another in-KV donor with a shorter prefix is used instead.
    live = cached(c, "c", SYS[:4] + [0])
    assert c.match("a", "A", SYS + [1, 2, 3], len(SYS)) == Match(live, 4, False)


def test_match_does_not_change_the_cache() -> None:
    c, clock = make()
    e = cached(c, "a", SYS + [1], named=False)
    t0 = e.last_used
    clock.advance(10)
    c.match("a", "A", SYS + [1, 2], len(SYS))
    c.match("z", "A", SYS + [1, 2], len(SYS))
    assert not e.busy and e.last_used == t0 and list(c.entries) == ["a"]


def test_match_never_offers_kv_a_taken_over_entry_no_longer_holds_share_all() -> None:
    """Bug: `take` leaves entry.tokens untouched while the engine truncates the taken-over
    sequence to the matched prefix (`seq_rm(seq_id, n_common, -1)` in KVStore._take_over)
    and then decodes the new turn's different tokens into those positions. `match` must not
    use the busy entry as a donor for its stale full token list."""
    c, _ = make(share_all=True)
    history = SYS + [1, 2, 3, 4, 5, 6]
    a = cached(c, "a", history)
    # Session a edits its last messages: its own entry is taken over, valid up to 10 tokens.
    m = c.match("a", "A", SYS + [1, 2, 9, 9], len(SYS))
    assert m == Match(a, len(SYS) + 2, True)
    c.take(a, "a")
    still_valid = m.n_common  # the engine removes positions >= this from a's sequence
    # Session b has the old history (a forked conversation): it must not be told to copy
    # positions a's sequence no longer holds.
    m2 = c.match("b", "B", history + [7], len(SYS))
    assert m2.entry is not a or m2.n_common <= still_valid, (
        f"b copies {m2.n_common} tokens from a's sequence, which holds only {still_valid} valid ones")


def test_match_never_offers_kv_a_taken_over_entry_no_longer_holds_same_client() -> None:
    """The same bug within one client: session a changes its system prompt, so its
    taken-over sequence keeps only the first 3 tokens; session b of the same client still
    has the old system prompt and must not be offered a's (now stale) tokens."""
    c, _ = make()
    a = cached(c, "a", SYS + [1, 2, 3])
    new_sys = SYS[:3] + [0] * 5
    m = c.match("a", "A", new_sys + [1, 2, 3, 4], len(new_sys))
    assert m == Match(a, 3, True)
    c.take(a, "a")
    m2 = c.match("b", "A", SYS + [5, 6], len(SYS))
    assert m2.entry is not a or m2.n_common <= 3, (
        f"b copies {m2.n_common} tokens from a's sequence, which holds only 3 valid ones")


# -- the sequence id pool -----------------------------------------------------------------

def test_alloc_until_exhausted_then_none() -> None:
    c, _ = make(n_ids=3)
    got = [c.alloc_id() for _ in range(3)]
    assert sorted(got) == [0, 1, 2]  # type: ignore[type-var]
    assert c.alloc_id() is None
    assert c.alloc_id() is None


def test_alloc_hands_out_lowest_ids_first() -> None:
    c, _ = make(n_ids=3)
    assert [c.alloc_id(), c.alloc_id(), c.alloc_id()] == [0, 1, 2]


def test_release_makes_ids_reusable() -> None:
    c, _ = make(n_ids=2)
    a, b = c.alloc_id(), c.alloc_id()
    assert c.alloc_id() is None
    c.release_id(b)  # type: ignore[arg-type]
    assert c.alloc_id() == b
    c.release_id(a)  # type: ignore[arg-type]
    c.release_id(b)  # type: ignore[arg-type]
    assert sorted([c.alloc_id(), c.alloc_id()]) == [0, 1]  # type: ignore[type-var]
    assert c.alloc_id() is None


def test_empty_pool() -> None:
    c, _ = make(n_ids=0)
    assert c.alloc_id() is None


# -- put / drop / take ------------------------------------------------------------------

def test_put_creates_an_idle_entry() -> None:
    c, clock = make()
    clock.t = 50.0
    sid = c.alloc_id()
    assert c.put("a", sid, SYS + [1, 2, 3], len(SYS), copied=len(SYS)) is None  # type: ignore[arg-type]
    e = c.entries["a"]
    assert (e.session, e.seq_id, e.tokens, e.public_len) == ("a", sid, SYS + [1, 2, 3], len(SYS))
    assert e.own_tokens == 3  # the copied system prompt is counted by its donor
    assert e.n_tokens == len(SYS) + 3
    assert e.last_used == 50.0 and not e.busy and e.parked is None


def test_put_without_copied_prefix_owns_all_tokens() -> None:
    c, _ = make()
    e = cached(c, "a", [1, 2, 3, 4, 5], copied=0)
    assert e.own_tokens == 5


def test_put_replacing_an_idle_entry_with_another_id_frees_the_old_one() -> None:
    c, _ = make(n_ids=3)
    old = cached(c, "a", SYS + [1])
    new_sid = c.alloc_id()
    assert new_sid is not None and new_sid != old.seq_id
    replaced = c.put("a", new_sid, SYS + [1, 2], len(SYS), 0)
    assert replaced == old.seq_id
    assert c.entries["a"].seq_id == new_sid and c.entries["a"].tokens == SYS + [1, 2]
    assert old.seq_id in c.free_ids
    all_ids_accounted(c, 3)


def test_put_replacing_a_busy_entry_keeps_its_id_for_the_running_turn() -> None:
    c, _ = make(n_ids=3)
    old = cached(c, "a", SYS + [1])
    c.take(old, old.session)  # turn 1 runs in the entry's sequence
    sid2 = c.alloc_id()  # turn 2 of the same session runs at the same time
    assert sid2 is not None
    assert c.put("a", sid2, SYS + [1, 2], len(SYS), 0) is None
    assert old.seq_id not in c.free_ids
    assert c.entries["a"].seq_id == sid2 and not c.entries["a"].busy
    all_ids_accounted(c, 3, running={old.seq_id})
    # Turn 1 finishes later: now turn 2's idle entry is replaced and its id freed.
    assert c.put("a", old.seq_id, SYS + [1, 3], len(SYS), 0) == sid2
    assert sid2 in c.free_ids
    all_ids_accounted(c, 3)


def test_put_with_the_same_id_replaces_nothing() -> None:
    c, _ = make(n_ids=3)
    e = cached(c, "a", SYS + [1])
    c.take(e, e.session)  # the usual multi-turn case: the turn ran in the entry's own sequence
    assert c.put("a", e.seq_id, SYS + [1, 2, 3], len(SYS), 0) is None
    assert e.seq_id not in c.free_ids
    assert c.entries["a"].tokens == SYS + [1, 2, 3] and not c.entries["a"].busy
    all_ids_accounted(c, 3)
    # Same id and idle (not expected from the engine, but must not free a held id).
    assert c.put("a", e.seq_id, SYS + [1], len(SYS), 0) is None
    assert e.seq_id not in c.free_ids


def test_put_over_a_parked_entry_replaces_nothing() -> None:
    c, _ = make(n_ids=2, park_budget_bytes=100)
    old = cached(c, "a", SYS + [1])
    c.evict(old, b"xyz")
    free_before = list(c.free_ids)
    sid = c.alloc_id()
    assert c.put("a", sid, SYS + [1, 2], len(SYS), 0) is None  # type: ignore[arg-type]
    assert c.entries["a"].parked is None and c.entries["a"].seq_id == sid
    assert c.parked_bytes == 0
    assert sorted(c.free_ids + [sid]) == sorted(free_before)  # type: ignore[list-item]
    all_ids_accounted(c, 2)


def test_drop_idle_entry_releases_its_id() -> None:
    c, _ = make(n_ids=2)
    e = cached(c, "a", [1, 2])
    assert c.drop("a") is e
    assert "a" not in c.entries and e.seq_id in c.free_ids
    all_ids_accounted(c, 2)


def test_drop_busy_entry_keeps_its_id() -> None:
    c, _ = make(n_ids=2)
    e = cached(c, "a", [1, 2])
    c.take(e, e.session)
    assert c.drop("a") is e
    assert "a" not in c.entries and e.seq_id not in c.free_ids
    all_ids_accounted(c, 2, running={e.seq_id})


def test_drop_parked_entry_releases_nothing() -> None:
    c, _ = make(n_ids=2, park_budget_bytes=100)
    e = cached(c, "a", [1, 2])
    c.evict(e, b"abc")
    free_before = sorted(c.free_ids)
    assert c.drop("a") is e
    assert sorted(c.free_ids) == free_before and -1 not in c.free_ids
    assert c.parked_bytes == 0


def test_drop_unknown_session() -> None:
    c, _ = make()
    assert c.drop("nobody") is None
    assert sorted(c.free_ids) == [0, 1, 2, 3]


def test_take_marks_busy_and_refreshes_last_used() -> None:
    c, clock = make()
    e = cached(c, "a", [1, 2])
    clock.advance(42)
    c.take(e, e.session)
    assert e.busy and e.last_used == clock()


# -- cached_tokens / idle_lru -----------------------------------------------------------

def test_cached_tokens_counts_only_idle_entries_in_kv() -> None:
    c, _ = make(n_ids=4, park_budget_bytes=1000)
    cached(c, "a", SYS + [1, 2], copied=0)  # 10 own
    cached(c, "b", SYS + [3, 4, 5], copied=len(SYS))  # 3 own: copied prefix excluded
    busy = cached(c, "c", [1] * 7)
    parked = cached(c, "d", [2] * 5)
    assert c.cached_tokens == 10 + 3 + 7 + 5
    c.take(busy, busy.session)
    assert c.cached_tokens == 10 + 3 + 5
    c.evict(parked, b"p")
    assert c.cached_tokens == 10 + 3
    c.drop("a")
    assert c.cached_tokens == 3


def test_cached_tokens_empty() -> None:
    c, _ = make()
    assert c.cached_tokens == 0 and c.parked_bytes == 0 and c.idle_lru() == []


def test_idle_lru_orders_by_last_used_and_skips_busy_and_parked() -> None:
    c, clock = make(n_ids=5, park_budget_bytes=1000)
    a = cached(c, "a", [1])
    clock.advance(1)
    b = cached(c, "b", [2])
    clock.advance(1)
    d = cached(c, "d", [3])
    clock.advance(1)
    e = cached(c, "e", [4])
    assert c.idle_lru() == [a, b, d, e]
    clock.advance(1)
    c.take(a, a.session)  # busy: not evictable
    assert c.idle_lru() == [b, d, e]
    c.evict(d, b"x")  # parked: no longer in the KV cache
    assert c.idle_lru() == [b, e]
    # a's turn finishes: it is now the most recently used.
    clock.advance(1)
    c.put("a", a.seq_id, [1, 5], 0, 0)
    assert c.idle_lru() == [b, e, c.entries["a"]]


def test_take_then_put_moves_a_session_to_the_back_of_the_lru() -> None:
    c, clock = make(n_ids=3)
    a = cached(c, "a", [1])
    clock.advance(1)
    b = cached(c, "b", [2])
    clock.advance(1)
    m = c.match("a", "A", [1, 3], 0)
    assert m.own and m.entry is a
    c.take(a, a.session)
    clock.advance(1)
    c.put("a", a.seq_id, [1, 3, 4], 0, 0)
    assert [e.session for e in c.idle_lru()] == ["b", "a"]
    assert c.idle_lru()[0] is b


# -- TTL ----------------------------------------------------------------------------------

def test_expired_removes_old_idle_entries_and_frees_their_ids() -> None:
    c, clock = make(n_ids=3, ttl_s=100.0)
    old = cached(c, "old", [1, 2])
    clock.advance(60)
    young = cached(c, "young", [3, 4])
    clock.advance(41)  # old: 101 s idle, young: 41 s
    gone = c.expired()
    assert gone == [old]
    assert set(c.entries) == {"young"} and c.entries["young"] is young
    assert old.seq_id in c.free_ids
    assert c.events.expired == 1
    all_ids_accounted(c, 3)


def test_expired_at_exactly_the_ttl_is_kept() -> None:
    c, clock = make(ttl_s=100.0)
    cached(c, "a", [1])
    clock.advance(100)
    assert c.expired() == []
    clock.advance(0.001)
    assert [e.session for e in c.expired()] == ["a"]


def test_expired_removes_parked_entries_without_releasing_an_id() -> None:
    c, clock = make(n_ids=2, ttl_s=10.0, park_budget_bytes=100)
    e = cached(c, "a", [1, 2])
    c.evict(e, b"data")
    free_before = sorted(c.free_ids)
    clock.advance(11)
    assert c.expired() == [e]
    assert c.entries == {} and c.parked_bytes == 0
    assert sorted(c.free_ids) == free_before and -1 not in c.free_ids
    assert c.events.expired == 1


def test_expired_leaves_busy_entries_alone_however_old() -> None:
    c, clock = make(n_ids=2, ttl_s=10.0)
    e = cached(c, "a", [1, 2])
    c.take(e, e.session)
    clock.advance(1e9)
    assert c.expired() == []
    assert c.entries["a"] is e and e.seq_id not in c.free_ids
    assert c.events.expired == 0


def test_expired_counts_every_entry_and_nothing_twice() -> None:
    c, clock = make(n_ids=4, ttl_s=5.0, park_budget_bytes=100)
    cached(c, "a", [1])
    cached(c, "b", [2])
    p = cached(c, "c", [3])
    c.evict(p, b"z")
    clock.advance(6)
    assert {e.session for e in c.expired()} == {"a", "b", "c"}
    assert c.events.expired == 3
    assert c.expired() == []
    assert c.events.expired == 3
    all_ids_accounted(c, 4)


def test_take_refresh_keeps_an_entry_from_expiring() -> None:
    c, clock = make(ttl_s=10.0)
    e = cached(c, "a", [1])
    clock.advance(9)
    c.take(e, e.session)
    c.put("a", e.seq_id, [1, 2], 0, 0)
    clock.advance(9)
    assert c.expired() == []
    clock.advance(2)
    assert [x.session for x in c.expired()] == ["a"]


# -- eviction and parking -----------------------------------------------------------------

def test_evict_without_parked_data_removes_the_entry() -> None:
    c, _ = make(n_ids=2, park_budget_bytes=1000)
    e = cached(c, "a", [1, 2, 3])
    sid = e.seq_id
    c.evict(e, None)
    assert "a" not in c.entries and sid in c.free_ids
    assert (c.events.evicted, c.events.parked) == (1, 0)
    all_ids_accounted(c, 2)


def test_evict_parks_within_budget() -> None:
    c, _ = make(n_ids=2, park_budget_bytes=10)
    e = cached(c, "a", [1, 2, 3])
    sid = e.seq_id
    c.evict(e, b"0123456789")  # exactly the budget
    assert c.entries["a"] is e
    assert e.seq_id == -1 and e.parked == b"0123456789" and e.tokens == [1, 2, 3]
    assert sid in c.free_ids
    assert (c.events.evicted, c.events.parked, c.events.parked_dropped) == (1, 1, 0)
    assert c.parked_bytes == 10
    all_ids_accounted(c, 2)


def test_evict_parked_data_larger_than_the_whole_budget_removes_the_entry() -> None:
    c, _ = make(n_ids=2, park_budget_bytes=10)
    e = cached(c, "a", [1, 2, 3])
    c.evict(e, b"x" * 11)
    assert "a" not in c.entries
    assert (c.events.evicted, c.events.parked) == (1, 0)
    assert c.parked_bytes == 0
    all_ids_accounted(c, 2)


def test_evict_with_no_park_budget_removes_the_entry() -> None:
    c, _ = make(n_ids=2)  # park_budget_bytes=0
    e = cached(c, "a", [1])
    c.evict(e, b"x")
    assert "a" not in c.entries and c.events.parked == 0


def test_park_budget_drops_least_recently_used_parked_entries() -> None:
    c, clock = make(n_ids=5, park_budget_bytes=10)
    ents = {}
    for name in "abcd":
        ents[name] = cached(c, name, [ord(name)])
        clock.advance(1)
    c.evict(ents["a"], b"1234")
    c.evict(ents["b"], b"1234")
    assert c.parked_bytes == 8 and c.events.parked_dropped == 0
    c.evict(ents["c"], b"1234")  # 12 > 10: a (least recently used) goes
    assert "a" not in c.entries and set(c.entries) == {"b", "c", "d"}
    assert c.parked_bytes == 8 and c.events.parked_dropped == 1
    c.evict(ents["d"], b"123456789")  # needs both b and c gone
    assert set(c.entries) == {"d"} and c.entries["d"].parked == b"123456789"
    assert c.parked_bytes == 9 and c.events.parked_dropped == 3
    assert (c.events.evicted, c.events.parked) == (4, 4)
    all_ids_accounted(c, 5)


def test_park_budget_never_drops_the_entry_just_parked() -> None:
    # The entry being evicted is the least recently used idle one, so it is usually older
    # than the parked ones: the budget must still drop the others, not it.
    c, clock = make(n_ids=4, park_budget_bytes=10)
    oldest = cached(c, "oldest", [1])
    clock.advance(1)
    p1 = cached(c, "p1", [2])
    clock.advance(1)
    p2 = cached(c, "p2", [3])
    c.evict(p1, b"xxxx")
    c.evict(p2, b"xxxx")
    c.evict(oldest, b"yyyyyyyy")
    assert c.entries == {"oldest": oldest} and oldest.parked == b"yyyyyyyy"
    assert c.parked_bytes == 8 <= 10
    assert c.events.parked_dropped == 2


def test_park_budget_drops_only_as_many_as_needed() -> None:
    c, clock = make(n_ids=6, park_budget_bytes=10)
    ents = [cached(c, f"s{i}", [i]) for i in range(5)]
    for i, e in enumerate(ents):
        e.last_used = 100.0 + i
    for e in ents[:4]:
        c.evict(e, b"xx")  # 8 bytes parked
    c.evict(ents[4], b"xxxx")  # 12: drop the single oldest parked entry (2 bytes)
    assert set(c.entries) == {"s1", "s2", "s3", "s4"}
    assert c.parked_bytes == 10 and c.events.parked_dropped == 1


def test_park_budget_leaves_in_kv_and_busy_entries_alone() -> None:
    c, clock = make(n_ids=5, park_budget_bytes=6)
    idle = cached(c, "idle", [1])
    busy = cached(c, "busy", [2])
    c.take(busy, busy.session)
    clock.advance(1)
    p1 = cached(c, "p1", [3])
    p2 = cached(c, "p2", [4])
    c.evict(p1, b"xxxx")
    c.evict(p2, b"xxxx")
    assert set(c.entries) == {"idle", "busy", "p2"}
    assert c.entries["idle"] is idle and c.entries["busy"] is busy
    assert c.parked_bytes == 4 and c.events.parked_dropped == 1
    all_ids_accounted(c, 5, running={busy.seq_id})


# -- a random workload in the engine's pattern --------------------------------------------

def test_random_workload_keeps_ids_budget_and_counts_consistent() -> None:
    """Turns start (take own entry / restore parked / alloc, evicting LRU when out of ids),
    finish (put, or fail and free), sessions get deleted, time passes and entries expire.
    Every sequence id stays accounted for exactly once; parked bytes stay within budget."""
    for seed in range(30):
        rng = random.Random(seed)
        n_ids, slots, budget = 6, 3, 40
        c, clock = make(n_ids=n_ids, ttl_s=50.0, park_budget_bytes=budget, share_all=bool(seed % 2))
        running: dict[int, tuple[str, int, list[int], int]] = {}  # rid -> session, sid, tokens, copied
        deleted: set[str] = set()
        sessions = [f"s{i}" for i in range(6)]
        rid = 0

        def alloc() -> int:
            sid = c.alloc_id()
            while sid is None:
                victim = c.idle_lru()[0]
                data = bytes(rng.randrange(1, 25)) if rng.random() < 0.7 else None
                c.evict(victim, data)
                sid = c.alloc_id()
            return sid

        for _ in range(300):
            op = rng.random()
            if op < 0.4 and len(running) < slots:
                s = rng.choice(sessions)
                prompt = SYS + [rng.randrange(3) for _ in range(rng.randrange(1, 6))]
                m = c.match(s, "A", prompt, len(SYS))
                copied = 0
                if m.own and m.entry is not None:
                    c.take(m.entry, m.entry.session)
                    sid = m.entry.seq_id
                else:
                    own = c.entries.get(s)
                    if own is not None and own.parked is not None and rng.random() < 0.6:
                        sid = alloc()
                        c.restored(own, sid)
                        c.take(own, s)
                    else:
                        if own is not None and own.parked is not None:
                            c.drop(s)
                        sid = alloc()
                        if m.entry is not None:
                            copied = m.n_common
                running[rid] = (s, sid, prompt, copied)
                rid += 1
            elif op < 0.75 and running:
                r = rng.choice(sorted(running))
                s, sid, prompt, copied = running.pop(r)
                keep = rng.random() < 0.85 and s not in deleted
                deleted.discard(s)
                if keep:
                    c.put(s, sid, prompt + [7, 7], len(SYS), copied, "A")
                else:
                    own = c.entries.get(s)
                    if own is not None and own.seq_id == sid:
                        c.drop(s)  # busy: the id stays with the turn, released next
                    c.release_id(sid)
            elif op < 0.85:
                s = rng.choice(sessions)
                e = c.entries.get(s)
                if e is not None and e.busy:
                    deleted.add(s)
                    del c.entries[s]
                else:
                    c.drop(s)
            elif op < 0.95:
                clock.advance(rng.choice([1.0, 5.0, 20.0, 60.0]))
                c.expired()
            else:
                idle = c.idle_lru()
                if idle:
                    c.evict(idle[0], bytes(rng.randrange(1, 50)))

            run_ids = {sid for _, sid, _, _ in running.values()}
            assert len(run_ids) == len(running), f"seed {seed}: two running turns share an id"
            all_ids_accounted(c, n_ids, running=run_ids)
            assert c.parked_bytes <= budget
            for e in c.entries.values():
                assert (e.parked is None) or e.seq_id == -1
                assert e.busy == (e.seq_id in run_ids and e.seq_id >= 0)
            assert c.cached_tokens == sum(e.own_tokens for e in c.idle_lru())
        assert c.events.evicted >= c.events.parked >= 0
