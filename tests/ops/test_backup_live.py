"""A backup made while the box serves, restored whole: `appliance backup` runs while a person's
page keeps saving chats and a document is being indexed; the backup is restored into a new
state directory and a server started on it has every account, chat, share, key, document and
usage row, and the library answers from the documents (the one indexing included)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.live import ROOT, Live
from helpers.office_state import check, session, sign_in, usage_rows
from helpers.office_state import fill as fill_box
from helpers.polling import wait_until

pytestmark = pytest.mark.integration
NOTE = ("minutes.txt", "Board minutes", "The board approved the new bicycle shed behind the east wing.")


class Saver(threading.Thread):
    """A page saving a chat after every turn, in a loop: `saved` is every chat it was told was saved."""

    def __init__(self, box: Live, who: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.box, self.who, self.saved, self.stop = box, who, [], threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            messages = [{"role": "user", "content": f"turn {i}"} for i in range(1, n % 7 + 2)]
            cid = f"loop-chat-{n:08d}"
            r = self.box.client.put(f"/v1/chats/{cid}", headers=self.who, json={"title": cid, "messages": messages})
            assert r.status_code == 200, r.text
            self.saved.append((cid, messages))


def appliance(*args: str | Path) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "appliance", *map(str, args)], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_a_backup_made_while_serving_restores_everything(start_server: Callable[..., Live], tmp_path: Path) -> None:
    state = tmp_path / "state"
    box = start_server(auth="people", state=state)
    made = fill_box(box)
    ann = session(sign_in(box, "Ann", made["password"]))
    wait_until(lambda: {who for _, who in usage_rows(state / "usage.sqlite3")} >= set(made["usage"]), 30,
               "the usage rows to be written")
    saver = Saver(box, ann)
    saver.start()
    wait_until(lambda: len(saver.saved) >= 5, 60, "chats being saved")
    r = box.client.post("/v1/library", params={"title": NOTE[1]}, content=NOTE[2].encode(),
                        headers={"content-type": "text/plain", "x-file-name": NOTE[0], **ann})
    assert r.status_code == 202, r.text
    note = r.json()["id"]
    before = list(saver.saved)  # saved before the backup began: each must be in it
    out = appliance("backup", "--state-dir", state, "--to", tmp_path / "backups").stdout
    saver.stop.set()
    saver.join()
    assert len(saver.saved) > len(before), "chats were being saved while the backup ran"
    assert box.stop() == 0
    backup = Path(out.splitlines()[0].split(": ", 1)[1])

    restored = tmp_path / "restored"
    appliance("restore", backup, "--state-dir", restored)
    box = start_server(auth="people", state=restored)
    check(box, made)
    ann = session(sign_in(box, "Ann", made["password"]))
    for cid, messages in before:
        chat = box.client.get(f"/v1/chats/{cid}", headers=ann).json()
        assert [{"role": m["role"], "content": m["content"]} for m in chat["messages"]] == messages, cid
    # The document indexing at backup time is indexed on the restored box, and answers.
    wait_until(lambda: box.client.get(f"/v1/library/{note}", headers=ann).json()["status"] == "ready", 300,
               "the restored document to be indexed")
    r = box.client.post("/v1/chat/completions", headers=ann, json={
        "messages": [{"role": "user", "content": "What did the board approve behind the east wing?"}],
        "max_tokens": 8, "temperature": 0, "library": True})
    assert r.status_code == 200 and NOTE[1] in [s["title"] for s in r.json()["sources"]], r.text
    assert box.stop() == 0
    assert usage_rows(restored / "usage.sqlite3").keys() >= usage_rows(backup / "state" / "usage.sqlite3").keys()
    assert {who for _, who in usage_rows(restored / "usage.sqlite3")} >= set(made["usage"])
