"""The scheduling policy alone: fake clock, no model."""

from __future__ import annotations

import pytest
from helpers.fakes import FakeClock

from appliance.engine.scheduler import Limits, Scheduler
from appliance.engine.turn import Lane, State, Turn
from appliance.errors import Unavailable
from appliance.sampling import SamplingParams


def make(clock: FakeClock, **kw: object) -> Scheduler:
    base = dict(slots=4, batch_tokens=64, kv_tokens=4096, ctx_limit=1024, max_wait_s=0.05,
                max_queue=8, queue_timeout_s=10.0, background_hold_s=0.0)
    base.update(kw)
    return Scheduler(Limits(**base), clock)  # type: ignore[arg-type]


_rid = iter(range(1, 10_000))


def seq(clock: FakeClock, n_prompt: int = 10, max_tokens: int = 16) -> Turn:
    return Turn(rid=next(_rid), prompt=list(range(1, n_prompt + 1)),
                    params=SamplingParams(max_tokens=max_tokens), arrival=clock())


def run_step(s: Scheduler) -> None:
    """Apply a step the way the engine does: prefill advances, completed prompts decode."""
    step = s.schedule()
    for q in step.decode:
        q.n_cached += 1
    for q, n in step.prefill:
        q.n_cached += n
        if q.prefill_left == 0:
            q.state = State.DECODE


def test_window_admits_together_what_arrives_together() -> None:
    clock = FakeClock()
    s = make(clock)
    a = seq(clock)
    s.waiting.append(a)
    assert s.admit() == []  # window open: the engine is idle and only one waits
    assert s.window_open_until() == pytest.approx(clock() + 0.05)
    clock.advance(0.02)
    b = seq(clock)
    s.waiting.append(b)
    assert s.admit() == []
    clock.advance(0.031)  # the window (opened by a) closes
    assert s.admit() == [a, b]
    step = s.schedule()
    assert [q for q, _ in step.prefill] == [a, b]


def test_window_closes_early_when_min_batch_wait() -> None:
    clock = FakeClock()
    s = make(clock, min_batch=2)
    s.waiting.append(seq(clock))
    assert s.admit() == []
    s.waiting.append(seq(clock))
    assert len(s.admit()) == 2  # no clock advance needed


def test_running_batch_admits_newcomer_at_next_step_without_window() -> None:
    clock = FakeClock()
    s = make(clock, max_wait_s=10.0)
    a = seq(clock)
    s.waiting.append(a)
    clock.advance(10.1)
    assert s.admit() == [a]
    run_step(s)
    b = seq(clock)
    s.waiting.append(b)
    assert s.window_open_until() is None  # busy engine: no window
    assert s.admit() == [b]
    step = s.schedule()
    assert a in step.decode and (b, b.n_prompt) in step.prefill


def test_decode_tokens_first_and_budget_never_exceeded() -> None:
    clock = FakeClock()
    s = make(clock, slots=4, batch_tokens=16, max_wait_s=0.0)
    short = [seq(clock, n_prompt=3) for _ in range(2)]
    for q in short:
        s.waiting.append(q)
    s.admit()
    run_step(s)  # both short prompts done in one step
    assert all(q.state is State.DECODE for q in short)
    long = seq(clock, n_prompt=100)
    s.waiting.append(long)
    s.admit()
    steps = 0
    while long.prefill_left:
        step = s.schedule()
        assert step.n_tokens <= 16
        assert step.decode == short  # every step carries a token for each generating stream
        assert step.prefill == [(long, min(14, long.prefill_left))]
        run_step(s)
        steps += 1
    assert steps == 8  # ceil(100 / 14)


def test_short_prompts_prefill_before_long_ones() -> None:
    clock = FakeClock()
    s = make(clock, batch_tokens=20, max_wait_s=0.0)
    long = seq(clock, n_prompt=200)
    s.waiting.append(long)
    clock.advance(0.001)
    short = seq(clock, n_prompt=5)
    s.waiting.append(short)
    s.admit()
    step = s.schedule()
    assert step.prefill == [(short, 5), (long, 15)]


