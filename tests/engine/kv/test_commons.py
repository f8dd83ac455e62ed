"""System prompts that become public once common (engine/kv/commons.py), on the fake model:
a whole system block three different clients sent is copied by them and the next, never a part of one,
never on one client's say-so, within its bound of pinned prefixes."""

from __future__ import annotations

from helpers.engines import Core, make
from helpers.fakes import FakeModel

from appliance.engine.events import Done
from appliance.engine.turn import State

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


# -- a trusted front-end's tools block (issue 37) --------------------------------------------
TOOLS_BLOCK = list(range(1000, 1150))  # the template's system prompt + a front-end's tool definitions
FRONT = "10.0.0.5"  # Open WebUI's address: it names its people with forwarded headers


def ask_via(c: Core, person: str, block: list[int], question: int, *, public: bool = True,
            front_end: str = FRONT) -> tuple[int, int]:
    """One turn a front-end sends for `person`: (tokens reused, tokens computed)."""
    before = c.core.stats.prompt_tokens_computed
    client = f"{front_end}/person:{person}" if front_end else person
    turn, rec = c.submit(block + [question] * 6, max_tokens=4, client=client, system_len=len(block),
                         allowance=len(block) - 10, front_end=front_end, block_public=public)
    c.run()
    # Its whole answer, though the prompt is past ctx_limit: its tools' allowance ("length" without).
    assert isinstance(rec.end, Done) and rec.end.finish_reason == "stop" and len(turn.output) == 2
    return turn.n_reused, c.core.stats.prompt_tokens_computed - before


def front_core() -> Core:
    # ctx_limit 64: the 156-token prompts fit only with their tools allowance (Open WebUI's
    # 6,626 tokens of tools against 3,584 prompt tokens per conversation).
    return make(FakeModel(reply="ok"), slots=2, n_seq=8, common_prompts=2, ctx_limit=64, kv_tokens=1024,
                tools_tokens=200)


def test_a_front_ends_tools_block_is_read_once_and_every_person_behind_it_copies_it() -> None:
    c = front_core()
    assert ask_via(c, "alice", TOOLS_BLOCK, 100) == (0, 156)  # the first chat ever reads it
    # Bob's first chat: the block is the front-end's, not Alice's, so it is public now.
    assert ask_via(c, "bob", TOOLS_BLOCK, 101) == (150, 6)
    assert c.core.kv.stats.promoted == 1 and c.core.sched.pinned == 150
    assert ask_via(c, "carol", TOOLS_BLOCK, 102) == (150, 6)
    assert c.core.sched.reserved == 0 and c.leaked_ids() == set()


def test_a_turn_that_copied_a_pinned_block_reserves_only_its_own_cells_and_keeps_the_block_pinned() -> None:
    c = front_core()
    ask_via(c, "alice", TOOLS_BLOCK, 100)
    turn, rec = c.submit(TOOLS_BLOCK + [7] * 6, max_tokens=40, client=f"{FRONT}/person:bob",
                         system_len=len(TOOLS_BLOCK), allowance=140, front_end=FRONT, block_public=True)
    c.step()
    assert turn.shared == 150 and turn.n_reused == 150
    # 156 prompt + 40 answer, of which the 150 pinned cells are counted once, as pinned.
    assert c.core.sched.reserved == 156 + 40 - 150
    commons = c.core.kv.commons
    assert commons is not None and commons.least_used() is None  # in use: never demoted under it
    c.run()
    assert isinstance(rec.end, Done)
    assert c.core.sched.reserved == 0 and commons.least_used() is not None
    # Bob's next turn takes over his cached conversation, which goes on sharing the block.
    history = turn.prompt + turn.output
    nxt, rec = c.submit(history + [8] * 4, max_tokens=40, client=f"{FRONT}/person:bob", system_len=len(TOOLS_BLOCK),
                        allowance=140, front_end=FRONT, block_public=True)
    c.step()
    assert nxt.n_reused >= len(history) - 1 and nxt.shared == 150
    assert c.core.sched.reserved == len(nxt.prompt) + 40 - 150 and commons.least_used() is None
    c.run()
    assert isinstance(rec.end, Done) and c.core.sched.reserved == 0 and c.leaked_ids() == set()


