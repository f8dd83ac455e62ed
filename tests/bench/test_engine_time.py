"""The engine's wall time by phase and its batch rows, as /metrics renders them and as
`appliance bench` reads them back (bench/engine_time.py): the breakdown of a run."""

from __future__ import annotations

from helpers.inprocess import CHAT, USER, is_idle, serving, user, wait_health

from appliance.bench import engine_time


def test_metrics_show_where_the_engine_time_went_and_the_bench_reads_it() -> None:
    with serving() as client:
        wait_health(client.get, is_idle)
        before = engine_time.parse(client.get("/metrics").text)
        for i in range(3):
            r = client.post(CHAT, json={"messages": USER, "max_tokens": 4}, headers=user(i))
            assert r.status_code == 200, r.text
        wait_health(client.get, is_idle)
        after = engine_time.parse(client.get("/metrics").text)
    phases = {f"appliance_engine_seconds:{p}" for p in ("decode", "sample", "admit", "other", "idle")}
    rows = {f"appliance_batch_rows:{k}" for k in ("decode", "prefill", "draft")}
    assert phases | rows | {"appliance_decode_steps", "appliance_generated_tokens"} <= after.keys()
    d = engine_time.delta(before, after)
    b = engine_time.breakdown(d, 2.0)
    generated = d["appliance_generated_tokens"]
    assert generated >= 3 and b["generated"] == generated
    assert b["steps"] > 0 and b["decode_rows"] > 0 and b["prefill_rows"] == d["appliance_prompt_tokens_computed"] > 0
    assert b["rows_per_step"] == round((b["decode_rows"] + b["prefill_rows"] + b["draft_rows"]) / b["steps"], 1)
    assert d["appliance_engine_seconds:decode"] > 0 and d["appliance_engine_seconds:idle"] > 0
    assert all(b[f"{p}_share"] >= 0 for p in ("sample", "admit", "other"))
    assert b["slot_waits"] == 3  # each request waited for a slot once (for no time, here)
    # Rounds add up, and a page without the appliance's counters has none.
    assert engine_time.add(d, d)["appliance_decode_steps"] == 2 * d["appliance_decode_steps"]
    assert engine_time.parse("# HELP x\nllama_requests 1\n") == {}