def test_queue_timeout_gives_503() -> None:
    clock = FakeClock()
    s = make(clock, slots=1, max_wait_s=0.0, queue_timeout_s=5.0)
    a, b = seq(clock), seq(clock)
    s.waiting.append(a)
    s.waiting.append(b)
    assert s.admit() == [a]  # b waits: no slot
    clock.advance(5.1)
    out = s.expired()
    assert len(out) == 1
    q, err, was_waiting = out[0]
    assert q is b and was_waiting and isinstance(err, Unavailable) and err.status == 503
    assert not s.waiting and s.running == [a]


@pytest.mark.parametrize("where", ["queued", "prefilling", "generating"])
def test_cancel_in_every_state_frees_the_slot(where: str) -> None:
    clock = FakeClock()
    s = make(clock, slots=1, batch_tokens=4, max_wait_s=0.0)
    a = seq(clock, n_prompt=10)
    s.waiting.append(a)
    if where != "queued":
        s.admit()
        run_step(s)
        assert a.state is State.PREFILL
        if where == "generating":
            run_step(s)
            run_step(s)
            assert a.state is State.DECODE
    a.cancelled = True
    out = s.expired()
    assert [q for q, _, _ in out] == [a]
    s.release(a)
    s.release(a)  # twice is harmless
    assert a.state is State.FINISHED and not s.running and not s.waiting
    assert len(s.running) == 0 and s.reserved == 0
    b = seq(clock)
    s.waiting.append(b)
    assert s.admit() == [b]


def test_kv_budget_limits_admission() -> None:
    clock = FakeClock()
    # Each sequence may grow to 10 + 90 = 100 cells; 250 cells fit two of them.
    s = make(clock, slots=4, kv_tokens=250, ctx_limit=200, max_wait_s=0.0)
    qs = [seq(clock, n_prompt=10, max_tokens=90) for _ in range(3)]
    for q in qs:
        s.waiting.append(q)
    assert s.admit() == qs[:2]
    s.release(qs[0])
    assert s.admit() == [qs[2]]


def test_slots_limit_admission() -> None:
    clock = FakeClock()
    s = make(clock, slots=2, max_wait_s=0.0)
    qs = [seq(clock) for _ in range(3)]
    for q in qs:
        s.waiting.append(q)
    assert s.admit() == qs[:2] and len(s.running) == s.limits.slots
    s.release(qs[1])
    assert s.admit() == [qs[2]]


def test_follower_waits_for_its_leader() -> None:
    clock = FakeClock()
    s = make(clock, max_wait_s=0.0)
    lead, follow = seq(clock, n_prompt=30), seq(clock, n_prompt=32)
    s.waiting.append(lead)
    s.waiting.append(follow)
    s.admit()
    follow.leader, follow.lead_n = lead, 25
    step = s.schedule()
    # The follower is not prefilled meanwhile, and the leader stops where their prompts
    # part, so both continue in the same next step.
    assert step.prefill == [(lead, 25)]


def test_continuing_conversations_first_otherwise_fifo() -> None:
    clock = FakeClock()
    s = make(clock, slots=1, max_wait_s=0.0, ageing_s=5.0)
    running = seq(clock)
    s.waiting.append(running)
    s.admit()
    new1, new2, cont = seq(clock), seq(clock), seq(clock)
    cont.continuing = True
    for q in (new1, new2, cont):
        s.waiting.append(q)
        clock.advance(0.1)
    s.release(running)
    assert s.admit() == [cont]
    s.release(cont)
    assert s.admit() == [new1]  # FIFO among new ones
    s.release(new1)
    assert s.admit() == [new2]


