"""A prompt's prefill progress (events.Progress): emitted after each step that advanced it,
only for turns that asked (Report.LONG: prompts longer than one step; Report.EVERY: every
prompt, from where its reading starts, with the count found cached), never after the first
Delta or the end; the first step is one prefill_chunk, so the first note comes soon. And
each Delta carries the ids of the tokens behind its text."""

from __future__ import annotations

import asyncio

from helpers.engines import Recorder, collect, make, run, started
from helpers.fakes import FakeModel

from appliance.engine.events import Delta, Done, Failed, Progress, Report
from appliance.engine.inbox import Cancel
from appliance.sampling import SamplingParams


def progress(rec: Recorder) -> list[tuple[int, int]]:
    return [(e.done, e.total) for e in rec.events if isinstance(e, Progress)]


def only_before_the_first_delta(rec: Recorder) -> None:
    kinds = [type(e) for e in rec.events]
    first_text = kinds.index(Delta) if Delta in kinds else len(kinds)
    assert Progress not in kinds[first_text:], kinds
    assert isinstance(rec.events[-1], (Done, Failed))


def test_a_long_prompt_reports_increasing_progress_up_to_its_length() -> None:
    model = FakeModel(reply="ok")
    c = make(model, batch_tokens=64, prefill_chunk=16)
    since = len(model.calls)
    _, rec = c.submit(list(range(100, 400)), progress=True)
    c.run()
    assert rec.text == "ok" and isinstance(rec.end, Done)
    got = progress(rec)
    # The first step is one prefill_chunk, then full steps, one note per step.
    assert [d for d, _ in got] == [16, 80, 144, 208, 272, 300], got
    assert {t for _, t in got} == {300}
    assert [len(call[0]) for call in model.calls[since:since + 6]] == [16, 64, 64, 64, 64, 28]
    only_before_the_first_delta(rec)


def test_a_prompt_one_step_computes_and_a_turn_that_did_not_ask_report_nothing() -> None:
    model = FakeModel(reply="ok")
    c = make(model, batch_tokens=64, prefill_chunk=16)
    _, short = c.submit(list(range(100, 164)), progress=True)  # exactly one full step
    c.run()
    since = len(model.calls)
    _, quiet = c.submit(list(range(500, 800)))  # long, but nobody listens
    c.run()
    assert progress(short) == [] and progress(quiet) == []
    assert short.text == quiet.text == "ok"
    assert len(model.calls[since][0]) == 64  # and its first step is not cut to a chunk


def test_progress_counts_the_reused_prefix_and_a_short_follow_up_reports_none() -> None:
    model = FakeModel(reply="ok")
    c = make(model, batch_tokens=64, prefill_chunk=16)
    doc = list(range(100, 300))
    _, first = c.submit(doc, session="s", progress=True)
    c.run()
    answer = [ord(ch) for ch in first.text]
    _, again = c.submit(doc + answer + list(range(600, 620)), session="s", progress=True)
    c.run()
    assert isinstance(again.end, Done) and again.end.cached_tokens == len(doc) + 2
    assert progress(again) == []  # 20 new tokens: one short step
    _, longer = c.submit(doc + answer + list(range(600, 800)), session="s", progress=True)
    c.run()
    n = len(doc) + 2 + 200
    assert isinstance(longer.end, Done)
    reused = longer.end.cached_tokens  # the last turn's prompt: doc, answer and the 20 tokens
    assert reused == len(doc) + 2 + 20
    assert progress(longer) == [(reused + 16, n), (reused + 80, n), (reused + 144, n), (n, n)]


def test_cancel_mid_prefill_ends_cleanly_with_no_progress_after_the_end() -> None:
    c = make(FakeModel(reply="ok"), batch_tokens=64, prefill_chunk=16)
    turn, rec = c.submit(list(range(100, 400)), progress=True)
    c.step()
    c.step()
    assert progress(rec) == [(16, 300), (80, 300)]
    c.core.inbox.put(Cancel(turn.rid))
    c.run()
    assert isinstance(rec.end, Done) and rec.end.finish_reason == "cancelled"
    assert progress(rec) == [(16, 300), (80, 300)] and rec.text == ""
    assert not c.leaked_ids() and not c.core.sched.running


