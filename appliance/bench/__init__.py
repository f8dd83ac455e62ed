"""`appliance bench`: a closed-loop load generator for OpenAI-compatible streaming chat servers.

Reports tokens/s, TTFT, end-to-end and inter-token latency per concurrency level, optionally
side by side with peer servers measured in the same invocation under the same machine load.
Workloads: chat (questions, or multi-turn users with think time), rewrite, burst (N requests
let go at once: do all come back?), soak (steady load for a fixed time, the server's RSS
sampled) and office (N users in seeded multi-turn conversations with think times and pasted
documents for a fixed time: TTFT tails, per-user pace, fairness). Each simulated user has its
own connection and, against a loopback URL, its own source address. Output: tables
(fixed-width or Markdown), JSON, JSON lines, a plot.

Modules, imports running downwards: prompts, workload, schedule (what is sent); results (what
came back); target, rss, progress; load (measure, soak); office (run_office); report, records,
plot; cli.
"""

from __future__ import annotations

from appliance.bench.cli import add_arguments, run
from appliance.bench.load import STAGGER_S, Arrival, measure, soak
from appliance.bench.office import queue_length, run_office
from appliance.bench.plot import PlotError
from appliance.bench.progress import Progress
from appliance.bench.prompts import (
    BURST_PROMPTS,
    BURST_SIZE,
    CHARS_PER_TOKEN,
    DEFAULT_SYSTEM,
    DOC_ASKS,
    DOC_FOLLOW_UPS,
    FOLLOW_UPS,
    OFFICE_SYSTEM,
    PROMPT_SETS,
    PROMPTS,
    REWRITE_FOLLOW_UPS,
    REWRITE_PROMPTS,
    WorkloadName,
)
from appliance.bench.records import jsonl_records, read_jsonl
from appliance.bench.report import format_report
from appliance.bench.results import LevelResult, RequestResult, Sample, percentile
from appliance.bench.rss import listening_pid, rss_mib, server_pid
from appliance.bench.schedule import Conversation, Office, Turn, conversations
from appliance.bench.target import base_url, is_loopback, resolve_model, user_address
from appliance.bench.workload import Workload

__all__ = [
    "BURST_PROMPTS", "BURST_SIZE", "CHARS_PER_TOKEN", "DEFAULT_SYSTEM", "DOC_ASKS", "DOC_FOLLOW_UPS",
    "FOLLOW_UPS", "OFFICE_SYSTEM", "PROMPTS", "PROMPT_SETS", "REWRITE_FOLLOW_UPS", "REWRITE_PROMPTS",
    "STAGGER_S", "Arrival", "Conversation", "LevelResult", "Office", "PlotError", "Progress",
    "RequestResult", "Sample", "Turn", "Workload", "WorkloadName", "add_arguments", "base_url",
    "conversations", "format_report", "is_loopback", "jsonl_records", "listening_pid", "measure",
    "percentile", "queue_length", "read_jsonl", "resolve_model", "rss_mib", "run", "run_office",
    "server_pid", "soak", "user_address",
]