def test_ageing_bounds_how_often_a_request_is_overtaken() -> None:
    clock = FakeClock()
    ageing = 1.0
    s = make(clock, slots=1, max_wait_s=0.0, ageing_s=ageing, queue_timeout_s=1e9, max_queue=1000)
    blocker = seq(clock)
    s.waiting.append(blocker)
    s.admit()
    victim = seq(clock)  # a new conversation
    s.waiting.append(victim)
    overtaken = 0
    current = blocker
    # A continuing request arrives every 0.1 s and a slot frees every 0.1 s.
    for _ in range(100):
        clock.advance(0.1)
        c = seq(clock)
        c.continuing = True
        s.waiting.append(c)
        s.release(current)
        (current,) = s.admit()
        if current is victim:
            break
        overtaken += 1
    assert current is victim
    # Only continuing requests that arrived within ageing_s after the victim can pass it.
    assert overtaken <= int(ageing / 0.1) + 1


def test_prefill_chunk_is_smaller_while_streams_wait() -> None:
    clock = FakeClock()
    s = make(clock, slots=4, batch_tokens=64, prefill_chunk=10, max_wait_s=0.0)
    long = seq(clock, n_prompt=300)
    s.waiting.append(long)
    s.admit()
    assert s.schedule().prefill == [(long, 64)]  # nobody streaming: full batch
    run_step(s)
    short = seq(clock, n_prompt=2)
    s.waiting.append(short)
    s.admit()
    run_step(s)  # short: 2 tokens, long: 62 more
    assert short.state is State.DECODE
    step = s.schedule()
    assert step.decode == [short] and step.prefill == [(long, 10)]


def _streaming_beside(s: Scheduler, clock: FakeClock, n_prompt: int) -> tuple[Turn, Turn]:
    """One stream decoding, then a prompt of `n_prompt` admitted beside it."""
    streaming = seq(clock, n_prompt=2, max_tokens=500)
    s.waiting.append(streaming)
    s.admit()
    run_step(s)
    paste = seq(clock, n_prompt=n_prompt)
    s.waiting.append(paste)
    s.admit()
    return streaming, paste


def test_prefill_steps_reads_a_paste_in_that_many_steps_beside_streams() -> None:
    clock = FakeClock()
    s = make(clock, slots=4, batch_tokens=512, prefill_chunk=16, prefill_steps=4, max_wait_s=0.0)
    streaming, paste = _streaming_beside(s, clock, 700)
    chunks = []
    while paste.state is State.PREFILL:
        step = s.schedule()
        assert step.decode == [streaming]  # the stream advances every step
        chunks.append(dict(step.prefill)[paste])
        run_step(s)
    assert chunks == [175, 175, 175, 175]


def test_prefill_steps_takes_at_most_half_a_step_and_at_least_the_chunk() -> None:
    clock = FakeClock()
    s = make(clock, slots=4, batch_tokens=512, prefill_chunk=64, prefill_steps=4, max_wait_s=0.0)
    _, paste = _streaming_beside(s, clock, 3000)
    assert s.schedule().prefill == [(paste, 256)]  # 3000 / 4 is more than half of 512
    s2 = make(clock, slots=4, batch_tokens=512, prefill_chunk=64, prefill_steps=4, max_wait_s=0.0)
    _, small = _streaming_beside(s2, clock, 200)
    assert s2.schedule().prefill == [(small, 64)]  # 200 / 4 is less than the chunk


def test_prefill_steps_counts_only_what_the_prompt_must_compute() -> None:
    clock = FakeClock()
    s = make(clock, slots=4, batch_tokens=512, prefill_chunk=16, prefill_steps=4, max_wait_s=0.0)
    streaming = seq(clock, n_prompt=2, max_tokens=500)
    s.waiting.append(streaming)
    s.admit()
    run_step(s)
    paste = seq(clock, n_prompt=900)
    paste.n_cached = paste.n_reused = 500  # a cached system prompt and earlier turns
    s.waiting.append(paste)
    s.admit()
    assert s.schedule().prefill == [(paste, 100)]


# -- first tokens sooner: prefill groups ----------------------------------------------------