def test_a_persons_own_system_prompt_through_a_front_end_stays_theirs() -> None:
    """A block with a system prompt a person wrote (block_public False) keeps the rule of
    three different clients, and a client not behind the front-end copies nothing of the
    front-end's public block unless three such clients sent it: no oracle either way."""
    c = front_core()
    own = list(range(2000, 2150))
    ask_via(c, "alice", own, 100, public=False)
    assert ask_via(c, "bob", own, 101, public=False) == (0, 156)
    ask_via(c, "alice", TOOLS_BLOCK, 100)
    ask_via(c, "bob", TOOLS_BLOCK, 101)
    assert c.core.kv.stats.promoted == 1
    assert ask_via(c, "mallory", TOOLS_BLOCK, 103, front_end="") == (0, 156)


def test_an_outsider_with_two_identities_never_copies_a_front_ends_block() -> None:
    """The front-end's copy is not one of the three identities an outsider's guess needs:
    two addresses of its own learn nothing of what the front-end sent."""
    c = front_core()
    ask_via(c, "alice", TOOLS_BLOCK, 100)
    ask_via(c, "bob", TOOLS_BLOCK, 101)
    assert c.core.kv.stats.promoted == 1
    assert ask_via(c, "mallory-1", TOOLS_BLOCK, 103, front_end="") == (0, 156)
    assert ask_via(c, "mallory-2", TOOLS_BLOCK, 104, front_end="") == (0, 156)
    # A third identity of theirs: three outsiders sent it, which is the rule without a front-end.
    assert ask_via(c, "mallory-3", TOOLS_BLOCK, 105, front_end="")[0] == 150


def test_a_tools_turn_that_shares_nothing_stops_at_the_cells_the_pool_has_left() -> None:
    """Its allowance never takes it past the cells the pinned blocks leave: it ends with
    "length", as a long answer does, and no decode runs out of cache."""
    c = make(FakeModel(reply="x" * 100), slots=2, n_seq=8, common_prompts=2, ctx_limit=64, kv_tokens=330,
             tools_tokens=200)
    for person, q in (("alice", 100), ("bob", 101)):
        turn, rec = c.submit(TOOLS_BLOCK + [q] * 6, max_tokens=2, client=f"{FRONT}/person:{person}",
                             system_len=150, allowance=140, front_end=FRONT, block_public=True)
        c.run()
    assert c.core.sched.pinned == 150
    other = list(range(3000, 3150))  # another block of tools, sent directly: computed, not shared
    turn, rec = c.submit(other + [7] * 6, max_tokens=100, client="10.0.0.8", system_len=150, allowance=140)
    c.run()
    assert isinstance(rec.end, Done) and rec.end.finish_reason == "length"
    assert len(turn.prompt) + len(turn.output) <= 330 - 150


def test_chats_that_copy_a_pinned_block_are_admitted_counting_its_cells_once() -> None:
    """Admission counts a pinned block's cells once, as pinned: two new chats behind the
    front-end start together in cells that hold the block and their own turns, not the block
    three times (at Open WebUI's 6,626 tokens of tools, a second chat waited for the first)."""
    c = make(FakeModel(reply="ok"), slots=2, n_seq=8, common_prompts=2, ctx_limit=64, kv_tokens=400,
             tools_tokens=200)
    ask_via(c, "alice", TOOLS_BLOCK, 100)
    ask_via(c, "bob", TOOLS_BLOCK, 101)
    assert c.core.sched.pinned == 150
    turns = [c.submit(TOOLS_BLOCK + [q] * 6, max_tokens=40, client=f"{FRONT}/person:{p}", system_len=150,
                      allowance=140, front_end=FRONT, block_public=True) for p, q in (("carol", 102), ("dave", 103))]
    # Each may come to hold 156 + 40 cells: 150 pinned + 2 x 196 is past the 400, 150 + 2 x 46 is not.
    assert c.core.sched.admissible() == 2
    c.step()
    assert not c.core.sched.waiting and len(c.core.sched.running) == 2
    assert [t.shared for t, _ in turns] == [150, 150] and c.core.sched.reserved == 2 * (156 + 40 - 150)
    c.run()
    assert all(isinstance(rec.end, Done) for _, rec in turns)
    assert c.core.sched.reserved == 0 and c.leaked_ids() == set()


