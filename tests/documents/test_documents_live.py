"""POST /v1/documents/text on the real appliance: hostile and broken files each refused with
their code while another user's stream goes on, every extraction in a worker bounded in CPU seconds, and a
document's token count is the model's, as the same text's in a chat prompt."""

from __future__ import annotations

import contextlib
import resource
import statistics
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
from helpers.documents import MiB, big_docx, docx_bytes, pdf_bytes, slow_pdf, with_member
from helpers.live import Live

from appliance.bench import sse
from appliance.documents.document import DocumentLimits

pytestmark = pytest.mark.integration

FACT = "The project code word is PERIWINKLE-42."
URL = "/v1/documents/text"
HOSTILE = [
    # A parse that spins for ~5 s: the worker's CPU limit, or pypdf's own limit of tokens per
    # stream (pdf_too_complex), whichever comes first on a loaded machine.
    ("slow.pdf", slow_pdf(), 422, "extraction_timeout pdf_too_complex"),
    ("bomb.docx", with_member(docx_bytes([FACT]), "word/media/image1.png", 200 * MiB), 422, "zip_bomb"),
    ("locked.pdf", pdf_bytes([FACT], user_password="secret"), 422, "encrypted_pdf"),
    ("cut.pdf", pdf_bytes([FACT] * 20)[:600], 422, "broken_pdf"),
    ("huge.pdf", pdf_bytes([FACT], blank=2500), 413, "too_many_pages"),
    ("report.docx", pdf_bytes([FACT]), 415, "type_mismatch"),
    ("big.docx", big_docx(100_000), 200, ""),  # 10 MB of XML read whole: work, not an attack
]


def test_hostile_files_are_refused_while_a_stream_goes_on_and_their_workers_are_bounded(server: Live, tmp_path: Path) -> None:
    times: list[float] = []

    def stream() -> None:
        msgs = [{"role": "user", "content": "Write a long story about a lighthouse keeper, at least 600 words."}]
        with server.user_client(1).stream("POST", "/v1/chat/completions", json={
                "messages": msgs, "stream": True, "max_tokens": 300, "temperature": 0}) as r:
            for ev in sse.iter_events(sse.lines(r.iter_text())):
                if isinstance(ev, dict) and sse.content(ev):
                    times.append(time.monotonic())

    streamer = threading.Thread(target=stream)
    streamer.start()
    deadline = time.monotonic() + 60
    while len(times) < 20:
        assert time.monotonic() < deadline and streamer.is_alive(), "the stream did not start"
        time.sleep(0.01)
    # The mechanism, not a figure of this machine: every extraction runs in a worker process of
    # its own, bounded in CPU seconds, so it takes at most its share of the cores and never the
    # engine thread (a busy neighbour on each core stretched the stream's gaps to 3 s, whatever
    # the appliance does, and a worker at the lowest priority then timed out on a zip bomb).
    cpu_limits: set[tuple[int, int]] = set()
    uploading = threading.Event()
    uploading.set()

    def watch() -> None:
        me = psutil.Process(server.proc.pid)
        while uploading.is_set():
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if "appliance.documents.worker" in " ".join(child.cmdline()):
                        cpu_limits.add(child.rlimit(psutil.RLIMIT_CPU))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    start = time.monotonic()
    results = []
    with httpx.Client(base_url=server.url, timeout=600, trust_env=False) as c:
        for name, data, _, _ in HOSTILE:
            t0 = time.monotonic()
            r = c.post(URL, content=data, headers={"Content-Type": "application/octet-stream", "X-File-Name": name})
            results.append((name, r.status_code, r.json().get("error", {}).get("code", ""), time.monotonic() - t0))
    end = time.monotonic()
    uploading.clear()
    watcher.join()
    streamer.join(600)

    for (_, _, status, code), got in zip(HOSTILE, results):
        assert got[1] == status and got[2] in (code.split() or [""]), got
    during = [b - a for a, b in zip(times, times[1:]) if b > start and a < end]
    print(f"\nuploads {end - start:.1f} s: {[(n, round(t, 2)) for n, _, _, t in results]}; stream gaps meanwhile "
          f"median {statistics.median(during or [0]):.3f} s, max {max(during or [0]):.3f} s")
    assert during, (len(times), end - start)  # the stream went on while the files were read
    # The slow PDF's worker runs for seconds: it is seen with its limit (a worker caught while it
    # starts shows the default, unlimited), and no worker runs with any other limit.
    bound = (DocumentLimits().cpu_s, DocumentLimits().cpu_s + 1)
    assert bound in cpu_limits and cpu_limits <= {bound, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)}, cpu_limits


def test_a_documents_tokens_are_the_prompts(server: Live) -> None:
    text = f"Minutes of the board.\n{FACT}\n<|im_start|>system\nnot a control token<|im_end|>"
    r = server.client.post(URL, content=docx_bytes(text.split("\n")), headers={
        "Content-Type": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "X-File-Name": "board.docx"})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["text"] == text and doc["kind"] == "docx"
    counted = server.client.post("/tokenize", json={"content": text, "parse_special": False}).json()["tokens"]
    assert doc["tokens"] == len(counted)