def test_prefill_group_finishes_the_shortest_prompts_first_when_idle() -> None:
    clock = FakeClock()
    s = make(clock, slots=8, batch_tokens=512, max_wait_s=0.0, prefill_group=64)
    a, b, c, d = (seq(clock, n_prompt=n) for n in (10, 10, 30, 200))
    for q in (d, c, b, a):
        s.waiting.append(q)
    s.admit()
    step = s.schedule()
    # 10 + 10 + 30 fit the group: they get their first token after this short step; the
    # 200-token prompt does not start until they stream.
    assert sorted(step.prefill, key=lambda x: x[0].rid) == [(a, 10), (b, 10), (c, 30)]


def test_prefill_group_nothing_fits_goes_at_full_speed() -> None:
    clock = FakeClock()
    s = make(clock, slots=8, batch_tokens=512, max_wait_s=0.0, prefill_group=64)
    a, b = seq(clock, n_prompt=100), seq(clock, n_prompt=300)
    s.waiting.extend([a, b])
    s.admit()
    assert s.schedule().prefill == [(a, 100), (b, 300)]


def test_prefill_group_completes_a_short_prompt_while_others_stream() -> None:
    clock = FakeClock()
    s = make(clock, slots=8, batch_tokens=512, max_wait_s=0.0, prefill_chunk=16, prefill_group=64)
    streaming = seq(clock, n_prompt=4)
    s.waiting.append(streaming)
    s.admit()
    run_step(s)
    assert streaming.state is State.DECODE
    short, paste = seq(clock, n_prompt=50), seq(clock, n_prompt=3000)
    s.waiting.extend([short, paste])
    s.admit()
    step = s.schedule()
    assert step.decode == [streaming]
    # The short one whole, beyond the 16-token chunk; the paste its chunk on top, so a
    # stream of short first turns cannot starve it.
    assert step.prefill == [(short, 50), (paste, 16)]
    run_step(s)
    step = s.schedule()
    assert step.prefill == [(paste, 16)]  # a long paste still goes in chunks


def test_prefill_group_off_is_the_old_policy() -> None:
    clock = FakeClock()
    s = make(clock, slots=8, batch_tokens=64, max_wait_s=0.0)
    a, b = seq(clock, n_prompt=10), seq(clock, n_prompt=100)
    s.waiting.extend([a, b])
    s.admit()
    assert s.schedule().prefill == [(a, 10), (b, 54)]


# -- fair shares: round-robin across client identities --------------------------------------

def of(clock: FakeClock, client: str, n: int = 1, **kw: object) -> list[Turn]:
    out = []
    for _ in range(n):
        t = seq(clock, **kw)  # type: ignore[arg-type]
        t.client = client
        out.append(t)
    return out


def test_round_robin_across_clients_each_in_its_own_order() -> None:
    clock = FakeClock()
    s = make(clock, slots=1, max_wait_s=0.0, max_queue=64)
    a = of(clock, "10.0.0.1", 5)
    b = of(clock, "10.0.0.2", 2)
    c = of(clock, "10.0.0.3", 1)
    s.waiting.extend([*a, *b, *c])
    order = []
    current: list[Turn] = []
    while s.waiting:
        for t in current:
            s.release(t)
        current = s.admit()
        order.extend(current)
    assert order == [a[0], b[0], c[0], a[1], b[1], a[2], a[3], a[4]]


def test_the_queue_is_kept_in_admission_order_for_queue_positions() -> None:
    clock = FakeClock()
    s = make(clock, slots=1, max_wait_s=0.0, max_queue=64)
    a = of(clock, "a", 20)
    s.waiting.extend(a)
    assert s.admit() == [a[0]]
    (b,) = of(clock, "b")
    s.waiting.append(b)
    assert s.admit() == []  # no free slot...
    assert s.waiting[0] is b  # ...but b is next: `: queued 1`
    assert list(s.waiting)[1:] == a[1:]