def test_a_turn_admitted_on_a_share_it_does_not_get_reserves_its_whole_need() -> None:
    """Should attach copy less than admission counted on, it reserves the rest: the sum of
    reservations stays the sum of what the running turns may come to hold."""
    c = make(FakeModel(reply="ok"), slots=2, n_seq=8, common_prompts=2, ctx_limit=64, kv_tokens=350,
             tools_tokens=200)
    ask_via(c, "alice", TOOLS_BLOCK, 100)
    ask_via(c, "bob", TOOLS_BLOCK, 101)
    running, _ = c.submit(TOOLS_BLOCK + [102] * 6, max_tokens=40, client=f"{FRONT}/person:dave", system_len=150,
                          allowance=140, front_end=FRONT, block_public=True)
    c.step()
    assert running.shared == 150 and c.core.sched.reserved == 46
    c.core.sched.shares = lambda turn: 150  # admission is told so, but this prompt shares nothing
    turn, rec = c.submit(list(range(3000, 3150)) + [7] * 6, max_tokens=40, client=f"{FRONT}/person:carol",
                         system_len=150, allowance=140, front_end=FRONT, block_public=True)
    c.step()
    assert turn.shared == 0 and c.core.sched.reserved == 46 + 156 + 40
    c.run()
    assert isinstance(rec.end, Done) and c.core.sched.reserved == 0 and c.leaked_ids() == set()


def test_a_front_ends_block_is_public_as_soon_as_the_first_chat_has_read_it() -> None:
    """Not when a second chat sends it: Open WebUI gives its admins and its users different
    tools, so the first chat's block may not be sent again for a long while, and a person
    whose chat starts while the first still answers copies it at once."""
    c = front_core()
    first, rec = c.submit(TOOLS_BLOCK + [100] * 6, max_tokens=30, client=f"{FRONT}/person:alice", system_len=150,
                          allowance=140, front_end=FRONT, block_public=True)
    while first.n_cached < len(TOOLS_BLOCK):
        c.step()
    assert c.core.kv.stats.promoted == 1 and c.core.sched.pinned == 150 and first.state is State.DECODE
    bob, bob_rec = c.submit(TOOLS_BLOCK + [101] * 6, max_tokens=4, client=f"{FRONT}/person:bob", system_len=150,
                            allowance=140, front_end=FRONT, block_public=True)
    c.step()
    assert bob.n_reused == 150 and bob.shared == 150 and first.state is State.DECODE
    c.run()
    assert isinstance(rec.end, Done) and isinstance(bob_rec.end, Done)
    assert c.core.sched.reserved == 0 and c.leaked_ids() == set()


def test_a_persons_first_chat_never_makes_their_own_system_block_public_at_once() -> None:
    """Only a front-end's block (nothing a person wrote) is public once read; a person's own
    system prompt behind it, or a client's, still needs three identities."""
    c = front_core()
    ask_via(c, "alice", TOOLS_BLOCK, 100, public=False)
    ask(c, "mallory", TOOLS_BLOCK, 101)
    assert c.core.kv.stats.promoted == 0 and c.core.sched.pinned == 0


# Open WebUI 0.12.4 sends its admins 36 tools and its users 30, the first 24 the same.
USERS_BLOCK = TOOLS_BLOCK[:100] + list(range(5000, 5030))


