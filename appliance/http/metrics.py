"""Prometheus metrics (the only prometheus_client user).

Everything the engine measures is rendered at scrape time from the snapshot it publishes:
counts, gauges and the histograms it keeps as bucket counts (engine/figures.py). The only
figure kept here is the refusals, which the HTTP side decides.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from appliance.cpu import SENSORS, Sensors

if TYPE_CHECKING:
    from appliance.engine.engine import Engine
    from appliance.engine.figures import HistogramView

class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rejected = Counter("appliance_rejected_requests", "Requests refused before queuing",
                                ["reason"], registry=r)

    def attach(self, engine: Engine, sensors: Sensors = SENSORS) -> None:
        self.registry.register(_EngineCollector(engine, sensors))


class _EngineCollector(Collector):
    def __init__(self, engine: Engine, sensors: Sensors) -> None:
        self.engine = engine
        self.sensors = sensors

    def collect(self) -> Iterator[Any]:
        snap = self.engine.snapshot  # one immutable picture: every figure from the same moment
        c = snap.counters
        yield _gauge("appliance_queue_depth", "Requests waiting for a slot", snap.queue)
        yield _gauge("appliance_slots_active", "Slots running a request", snap.running)
        yield _gauge("appliance_slots_idle", "Free slots", snap.slots - snap.running)
        yield _gauge("appliance_sessions_cached", "Idle sessions holding KV cache", snap.sessions_cached)
        yield _gauge("appliance_sessions_parked", "Sessions parked in RAM", snap.sessions_parked)
        yield _gauge("appliance_parked_bytes", "RAM used by parked sessions", snap.parked_bytes)
        if snap.threads:  # share_cores = "off": the count is fixed, and nobody measures the others
            yield _gauge("appliance_llama_threads", "llama.cpp threads decoding (fewer while other processes use our cores)",
                         snap.threads)
            yield _gauge("appliance_cores_used_by_others", "Of the engine's cores, how many other processes used lately",
                         snap.cores_others)
        yield _counter("appliance_prompt_tokens_received", "Prompt tokens in admitted requests",
                       c.prompt_tokens_received)
        yield _counter("appliance_prompt_tokens_computed", "Prompt tokens actually prefilled",
                       c.prompt_tokens_computed)
        yield _counter("appliance_prompt_tokens_reused", "Prompt tokens found in the KV cache",
                       max(0, c.prompt_tokens_received - c.prompt_tokens_computed))
        yield _counter("appliance_generated_tokens", "Tokens generated", c.generated_tokens)
        yield _counter("appliance_draft_tokens", "Speculative draft tokens verified", c.draft_tokens)
        yield _counter("appliance_draft_accepted", "Speculative draft tokens accepted", c.draft_accepted)
        yield _counter("appliance_decode_steps", "llama_decode calls", c.steps)
        rows = CounterMetricFamily("appliance_batch_rows", "Rows of the llama_decode batches by kind", labels=["kind"])
        for kind, n in (("decode", c.decode_rows), ("prefill", c.prompt_tokens_computed), ("draft", c.draft_tokens)):
            rows.add_metric([kind], n)
        yield rows
        spent = CounterMetricFamily("appliance_engine_seconds",
                                    "The engine thread's wall time by phase (decode: in llama_decode; idle: no work)",
                                    labels=["phase"])
        for phase, sec in c.seconds.items():
            spent.add_metric([phase], sec)
        yield spent
        done = CounterMetricFamily("appliance_requests", "Finished requests by outcome", labels=["outcome"])
        for outcome, n in sorted(c.finished.items()):
            done.add_metric([outcome], n)
        yield done
        sess = CounterMetricFamily("appliance_session_events", "Session cache events", labels=["event"])
        for name, n in sorted(snap.cache_events.items()):
            sess.add_metric([name], n)
        yield sess
        for h in snap.histograms:
            yield _histogram(h)
        yield from self._machine()

    def _machine(self) -> Iterator[Any]:
        """Liveness, memory and heat: what a hang, a leak or a hot cupboard looks like."""
        yield _gauge("appliance_engine_stalled_seconds",
                     "How long one engine step has run, once beyond stall_s (a hang); 0 otherwise",
                     self.engine.stalled_s)
        mem, heat = self.sensors.read()
        yield _gauge("appliance_memory_total_bytes", "Memory this process may use (RAM, or its cgroup's limit)",
                     mem.total)
        yield _gauge("appliance_memory_available_bytes", "Memory still available to this process", mem.available)
        yield _gauge("appliance_memory_pressure_ratio",
                     "PSI some avg10: share of the last 10 s in which a task waited for memory", mem.pressure / 100)
        yield _gauge("appliance_park_budget_bytes", "RAM parked sessions may use now (shrinks when memory runs short)",
                     self.engine.snapshot.park_budget)
        yield _gauge("appliance_thermal_throttled", "1 while the CPU is thermally throttled", int(heat.throttled))
        temp = GaugeMetricFamily("appliance_temperature_celsius", "Temperature per thermal zone", labels=["zone"])
        for zone, celsius in heat.zones:
            temp.add_metric([zone], celsius)
        yield temp


def _histogram(h: HistogramView) -> HistogramMetricFamily:
    """A histogram the engine kept as per-bucket counts, as Prometheus wants it: cumulative."""
    cumulative, n = [], 0
    for bound, count in zip((*h.bounds, float("inf")), h.counts):
        n += count
        cumulative.append((floatToGoString(bound), n))
    return HistogramMetricFamily(h.name, h.doc, buckets=cumulative, sum_value=h.total)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)