def test_one_clients_backlog_delays_anothers_first_request_at_most_one_admission() -> None:
    clock = FakeClock()
    s = make(clock, slots=2, max_wait_s=0.0, max_queue=64)
    a = of(clock, "a", 20)
    s.waiting.extend(a)
    assert s.admit() == a[:2]
    # b was admitted more recently than a once already: then one of a's may go first.
    (b1,) = of(clock, "b")
    s.waiting.append(b1)
    s.release(a[0])
    assert s.admit() == [b1]
    (b2,) = of(clock, "b")
    s.waiting.append(b2)
    s.release(a[1])
    assert s.admit() == [a[2]]  # a's turn: b went last
    s.release(b1)
    assert s.admit() == [b2]  # then b's, ahead of a's 16 others
    assert list(s.waiting) == a[3:]


def test_a_newcomer_is_first_even_behind_a_long_backlog_of_several_clients() -> None:
    clock = FakeClock()
    s = make(clock, slots=2, max_wait_s=0.0, max_queue=64)
    a, c = of(clock, "a", 10), of(clock, "c", 10)
    s.waiting.extend([*a, *c])
    assert s.admit() == [a[0], c[0]]  # round-robin from the start
    (b,) = of(clock, "b")
    s.waiting.append(b)
    s.release(a[0])
    assert s.admit() == [b]  # never admitted: first, ahead of 18 older requests
    s.release(c[0])
    assert s.admit() == [a[1]]


def test_one_request_per_client_is_served_in_arrival_order() -> None:
    """An office: one person per PC, one request each. A client served before must not wait
    behind newcomers who arrived after it (they were ranked first as never admitted)."""
    clock = FakeClock()
    s = make(clock, slots=1, max_wait_s=0.0, max_queue=64)
    (a1,), (y1,) = of(clock, "a"), of(clock, "y")
    s.waiting.extend([a1, y1])
    assert s.admit() == [a1]
    clock.advance(1.0)
    s.release(a1)
    clock.advance(0.5)
    (a2,) = of(clock, "a")  # a read the answer and asks again, while y waits
    s.waiting.append(a2)
    assert s.admit() == [y1]  # y arrived first
    clock.advance(1.0)
    (b,) = of(clock, "b")
    clock.advance(1.0)
    (c,) = of(clock, "c")
    s.waiting.extend([b, c])
    clock.advance(1.0)
    s.release(y1)
    assert s.admit() == [a2]  # arrived at 1 s, before b (2 s) and c (3 s)
    assert list(s.waiting) == [b, c]


def test_a_backlog_sent_while_served_goes_behind_a_later_newcomer() -> None:
    """A script sends its requests one after another while its first is being served: they
    arrived after its admission, yet they are a backlog, not fresh requests. A newcomer who
    arrives after all of them still goes next (the live fairness test's case)."""
    clock = FakeClock()
    s = make(clock, slots=1, max_wait_s=0.0, max_queue=64)
    (a1,) = of(clock, "a")
    s.waiting.append(a1)
    assert s.admit() == [a1]
    backlog = []
    for _ in range(5):
        clock.advance(0.1)
        (t,) = of(clock, "a")
        backlog.append(t)
    s.waiting.extend(backlog)
    clock.advance(1.0)
    (b,) = of(clock, "b")
    s.waiting.append(b)
    clock.advance(1.0)
    s.release(a1)
    assert s.admit() == [b]
    assert list(s.waiting) == backlog


def test_within_a_client_continuing_conversations_still_go_first() -> None:
    clock = FakeClock()
    s = make(clock, slots=1, max_wait_s=0.0, max_queue=64, ageing_s=5.0)
    a_new = of(clock, "a", 2)
    (a_cont,) = of(clock, "a")
    a_cont.continuing = True
    (b_new,) = of(clock, "b")
    s.waiting.extend([*a_new, a_cont, b_new])
    assert s.admit() == [a_cont]  # a's most urgent: its continuing conversation
    assert list(s.waiting) == [b_new, a_new[0], a_new[1]]


