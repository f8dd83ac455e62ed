"""System prompts that become public once common (engine/kv/commons.py), on the fake model:
a whole system block three different clients sent is copied by them and the next, never a part of one,
never on one client's say-so, within its bound of pinned prefixes."""

from __future__ import annotations

from helpers.engines import Core, make
from helpers.fakes import FakeModel

from appliance.engine.events import Done

SYSTEM = list(range(1, 41))  # 40 tokens: the template's start and one system message


def ask(c: Core, client: str, system: list[int], question: int) -> tuple[int, int]:
    """One turn of `client` with this system block: (tokens reused, tokens computed)."""
    before = c.core.stats.prompt_tokens_computed
    turn, rec = c.submit(system + [question] * 6, max_tokens=2, client=client, system_len=len(system))
    c.run()
    assert isinstance(rec.end, Done)
    return turn.n_reused, c.core.stats.prompt_tokens_computed - before


def public_ids(c: Core) -> list[int]:
    return [e.seq_id for e in c.core.cache.public]


def test_a_system_prompt_three_clients_sent_is_copied_whole_by_the_third_and_the_next() -> None:
    c = make(FakeModel(reply="ok"), slots=2, n_seq=8, common_prompts=2)
    assert ask(c, "alice", SYSTEM, 100) == (0, 46)  # nobody else sent it: computed
    # Bob is the second: nothing public yet, so his request cannot tell him Alice sent it.
    assert ask(c, "bob", SYSTEM, 99) == (0, 46)
    assert c.core.kv.stats.promoted == 0
    # Carol is the third client to send it: it is promoted (copied from a cached
    # conversation) before her turn looks for a prefix, so she copies it too.
    reused, computed = ask(c, "carol", SYSTEM, 101)
    assert (reused, computed) == (40, 6)
    assert c.core.kv.stats.promoted == 1 and len(public_ids(c)) == 1
    assert c.core.sched.pinned == 40  # pinned like a preset
    assert ask(c, "dave", SYSTEM, 102) == (40, 6)
    assert c.leaked_ids() == set()


def test_one_client_alone_never_makes_its_system_prompt_public() -> None:
    c = make(FakeModel(reply="ok"), slots=2, n_seq=8, common_prompts=2)
    for q in (100, 101, 102):  # three conversations of one client: its own reuse only
        ask(c, "alice", SYSTEM, q)
    assert public_ids(c) == [] and c.core.kv.stats.promoted == 0
    assert ask(c, "bob", SYSTEM[:-1] + [999], 103) == (0, 46)  # not the same block: nothing


def test_a_block_that_differs_in_its_last_token_reuses_nothing_of_a_public_one() -> None:
    """No token-by-token oracle: a guess that matches all but the end of a public block is
    computed in full, exactly as a guess that matches nothing."""
    c = make(FakeModel(reply="ok"), slots=2, n_seq=8, common_prompts=2)
    ask(c, "alice", SYSTEM, 100)
    ask(c, "bob", SYSTEM, 99)
    ask(c, "carol", SYSTEM, 101)
    assert len(public_ids(c)) == 1
    guess = SYSTEM[:-1] + [999]
    assert ask(c, "mallory", guess, 104) == (0, 46)
    assert ask(c, "trudy", SYSTEM[:20], 105) == (0, 26)  # a prefix of it, as its own whole block


def test_the_bound_demotes_the_least_recently_sent_and_frees_its_cells() -> None:
    model = FakeModel(reply="ok")
    c = make(model, slots=2, n_seq=8, common_prompts=1)
    other = list(range(500, 530))
    for client in ("alice", "bob", "bert"):
        ask(c, client, SYSTEM, 100)
    (first,) = public_ids(c)
    for client in ("carol", "dave", "dora"):
        ask(c, client, other, 100)
    (second,) = public_ids(c)
    assert second == first  # the one id, given to the newer block
    assert model.kv[second] == list(range(30)) and c.core.sched.pinned == 30
    # The demoted block is remembered: more clients make it public again, in its turn.
    assert ask(c, "erin", SYSTEM, 101)[0] in (0, 40)
    assert c.core.kv.stats.promoted >= 2


def test_off_and_under_a_full_cache_nothing_is_promoted() -> None:
    c = make(FakeModel(reply="ok"), slots=2, n_seq=8)  # common_prompts = 0
    ask(c, "alice", SYSTEM, 100)
    assert ask(c, "bob", SYSTEM, 101) == (0, 46) and public_ids(c) == []
    # No room to pin it beside what the running turns reserve: it stays private.
    tight = make(FakeModel(reply="ok"), slots=2, n_seq=8, common_prompts=2, kv_tokens=60, ctx_limit=60)
    ask(tight, "alice", SYSTEM, 100)
    ask(tight, "bert", SYSTEM, 99)
    assert ask(tight, "bob", SYSTEM, 101) == (0, 46) and public_ids(tight) == []
