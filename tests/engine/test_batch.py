"""batch.split: a step whose streams and prompt chunks reach llama.cpp's flash-attention tile
(64 rows) runs as two calls, chunks apart from the streams; under it, one call."""

from __future__ import annotations

from appliance.engine.batch import FA_TILE_ROWS, SPLIT_MIN_CELLS, split
from appliance.engine.scheduler import Step
from appliance.engine.turn import State, Turn
from appliance.sampling import SamplingParams


def turn(rid: int, prompt_len: int, decoding: bool) -> Turn:
    """A turn holding prompt_len cells (a stream) or about to read them (a prompt)."""
    t = Turn(rid=rid, prompt=list(range(1, prompt_len + 1)), params=SamplingParams(max_tokens=8, temperature=0.0),
             arrival=0.0, sink=lambda ev: None, client="c", session=f"s{rid}")
    t.seq_id = rid
    if decoding:
        t.state, t.n_cached = State.DECODE, prompt_len
    else:
        t.state = State.PREFILL
    return t


def test_streams_and_a_chunk_under_a_tile_stay_one_call() -> None:
    streams = [turn(i, 200, True) for i in range(12)]
    short = turn(20, 40, False)
    step = Step(decode=streams, prefill=[(short, 40)])
    assert step.n_tokens == 52 < FA_TILE_ROWS
    assert split(step) == [step]


def test_a_chunk_that_reaches_the_tile_runs_before_the_streams() -> None:
    streams = [turn(i, 200, True) for i in range(12)]
    short, paste = turn(20, 30, False), turn(21, 700, False)
    step = Step(decode=streams, prefill=[(short, 30), (paste, 175)])
    first, second = split(step)
    # The paste's chunk alone first; the short prompt still finishes beside the streams.
    assert first.decode == [] and first.prefill == [(paste, 175)]
    assert second.decode == streams and second.prefill == [(short, 30)]
    assert second.n_tokens < FA_TILE_ROWS
    # Every planned row runs exactly once.
    assert first.n_tokens + second.n_tokens == step.n_tokens


def test_prompts_beyond_the_room_beside_the_streams_go_with_the_chunk() -> None:
    streams = [turn(i, 200, True) for i in range(20)]
    a, b = turn(30, 30, False), turn(31, 40, False)  # 20 + 30 fits under 64; + 40 does not
    first, second = split(Step(decode=streams, prefill=[(a, 30), (b, 40)]))
    assert first.prefill == [(b, 40)] and second.prefill == [(a, 30)]


def test_prompts_alone_or_streams_alone_are_never_split() -> None:
    prompts = Step(prefill=[(turn(1, 300, False), 256)])
    assert split(prompts) == [prompts]
    streams = Step(decode=[turn(i, 20, True) for i in range(24)])
    assert split(streams) == [streams]


def test_streams_holding_few_cells_stay_in_one_call() -> None:
    # Short conversations: the union a tile attends over is small, and the second pass over
    # the weights would cost more than it saves (8 streams of 140 cells: 0.97-1.01x).
    small = [turn(i, 140, True) for i in range(8)]
    step = Step(decode=small, prefill=[(turn(20, 700, False), 120)])
    assert sum(t.n_cached for t in small) < SPLIT_MIN_CELLS
    assert split(step) == [step]
    large = [turn(i, 340, True) for i in range(8)]
    assert len(split(Step(decode=large, prefill=[(turn(20, 700, False), 120)]))) == 2