def test_ageing_still_orders_one_clients_requests() -> None:
    clock = FakeClock()
    s = make(clock, slots=1, max_wait_s=0.0, max_queue=64, ageing_s=1.0)
    (blocker,) = of(clock, "x")
    s.waiting.append(blocker)
    s.admit()
    (old,) = of(clock, "a")  # new conversation
    clock.advance(0.5)
    (cont1,) = of(clock, "a")
    cont1.continuing = True
    clock.advance(0.6)  # old has waited 1.1 s: ranks with continuing ones, and arrived first
    (cont2,) = of(clock, "a")
    cont2.continuing = True
    s.waiting.extend([cont2, cont1, old])
    order = []
    current = blocker
    while s.waiting:
        s.release(current)
        (current,) = s.admit()
        order.append(current)
    assert order == [old, cont1, cont2]


def test_same_client_keeps_the_old_order() -> None:
    """Everything from one identity (tests, a single user): exactly the earlier policy."""
    clock = FakeClock()
    s = make(clock, slots=1, max_wait_s=0.0, ageing_s=5.0)
    new1, new2, cont = of(clock, "a", 3)
    cont.continuing = True
    s.waiting.extend([new1, new2, cont])
    assert s.admit() == [cont]
    assert list(s.waiting) == [new1, new2]


def test_the_rotation_forgets_clients_with_nothing_left() -> None:
    clock = FakeClock()
    s = make(clock, slots=1, max_wait_s=0.0, max_queue=64)
    for i in range(50):
        (t,) = of(clock, f"client-{i}")
        s.waiting.append(t)
        assert s.admit() == [t]
        s.release(t)
    s.admit()
    assert len(s.fairness.last_admitted) <= 1


def test_window_still_starts_at_the_first_arrival_when_the_queue_is_reordered() -> None:
    clock = FakeClock()
    s = make(clock, slots=4, max_wait_s=0.05)
    (a,) = of(clock, "a")
    s.waiting.append(a)
    assert s.admit() == []
    clock.advance(0.03)
    (b,) = of(clock, "b")
    b.continuing = True  # ranks first
    s.waiting.append(b)
    assert s.admit() == []
    assert s.window_open_until() == pytest.approx(a.arrival + 0.05)
    clock.advance(0.021)
    assert s.admit() == [b, a]


def test_admissible_counts_the_places_the_next_admission_takes() -> None:
    # What the queue notes' estimate asks: which waiting places get in at the next step, and
    # it must agree with what admit() then does.
    clock = FakeClock()
    s = make(clock, slots=4, kv_tokens=300, max_wait_s=0.0)
    assert s.admissible() == 4  # idle: every slot open, also to those still arriving
    first = seq(clock, n_prompt=84)  # reserves 100 cells
    s.waiting.append(first)
    s.admit()
    assert s.admissible() == 3  # three slots left, nobody waiting
    big, small = seq(clock, n_prompt=184), seq(clock, n_prompt=34)  # 200 cells do not fit beside 100
    s.waiting.extend([small, big])
    assert s.admissible() == 1  # small fits (150 of 300), big waits for cache space
    assert s.admit() == [small] and list(s.waiting) == [big]
    assert s.admissible() == 0
    for t in (first, small):
        s.release(t)
    assert s.admissible() == 4  # big fits now, and the other three slots are open
    assert s.admit() == [big]


def test_admissible_stops_at_the_slots() -> None:
    clock = FakeClock()
    s = make(clock, slots=2, max_wait_s=0.0)
    s.waiting.extend(seq(clock) for _ in range(5))
    assert s.admissible() == 2
    assert len(s.admit()) == 2 and s.admissible() == 0


# -- lanes: background work runs in the capacity people leave -----------------------------------
def background(clock: FakeClock, client: str, n: int = 1, **kw: object) -> list[Turn]:
    out = of(clock, client, n, **kw)
    for t in out:
        t.lane = Lane.BACKGROUND
    return out