def test_a_front_ends_second_block_copies_what_it_has_in_common_with_the_first_pinned_once() -> None:
    c = make(FakeModel(reply="ok"), slots=2, n_seq=8, common_prompts=2, ctx_limit=64, kv_tokens=1024,
             tools_tokens=200)
    assert ask_via(c, "alice", TOOLS_BLOCK, 100) == (0, 156)  # the admin's first chat reads 150
    assert ask_via(c, "zoe", TOOLS_BLOCK, 98) == (150, 6)  # a second admin: sent for two, the front-end's
    # The first user's chat copies the 100 tokens both blocks begin with and reads its 30.
    assert ask_via(c, "bob", USERS_BLOCK, 101) == (100, 36)
    # Its block is public too; its first 100 cells are the admin block's: pinned once.
    assert c.core.kv.stats.promoted == 2 and c.core.sched.pinned == 150 + 30
    assert ask_via(c, "carol", USERS_BLOCK, 102) == (130, 6)
    # A third block takes the least recently sent one's sequence (the admin's); the users'
    # block now holds those 100 cells alone, so they are pinned as its own.
    assert ask_via(c, "dave", list(range(7000, 7150)), 103) == (0, 156)
    assert ask_via(c, "erin", list(range(7000, 7150)), 104) == (150, 6)
    assert c.core.sched.pinned == 130 + 150
    assert ask_via(c, "frank", USERS_BLOCK, 105) == (130, 6)
    # Alice's own idle copy of the admin block gives it back to the commons: the least
    # recently sent block (the third) makes room, the users' block keeps its 130.
    assert ask_via(c, "alice", TOOLS_BLOCK, 106) == (150, 6)
    assert c.core.sched.pinned == 130 + 150
    assert c.core.sched.reserved == 0 and c.leaked_ids() == set()


def test_an_outsider_copies_no_part_of_a_front_ends_block() -> None:
    """Only the front-end copies a part of its own block: a client not behind it, sending a
    block that begins the same, copies nothing of it (no prefix oracle on the tools)."""
    c = front_core()
    ask_via(c, "alice", TOOLS_BLOCK, 100)
    assert ask_via(c, "bob", USERS_BLOCK, 101, front_end="10.0.0.6") == (0, 136)  # another front-end
    assert ask_via(c, "mallory", USERS_BLOCK, 102, front_end="") == (0, 136)
    assert ask_via(c, "oscar", TOOLS_BLOCK[:100] + list(range(6000, 6030)), 103, front_end="") == (0, 136)


def test_a_block_read_once_does_not_push_out_a_public_one_until_it_is_sent_again() -> None:
    c = make(FakeModel(reply="ok"), slots=2, n_seq=8, common_prompts=1, ctx_limit=64, kv_tokens=1024,
             tools_tokens=200)
    ask_via(c, "alice", TOOLS_BLOCK, 100)
    other = list(range(7000, 7150))  # a person's own tool set, through the front-end
    assert ask_via(c, "bob", other, 101) == (0, 156)
    assert ask_via(c, "carol", TOOLS_BLOCK, 102) == (150, 6)  # still public
    assert ask_via(c, "dave", other, 103) == (150, 6)  # sent again: it takes the sequence
    assert ask_via(c, "erin", TOOLS_BLOCK, 104)[0] == 150  # Alice's idle copy brings it back


def test_a_block_sent_for_one_person_lends_no_part_of_itself() -> None:
    """A person may add tools of their own through the front-end: a part of their block
    would tell another, token by token, how much of a guess at those tools is right."""
    c = front_core()
    ask_via(c, "alice", TOOLS_BLOCK, 100)  # public once read: the whole of it is copied ...
    guess = TOOLS_BLOCK[:100] + list(range(6000, 6030))
    assert ask_via(c, "mallory", guess, 101) == (0, 136)  # ... but no part of it
    assert ask_via(c, "bob", TOOLS_BLOCK, 102) == (150, 6)  # sent for two people now
    assert ask_via(c, "oscar", TOOLS_BLOCK[:100] + list(range(8000, 8030)), 103) == (100, 36)