def test_progress_while_others_stream_stays_before_the_prompts_first_delta() -> None:
    c = make(FakeModel(reply="z" * 40), slots=2, batch_tokens=64, prefill_chunk=16)
    _, talk = c.submit([1, 2, 3], max_tokens=40, progress=True)
    c.step()  # the short one is generating
    _, paste = c.submit(list(range(100, 300)), max_tokens=5, progress=True)
    c.run()
    assert progress(talk) == []
    got = progress(paste)
    assert got[-1] == (200, 200) and all(a[0] < b[0] for a, b in zip(got, got[1:])), got
    only_before_the_first_delta(paste)
    assert len(talk.text) == 40


def test_a_handle_yields_progress_before_its_text_and_can_still_cancel() -> None:
    async def main() -> None:
        model = FakeModel(reply="ok")
        eng = await started(model, slots=1, batch_tokens=64, prefill_chunk=16)
        kinds = [type(ev) async for ev in eng.submit(list(range(100, 400)), SamplingParams(max_tokens=5),
                                                     progress=True).events()]
        assert kinds[0] is Progress and kinds[-1] is Done and Delta in kinds
        assert Progress not in kinds[kinds.index(Delta):]
        text, _ = await collect(eng.submit(list(range(100, 400)), SamplingParams(max_tokens=5), session="x"))
        assert text == "ok"
        # A Progress is not an end: a cancel after one still reaches the engine.
        model.delay = 0.1  # six steps: 0.5 s left for the cancel to arrive after the first
        h = eng.submit(list(range(500, 800)), SamplingParams(max_tokens=5), progress=True)
        assert isinstance(await h.events().__anext__(), Progress)
        h.cancel()
        _, end = await collect(h)
        assert isinstance(end, Done) and end.finish_reason == "cancelled" and end.completion_tokens == 0
        eng.stop()
    run(asyncio.wait_for(main(), 20))


def test_every_prompt_reports_from_its_cached_start_when_asked_for_all() -> None:
    model = FakeModel(reply="ok")
    c = make(model, batch_tokens=64, prefill_chunk=16)
    _, short = c.submit(list(range(100, 120)), session="s", progress=Report.EVERY)
    c.run()
    assert [(e.done, e.total, e.cached) for e in short.events if isinstance(e, Progress)] == [(0, 20, 0), (20, 20, 0)]
    only_before_the_first_delta(short)
    answer = [ord(ch) for ch in short.text]
    _, follow = c.submit(list(range(100, 120)) + answer + [7, 8, 9], session="s", progress=Report.EVERY)
    c.run()
    held = 20 + len(answer)  # the last turn's prompt and answer, found in the cache
    assert [(e.done, e.total, e.cached) for e in follow.events if isinstance(e, Progress)] == \
        [(held, held + 3, held), (held + 3, held + 3, held)]
    _, long = c.submit(list(range(300, 500)), progress=Report.EVERY)
    c.run()
    assert [e.done for e in long.events if isinstance(e, Progress)] == [0, 16, 80, 144, 200]


def test_each_delta_carries_the_ids_behind_its_text_and_a_stop_string_keeps_its_own() -> None:
    model = FakeModel(reply="hello world")
    c = make(model)
    _, rec = c.submit([1, 2, 3])
    c.run()
    deltas = [e for e in rec.events if isinstance(e, Delta)]
    assert [e.tokens for e in deltas] == [[ord(ch)] for ch in "hello world"]
    params = SamplingParams(max_tokens=20, temperature=0.0, stop=("o w",))
    _, stopped = c.submit([4, 5, 6], params=params)
    c.run()
    assert stopped.text == "hell"
    # "o", " " and "w" were held back, then cut by the stop string: their ids still go out, last.
    ids = [t for e in stopped.events if isinstance(e, Delta) for t in e.tokens]
    assert ids == [ord(ch) for ch in "hello w"]
    assert isinstance(stopped.end, Done) and stopped.end.completion_tokens == len(ids)