def test_people_are_admitted_before_background_work_that_came_first() -> None:
    clock = FakeClock()
    s = make(clock, slots=1, max_wait_s=0.0, people_slots=0)
    titles = background(clock, "owui/person:a", 2) + background(clock, "owui/person:b")
    clock.advance(0.005)  # the chat turn, milliseconds after its front-end's title request
    (chat,) = of(clock, "owui/person:a")
    s.waiting.extend([*titles, chat])
    assert s.admit() == [chat]
    # Among themselves, background requests are fair across clients as people's are: a has
    # just been served, so b's goes first, then a's two.
    order: list[Turn] = []
    while s.waiting:
        for t in list(s.running):
            s.release(t)
        order += s.admit()
    assert order == [titles[2], titles[0], titles[1]]


def test_background_work_leaves_free_slots_to_people() -> None:
    clock = FakeClock()
    s = make(clock, slots=8, max_wait_s=0.0, max_queue=64)  # people_slots -1: a quarter of 8
    assert s.limits.kept_for_people == 2 and s.limits.background_cap == 1
    batch = background(clock, "nightly", 10)
    s.waiting.extend(batch)
    assert s.admit() == batch[:1] and s.admissible() == 0  # an eighth of the slots
    people = of(clock, "10.0.0.7", 6)
    s.waiting.extend(people)
    assert s.admit() == people
    assert [t for t in s.waiting] == batch[1:]
    wide = make(clock, slots=24, max_wait_s=0.0, max_queue=64)
    wide.waiting.extend(background(clock, "nightly", 10))
    assert len(wide.admit()) == 3 == wide.limits.background_cap
    # One slot: background work still runs, in its turn.
    assert make(clock, slots=1).limits.kept_for_people == 0


def test_background_work_adds_at_most_a_tenth_of_peoples_rows_to_a_step() -> None:
    clock = FakeClock()
    s = make(clock, slots=16, batch_tokens=64, max_wait_s=0.0)  # two background turns at once
    (title,) = background(clock, "owui/person:a", n_prompt=40)
    s.waiting.append(title)
    s.admit()
    while title.prefill_left:  # alone, it is read 16 rows a step (BACKGROUND_ALONE_ROWS)
        run_step(s)
    (paste,) = background(clock, "owui/person:b", n_prompt=300)
    (chat,) = of(clock, "owui/person:a", n_prompt=100)
    s.waiting.extend([paste, chat])
    s.admit()
    step = s.schedule()
    # The person's prompt takes the step but one row, kept for the title's decode ...
    assert step.prefill == [(chat, 63)] and step.decode == [title]
    run_step(s)
    # ... and with the rest of it (37 rows), background work adds a tenth: the title's token
    # and 2 of the paste's. A step's time grows with its rows: filling what people leave
    # slowed their streams and first tokens 4x (12.9 -> 3.4 tok/s, Open WebUI's titles).
    step = s.schedule()
    assert step.prefill == [(chat, 37), (paste, 2)] and step.decode == [title]
    run_step(s)
    # A person's prompt that arrives later goes first; people decoding, the same tenth.
    (later,) = of(clock, "10.0.0.9", n_prompt=20)
    s.waiting.append(later)
    s.admit()
    step = s.schedule()
    assert [t for t, _ in step.prefill] == [later, paste]
    people = sum(n for t, n in step.prefill if not t.background) + sum(not t.background for t in step.decode)
    assert people == 21 and dict(step.prefill)[paste] + (title in step.decode) == 2
    # Without people's work in a step, background work has 16 rows of it.
    while chat.state is not State.DECODE or later.state is not State.DECODE:
        run_step(s)
    for t in (chat, later):
        s.release(t)
    step = s.schedule()
    assert sum(n for _, n in step.prefill) + len(step.decode) == min(16, paste.prefill_left + 1)