def test_a_running_turn_keeps_pinned_only_the_block_it_copied_from() -> None:
    """Not every public block that begins as its copy does: a turn that copied the 100 tokens
    two blocks share from one of them left neither demotable, and no new block could be
    promoted while it ran (the default system prompt begins every block)."""
    c = make(FakeModel(reply="x" * 200), slots=3, n_seq=10, common_prompts=2, ctx_limit=64, kv_tokens=2048,
             tools_tokens=200)
    for person, q in (("alice", 100), ("zoe", 101)):
        ask_via_long(c, person, TOOLS_BLOCK, q)
    ask_via_long(c, "bob", USERS_BLOCK, 102)  # public too, its first 100 cells the admin block's
    assert c.core.kv.stats.promoted == 2
    carol, rec = c.submit(TOOLS_BLOCK[:100] + list(range(9000, 9030)) + [103] * 6, max_tokens=150,
                          client=f"{FRONT}/person:carol", system_len=130, allowance=190, front_end=FRONT,
                          block_public=True)
    c.step()
    assert carol.shared == 100 and carol.shared_from in public_ids(c)
    # Three clients send a block of their own while carol answers: it takes the sequence of
    # the public block carol did not copy from.
    for client, q in (("o1", 104), ("o2", 105), ("o3", 106)):
        turn, _ = c.submit(SYSTEM + [q] * 6, max_tokens=2, client=client, system_len=len(SYSTEM))
        while turn.state is not State.FINISHED:
            c.step()
    assert carol.state is not State.FINISHED and c.core.kv.stats.promoted == 3
    assert carol.shared_from in public_ids(c)
    c.run()
    assert isinstance(rec.end, Done) and c.core.sched.reserved == 0 and c.leaked_ids() == set()


def ask_via_long(c: Core, person: str, block: list[int], question: int) -> None:
    turn, rec = c.submit(block + [question] * 6, max_tokens=4, client=f"{FRONT}/person:{person}",
                         system_len=len(block), allowance=len(block) - 10, front_end=FRONT, block_public=True)
    c.run()
    assert isinstance(rec.end, Done)


def test_a_block_read_beside_a_pinned_one_is_promoted_without_counting_its_cells_twice() -> None:
    """The reading turn's own cells of the block become the pinned copy's: promoting it needs
    no room for a second copy. Open WebUI's users' 5,432-token tools block, read while its
    admins' 6,603 were pinned, did not fit twice in 16,384 cells, so every later chat read it again."""
    c = make(FakeModel(reply="ok"), slots=2, n_seq=8, common_prompts=2, ctx_limit=64, kv_tokens=360,
             tools_tokens=200)
    ask_via(c, "alice", TOOLS_BLOCK, 100)
    assert c.core.sched.pinned == 150
    users = list(range(5000, 5150))  # another of the front-end's blocks, nothing in common
    first, rec = c.submit(users + [101] * 6, max_tokens=30, client=f"{FRONT}/person:bob", system_len=150,
                          allowance=140, front_end=FRONT, block_public=True)
    need = len(users) + 6 + 30  # what the turn may come to hold
    assert 150 + need + 150 > 360  # no room for the block's cells a second time
    while first.n_cached < len(users):
        c.step()
    assert c.core.kv.stats.promoted == 2 and c.core.sched.pinned == 300
    assert first.shared == 150 and c.core.sched.reserved == need - 150  # moved to pinned, not added
    c.run()
    assert isinstance(rec.end, Done)
    assert ask_via(c, "carol", users, 102) == (150, 6)  # the next chat copies it
    assert c.core.sched.reserved == 0 and c.leaked_ids() == set()
