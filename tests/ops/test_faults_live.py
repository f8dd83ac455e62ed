"""What one slow, broken or curious client does reaches nobody else (issue 35), against the
real server on the bundled model: slow request bodies, a state directory that turns
read-only or fills up under the running server, usage counted through a disk error, a stop
in the middle of long answers, a guessed system prompt, unread answers and oversized headers.

The state directory's faults are real: the server runs in a mount namespace of its own
(unshare, as root, which CI is) with its state directory bind-mounted, and the test remounts
that read-only, or mounts a full tmpfs over it, while the server runs. Each test prints one
line of figures (`pytest -s`); docs/RELIABILITY.md records them. No assertion is about
speed: deadlines only catch a hang.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.live import Live
from helpers.polling import wait_until
from helpers.sse import content_of, events_of

from appliance.bench import user_address

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

CHAT = "/v1/chat/completions"
SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in one short sentence."}
SMALL = {"slots": 4, "ctx_per_slot": 1024, "kv_tokens": 4096}
HANG_S = 300


def _can_mount() -> bool:
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")):
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


needs_mounts = pytest.mark.skipif(not _can_mount(), reason="needs root and mount namespaces (unshare -m); CI has both")


def in_its_mounts(live: Live, *cmd: str) -> None:
    done = subprocess.run(["nsenter", "-t", str(live.proc.pid), "-m", *cmd], capture_output=True, text=True)
    assert done.returncode == 0, (cmd, done.stderr, Path(f"/proc/{live.proc.pid}/mountinfo").read_text()[-2000:])


def read_only(live: Live, state: Path) -> None:
    """The state directory turns read-only under the running server, as a failing SD card
    does: a read-only bind mount stacked over it (a remount of the mount the server holds
    files open on would be refused as busy). Files it opens from now on are read-only."""
    in_its_mounts(live, "sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0"', str(state))


def writable_again(live: Live, state: Path) -> None:
    in_its_mounts(live, "umount", "-l", str(state))


def open_fds(live: Live) -> int:
    return len(os.listdir(f"/proc/{live.proc.pid}/fd"))


def ask(live: Live, content: str, session: str | None = None, *, stream: bool = False, user: int | None = None,
        max_tokens: int = 12, **kw: Any) -> tuple[int, str, dict[str, Any]]:
    """(status, text, usage) of one chat turn; a streamed one's status is 200 only when no
    error event came."""
    headers = {"X-Session-Id": session} if session else {}
    body = {"messages": [SYSTEM, {"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, **kw}
    c = live.user_client(user)
    if not stream:
        r = c.post(CHAT, json=body, headers=headers, timeout=HANG_S)
        if r.status_code != 200:
            return r.status_code, r.text, {}
        return 200, r.json()["choices"][0]["message"]["content"], r.json()["usage"]
    body.update(stream=True, stream_options={"include_usage": True})
    with c.stream("POST", CHAT, json=body, headers=headers, timeout=HANG_S) as r:
        if r.status_code != 200:
            return r.status_code, r.read().decode(), {}
        evs = list(events_of(r))
    errors = [e for e in evs if isinstance(e, dict) and "error" in e]
    usage = next((e["usage"] for e in evs if isinstance(e, dict) and e.get("usage")), {})
    return (500 if errors else 200), str(errors) if errors else content_of(evs), usage


def cached(usage: dict[str, Any]) -> int:
    return int(usage.get("prompt_tokens_details", {}).get("cached_tokens", 0))


# -- 1. slow request bodies --------------------------------------------------------------------
class Trickler:
    """Sends a chat request's headers, then its body one byte every `every` s, from its own
    loopback address: a phone uploading on weak Wi-Fi, or a client doing it on purpose."""

    def __init__(self, live: Live, user: int, every: float = 2.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", live.port), source_address=(user_address(user), 0))
        body = b'{"messages":[{"role":"user","content":"' + b"x" * 400 + b'"}],"max_tokens":4}'
        head = (f"POST {CHAT} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n\r\n").encode()
        self.sock.sendall(head)
        self.body, self.every, self.sent = body, every, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.every) and self.sent < len(self.body) - 1:
            try:
                self.sock.sendall(self.body[self.sent:self.sent + 1])
            except OSError:
                return
            self.sent += 1

    def still_sending(self) -> bool:
        return self.thread.is_alive() and self.sent < len(self.body) - 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def first_token_s(live: Live, user: int) -> float:
    t0 = time.monotonic()
    body = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 4, "stream": True,
            "temperature": 0}
    with live.user_client(user).stream("POST", CHAT, json=body, timeout=HANG_S) as r:
        assert r.status_code == 200, r.read()
        for ev in events_of(r):
            if isinstance(ev, dict) and content_of([ev]):
                return time.monotonic() - t0
    raise AssertionError("no content")


def test_slow_request_bodies_hold_nothing_another_client_needs(start_server: Callable[..., Live]) -> None:
    """Four connections from two addresses trickle a chat body a byte every 2 s (each would
    take ~15 minutes): while all four are still sending, another client is answered, and
    /health shows no parse permit held by them."""
    live = start_server(**SMALL)
    alone = first_token_s(live, 7)
    slow = [Trickler(live, user) for user in (2, 2, 3, 3)]
    try:
        wait_until(lambda: all(t.sent >= 2 for t in slow), 30, "the slow senders to be sending")
        beside = [first_token_s(live, 7 + i) for i in range(3)]
        assert all(t.still_sending() for t in slow), "a slow sender was cut before the test asked"
        assert live.health()["parse"]["busy"] == 0, live.health()
    finally:
        for t in slow:
            t.close()
    print(f"\nfaults/slow bodies: another client's first token alone {alone * 1000:.0f} ms, beside four slow "
          f"senders from two addresses {', '.join(f'{b * 1000:.0f}' for b in beside)} ms")


# -- 2. a state directory that turns read-only or fills up -------------------------------------------
def saved_conversations(start_server: Callable[..., Live], state: Path, n: int) -> list[tuple[str, str]]:
    """n conversations answered and saved by a first server, stopped: [(session, question)]."""
    first = start_server(**SMALL, state=state)
    convs = [(f"ro-{i}-{secrets.token_hex(12)}", f"Name a thing that is colour number {i}.") for i in range(n)]
    for session, q in convs:
        assert ask(first, q, session)[0] == 200
    assert first.stop() == 0
    assert [p for p in state.iterdir() if p.suffix == ".kv"], "nothing was saved"
    return convs


@needs_mounts
@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_a_failing_state_directory_gives_no_5xx_leaks_nothing_and_says_so(
        start_server: Callable[..., Live], tmp_path: Path, fault: str) -> None:
    state = tmp_path / "state"
    convs = saved_conversations(start_server, state, 3)
    live = start_server(**SMALL, state=state, mounted=True)
    if fault == "read-only":
        read_only(live, state)
    else:  # a full disk: a small tmpfs over it holding the saved files, the rest filled
        in_its_mounts(live, "sh", "-c", f'cp -a "$0"/. /tmp/fault-copy-{live.port} && mount -t tmpfs -o size=8m,mode=0700 '
                      f'tmpfs "$0" && cp -a /tmp/fault-copy-{live.port}/. "$0"/ && '
                      f'(dd if=/dev/zero of="$0"/filler bs=64k 2>/dev/null; true)', str(state))
    fds = open_fds(live)
    statuses = []
    for session, q in convs:  # continuing each saved conversation, streamed and not, and retried
        for stream in (False, True, False):
            status, text, _ = ask(live, q + " And another?", session, stream=stream)
            statuses.append(status)
            assert status == 200, text
    for i in range(10):  # new conversations and anonymous requests too
        statuses.append(ask(live, f"Say the number {i}.", f"new-{i}-{secrets.token_hex(12)}")[0])
    assert set(statuses) == {200}
    # The library reads on; a change it cannot save is a 503 that says so, never a 500 (files it
    # holds open may still take writes: the read-only start below is where a refusal is certain).
    added = live.client.post("/admin/library", content=b"Fire drill: gather in the car park.",
                             headers={"content-type": "text/plain", "x-file-name": "drill.txt"})
    assert added.status_code in (202, 503), added.text
    assert added.status_code == 202 or added.json()["error"]["code"] == "library_not_writable"
    assert live.client.get("/v1/library").status_code == 200
    assert open_fds(live) <= fds + 2, (fds, open_fds(live))  # no descriptor per failure
    h = live.wait_health(lambda h: h.get("state_dir", {}).get("writable") is False, 90,
                         "/health to say the state directory is not writable")
    assert h["status"] == "ok"  # degraded, not down
    status = live.client.get("/admin/status").json()
    assert status["now"]["state_dir"]["writable"] is False
    print(f"\nfaults/{fault} state dir: {len(statuses)} requests, 0 5xx, descriptors {fds} -> {open_fds(live)}, "
          f"/health: {h['state_dir']}")
    assert live.stop() == 0
    assert live.log().count("not writable") <= 2  # once in the journal (and once when it is back)


@needs_mounts
def test_usage_counted_during_a_disk_error_is_in_the_database_after_a_restart(
        start_server: Callable[..., Live], tmp_path: Path) -> None:
    state = tmp_path / "state"
    live = start_server(**SMALL, state=state, mounted=True)
    assert ask(live, "Name a colour.", user=5)[0] == 200
    wait_until(lambda: live.client.get("/admin/status").json()["persistent"], 30, "the usage file to be written")
    read_only(live, state)
    for i in range(19):
        assert ask(live, f"Say the number {i}.", user=5)[0] == 200
    wait_until(lambda: not live.client.get("/admin/status").json()["persistent"], 30, "the disk error to be seen")
    writable_again(live, state)
    assert live.stop() == 0  # the last write at shutdown, or the writer's retry before it
    again = start_server(**SMALL, state=state)
    people = again.client.get("/admin/status").json()["people"]
    me = next(p for p in people if p["who"] == user_address(5))
    assert me["today"]["requests"] == 20, people
    print(f"\nfaults/usage through a disk error: 20 requests counted, {me['today']['requests']} after the restart")


@needs_mounts
def test_people_mode_loses_no_chat_on_a_restart_and_goes_on_through_a_read_only_or_corrupt_store(
        start_server: Callable[..., Live], tmp_path: Path) -> None:
    state = tmp_path / "state"
    people = {"auth": "people"}
    live = start_server(**SMALL, **people, state=state, mounted=True)
    r = live.client.post("/admin/people", json={"name": "Ann"})
    token = r.json()["invite_url"].rsplit("=", 1)[1]
    r = live.user_client(3).post("/auth/invite/accept", json={"token": token, "password": "ann's long password"})
    ann = {"cookie": r.headers["set-cookie"].split(";")[0], "x-csrf-token": r.json()["csrf"]}
    chat = {"title": "Plants", "messages": [{"role": "user", "content": "When are plants watered?"},
                                             {"role": "assistant", "content": "On Mondays."}]}
    assert live.user_client(3).put("/v1/chats/plants-chat-000000001", json=chat, headers=ann).status_code == 200
    assert live.stop() == 0

    # A restart loses no chat, and Ann stays signed in.
    live = start_server(**SMALL, **people, state=state, mounted=True)
    got = live.user_client(3).get("/v1/chats/plants-chat-000000001", headers=ann)
    assert got.status_code == 200 and got.json()["messages"][1]["content"] == "On Mondays."

    # The disk is read-only (an SD card the kernel remounted): Ann signs in and reads her chats,
    # answers go on, a save is a 503 that says so, /auth/me tells the page.
    assert live.stop() == 0
    live = start_server(**SMALL, **people, state=state, read_only=True)
    assert live.user_client(3).get("/v1/chats/plants-chat-000000001", headers=ann).status_code == 200
    signin = live.user_client(4).post("/auth/signin", json={"name": "Ann", "password": "ann's long password"})
    assert signin.status_code == 200
    body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
    statuses = [live.user_client(3).post(CHAT, json=body, headers=ann, timeout=HANG_S).status_code for _ in range(3)]
    put = live.user_client(3).put("/v1/chats/plants-chat-000000001", json=chat, headers=ann)
    assert statuses == [200, 200, 200] and put.status_code == 503 and "not saved" in put.json()["error"]["message"]
    assert live.user_client(3).put("/v1/chats/plants-chat-000000001", json=chat, headers=ann).status_code == 503
    me = live.user_client(3).get("/auth/me", headers=ann).json()
    assert me["person"]["name"] == "Ann" and me["store"]["saving"] is False
    added = live.client.post("/admin/library", content=b"Fire drill: gather in the car park.",
                             headers={"content-type": "text/plain", "x-file-name": "drill.txt"})
    assert added.status_code == 503 and added.json()["error"]["code"] == "library_not_writable", added.text
    assert "read-only" in added.json()["error"]["message"] and live.client.get("/admin/library").status_code == 200
    assert live.stop() == 0
    log = live.log()
    assert log.count("read-only") >= 1 and log.count("changes are not being saved") <= 1  # one line an outage

    # A corrupt file at start-up: one journal line, and the box answers (nobody can sign in until it is fixed).
    (state / "people.sqlite3").write_bytes(b"not a database " * 1000)
    for extra in ("people.sqlite3-wal", "people.sqlite3-shm"):
        (state / extra).unlink(missing_ok=True)
    live = start_server(**SMALL, **people, state=state)
    assert live.client.get("/health").json()["status"] == "ok"
    signin = live.user_client(3).post("/auth/signin", json={"name": "Ann", "password": "ann's long password"})
    assert signin.status_code == 503 and signin.json()["error"]["code"] == "store_unavailable"
    assert live.log().count("nobody can sign in until it is fixed") == 1
    print(f"\nfaults/people store: restart kept the chat; read-only: answers {statuses}, saves 503; corrupt: "
          f"health ok, sign-in {signin.status_code}")


# -- 4. a stop in the middle of long answers ----------------------------------------------------
def test_a_stop_ends_every_running_answer_with_the_error_event_and_keeps_its_conversation(
        start_server: Callable[..., Live], tmp_path: Path) -> None:
    state = tmp_path / "state"
    grace = 2
    live = start_server(**SMALL, grace_s=grace, state=state)
    sessions = [f"stop-{i}-{secrets.token_hex(12)}" for i in range(4)]
    results: dict[str, list[Any]] = {}
    started = threading.Barrier(len(sessions) + 1, timeout=120)

    def long_answer(session: str) -> None:
        body = {"messages": [SYSTEM, {"role": "user", "content": "Count from 1 to 500, one number per line."}],
                "max_tokens": 600, "stream": True, "temperature": 0, "ignore_eos": True}
        evs: list[Any] = []
        try:
            with live.client.stream("POST", CHAT, json=body, headers={"X-Session-Id": session}, timeout=HANG_S) as r:
                if r.status_code != 200:
                    evs.append(AssertionError(f"{r.status_code}: {r.read()!r}"))
                    started.abort()
                for ev in events_of(r):
                    evs.append(ev)
                    if len(evs) == 3:
                        started.wait()
        except httpx.HTTPError as e:  # a cut body: what must not happen
            evs.append(e)
        results[session] = evs

    threads = [threading.Thread(target=long_answer, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    try:
        started.wait()
    except threading.BrokenBarrierError:
        for t in threads:
            t.join(30)
        raise AssertionError(results) from None
    t0 = time.monotonic()
    live.proc.send_signal(signal.SIGTERM)
    code = live.proc.wait(grace + 60)  # the grace, the sessions' save, a margin: a hang fails here
    took = time.monotonic() - t0
    for t in threads:
        t.join(30)
    assert code == 0, live.log()[-3000:]
    for session, evs in results.items():
        assert not any(isinstance(e, Exception) for e in evs), (session, evs[-3:])
        errors = [e for e in evs if isinstance(e, dict) and "error" in e]
        assert len(errors) == 1 and evs[-1] is errors[0], (session, evs[-3:])  # one error event, the last
        assert errors[0]["error"]["code"] == "shutting_down"
        assert content_of(evs), session  # what was generated before is kept
    assert "CancelledError" not in live.log()
    again = start_server(**SMALL, state=state)
    _, _, usage = ask(again, "Count from 1 to 500, one number per line.", sessions[0])
    assert cached(usage) > 0, usage  # the conversation was saved: its prompt is not read again
    print(f"\nfaults/stop mid-answer: {len(sessions)} streams, each ended by one shutting_down event; "
          f"exit {took:.1f} s after SIGTERM (grace {grace} s); next turn reused {cached(usage)} tokens")


# -- 5. a guessed system prompt -------------------------------------------------------------------------
SECRET = "You are Alice's private assistant. Her project codename is BLUEHERON and her budget is 42k."


def test_a_second_key_sending_the_first_keys_private_system_prompt_gets_nothing_cached(
        start_server: Callable[..., Live], tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    names = ["alice", "mallory", "carol", "dave"]
    tokens = {n: f"key-{n}-" + secrets.token_hex(16) for n in names}
    keys.write_text("".join(f"{tokens[n]} {n}\n" for n in names))
    live = start_server(**SMALL, api_keys_file=keys)  # the defaults otherwise: common prompts on

    def as_key(name: str, question: str) -> dict[str, Any]:
        r = live.client.post(CHAT, headers={"Authorization": f"Bearer {tokens[name]}"}, timeout=HANG_S,
                             json={"messages": [{"role": "system", "content": SECRET},
                                                {"role": "user", "content": question}],
                                   "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
        return dict(r.json()["usage"])

    as_key("alice", "What is my codename?")
    guess = as_key("mallory", "What is my codename?")
    assert cached(guess) == 0, guess  # the one-request oracle is closed
    # What an office keeps: once a third identity sends the same system prompt it is public,
    # and everyone after copies it whole.
    third = as_key("carol", "Say hi.")
    fourth = as_key("dave", "Say bye.")
    assert cached(fourth) > 0 and cached(fourth) == cached(third) < fourth["prompt_tokens"]
    print(f"\nfaults/guessed system prompt: second key cached {cached(guess)}; from the third key on "
          f"{cached(fourth)} of {fourth['prompt_tokens']} prompt tokens copied")


# -- 6. unread answers and header bounds -----------------------------------------------------------
def test_oversized_headers_are_refused_however_they_arrive(start_server: Callable[..., Live]) -> None:
    live = start_server(**SMALL)
    head = (f"POST {CHAT} HTTP/1.1\r\nhost: 127.0.0.1\r\nx-large: {'a' * 65536}\r\n"
            "content-length: 2\r\n\r\n{}").encode()
    statuses = []
    for piece in (len(head), 4096):
        with socket.create_connection(("127.0.0.1", live.port)) as s:
            try:
                for i in range(0, len(head), piece):
                    s.sendall(head[i:i + piece])
            except OSError:
                pass  # closed once the bound was passed
            s.settimeout(30)
            statuses.append(int(s.recv(4096).split()[1]))
    assert statuses == [431, 431]
    assert ask(live, "Name a colour.")[0] == 200


def test_an_answer_its_client_stops_reading_is_cut_and_its_slot_freed(start_server: Callable[..., Live]) -> None:
    live = start_server(slots=4, ctx_per_slot=2048, kv_tokens=8192, response_stall_s=2)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that takes nothing
    s.connect(("127.0.0.1", live.port))
    # Four choices with 20 alternatives a token: ~5 KiB a step, ~9 MiB in all, more than the
    # kernel lets a loopback socket buffer (tcp_wmem's 4 MiB) plus the transport's 64 KiB.
    body = (b'{"messages":[{"role":"user","content":"Count to 1000."}],"max_tokens":1800,"stream":true,"n":4,'
            b'"ignore_eos":true,"logprobs":true,"top_logprobs":20,"temperature":0}')
    s.sendall(f"POST {CHAT} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
              f"content-length: {len(body)}\r\n\r\n".encode() + body)
    try:
        wait_until(lambda: live.health()["slots"]["busy"] == 4, 60, "the answer to start")
        # The buffers fill, the server can write no more, and 2 s later it cuts the
        # connection: the slots are free long before 4 x 1,800 tokens.
        h = live.wait_health(lambda h: h["slots"]["busy"] == 0, HANG_S, "the unread answer to be cut")
    finally:
        s.close()
    assert h["engine"]["finished"].get("length", 0) == 0, h  # cut, not finished
    assert ask(live, "Name a colour.")[0] == 200