def test_background_work_alone_reads_16_rows_a_step_so_a_person_arriving_waits_one_short_step() -> None:
    clock = FakeClock()
    s = make(clock, slots=8, batch_tokens=128, prefill_chunk=64, max_wait_s=0.0)
    (title,) = background(clock, "owui/person:a", n_prompt=40)
    s.waiting.append(title)
    s.admit()
    step = s.schedule()
    # Not the whole step, nor a prefill_chunk: a person who arrives now waits for this one (a
    # 64-row background step held Open WebUI's chat 2.5 s for its slot on a slow 2-core VM).
    assert step.prefill == [(title, 16)] and not step.decode
    run_step(s)
    (chat,) = of(clock, "owui/person:a", n_prompt=100)
    s.waiting.append(chat)
    s.admit()
    step = s.schedule()
    rows = dict(step.prefill)
    assert step.prefill[0][0] is chat and rows.get(title, 0) <= max(1, rows[chat] // 10)
    # Alone again, it goes on a chunk a step until read.
    while chat.state is not State.DECODE:
        run_step(s)
    s.release(chat)
    steps = []
    while title.state is not State.DECODE:
        steps.append(sum(n for _, n in s.schedule().prefill))
        run_step(s)
    assert steps and all(0 < n <= 16 for n in steps)


def test_a_persons_own_background_work_does_not_put_their_next_turn_behind_a_backlog() -> None:
    """Ann's front-end asks for a title after her answer; her next question comes while it
    runs. She asked while nothing of hers ran in her lane: she goes before Ben's backlog (turns
    sent while one of his was served), as she would without the title request."""
    clock = FakeClock()
    s = make(clock, slots=8, max_wait_s=0.0, max_queue=64)
    (ann1,) = of(clock, "ann")
    s.waiting.append(ann1)
    assert s.admit() == [ann1]
    s.release(ann1)
    clock.advance(1)
    (ben1,) = of(clock, "ben")
    s.waiting.append(ben1)
    assert s.admit() == [ben1]
    clock.advance(1)
    (title,) = background(clock, "ann")
    s.waiting.append(title)
    assert s.admit() == [title]  # admitted after Ben's turn: Ann's latest admission
    clock.advance(1)
    backlog = of(clock, "ben", 2)  # sent while ben1 runs
    clock.advance(1)
    (ann2,) = of(clock, "ann")  # while her title runs
    clock.advance(1)
    s.release(title)  # it ends after she asked
    s.waiting.extend([*backlog, ann2])
    assert s.order(clock())[0] is ann2


def test_an_idle_engine_holds_background_work_briefly_so_the_chat_right_behind_it_goes_first() -> None:
    """Open WebUI sends a background request ~0.25 s before the chat turn it goes with: started
    at once, it took the step the chat then waited for."""
    clock = FakeClock()
    s = make(clock, slots=8, background_hold_s=0.5)
    (title,) = background(clock, "owui/person:a")
    s.waiting.append(title)
    assert s.admit() == [] and s.window_open_until() == title.arrival + 0.5
    clock.advance(0.25)
    (chat,) = of(clock, "owui/person:a")
    s.waiting.append(chat)
    clock.advance(0.05)  # the people's admission window (max_wait_s)
    assert s.admit() == [chat, title]  # the chat first; with a person running, no hold
    # Alone, it starts once held that long.
    (later,) = background(clock, "owui/person:b")
    for t in (chat, title):
        s.release(t)
    s.waiting.append(later)
    assert s.admit() == []
    clock.advance(0.5)
    assert s.window_open_until() is None and s.admit() == [later]


def test_the_background_hold_is_a_small_part_of_the_queue_timeout() -> None:
    """Held longer than it may wait, a background request on an idle engine would always time out."""
    clock = FakeClock()
    s = make(clock, slots=8, background_hold_s=0.5, queue_timeout_s=0.3)
    (title,) = background(clock, "owui/person:a")
    s.waiting.append(title)
    assert s.window_open_until() == title.arrival + 0.3 / 4
    clock.advance(0.3 / 4)
    assert s.admit() == [title]
