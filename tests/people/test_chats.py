from __future__ import annotations

import secrets

import pytest
from helpers.fakes import FakeClock

from appliance.people.accounts import AccountError, Accounts
from appliance.people.chats import MAX_CHAT_CHARS, Chats, Message


def two(accounts: Accounts) -> tuple[str, str]:
    return accounts.add("Ann")[0].id, accounts.add("Ben")[0].id


def make(chats: Chats, pid: str, title: str, messages: list[Message]) -> dict[str, object]:
    return chats.put(pid, secrets.token_urlsafe(16), title, messages)


def msgs(*texts: str) -> list[Message]:
    return [Message("user" if i % 2 == 0 else "assistant", t, {}) for i, t in enumerate(texts)]


def test_a_chat_is_its_owners_only(accounts: Accounts, chats: Chats) -> None:
    ann, ben = two(accounts)
    chat = make(chats, ann, "Budget", msgs("How much for paper?", "About 40 euros."))
    got = chats.get(ann, chat["id"])
    assert got is not None and [m["content"] for m in got["messages"]] == ["How much for paper?", "About 40 euros."]
    assert got["owner"] == "Ann"
    assert chats.get(ben, chat["id"]) is None and chats.listed(ben) == []
    assert not chats.delete(ben, chat["id"]) and not chats.rename(ben, chat["id"], "mine")
    assert chats.share(ben, chat["id"]) is None
    # The same id is Ben's own chat: ids are per person, so his never touches hers.
    chats.put(ben, chat["id"], "mine", msgs("overwrite"))
    assert chats.get(ann, chat["id"])["title"] == "Budget"  # type: ignore[index]
    assert chats.get(ben, chat["id"])["title"] == "mine"  # type: ignore[index]
    assert chats.delete(ben, chat["id"]) and chats.get(ann, chat["id"]) is not None


def test_put_replaces_and_list_is_newest_first_and_searches(accounts: Accounts, chats: Chats, clock: FakeClock) -> None:
    ann, _ = two(accounts)
    first = make(chats, ann, "Paper", msgs("paper order"))
    clock.advance(10)
    second = make(chats, ann, "Holidays", msgs("when is the 100% office closed_day?"))
    assert [c["id"] for c in chats.listed(ann)] == [second["id"], first["id"]]
    clock.advance(10)
    chats.put(ann, first["id"], "Paper", msgs("paper order", "Done: 5 boxes."))  # type: ignore[arg-type]
    assert [c["id"] for c in chats.listed(ann)] == [first["id"], second["id"]]
    assert [c["id"] for c in chats.listed(ann, "5 BOXES")] == [first["id"]]  # text, without case
    assert [c["id"] for c in chats.listed(ann, "holi")] == [second["id"]]  # title
    assert [c["id"] for c in chats.listed(ann, "100%")] == [second["id"]]  # % and _ are literal
    assert chats.listed(ann, "o_d") == [] and chats.listed(ann, "%o") == []  # as wildcards they would match


def test_bounds(accounts: Accounts, chats: Chats) -> None:
    ann, _ = two(accounts)
    with pytest.raises(AccountError, match="characters"):
        make(chats, ann, "big", msgs("x" * (MAX_CHAT_CHARS + 1)))
    with pytest.raises(AccountError, match="role"):
        Message.parse({"role": "tool", "content": "x"})
    with pytest.raises(AccountError, match="role"):
        Message.parse({"role": "user", "content": 3})
    assert Message.parse({"role": "user", "content": "hi", "extra": 1}).content == "hi"
    assert make(chats, ann, "  a\nlong   title ", [])["title"] == "a long title"
    assert make(chats, ann, "", [])["title"] == "New chat"


def test_a_share_link_reads_one_chat_until_revoked(accounts: Accounts, chats: Chats) -> None:
    ann, _ = two(accounts)
    chat = make(chats, ann, "Minutes", msgs("summarise"))
    token = chats.share(ann, chat["id"])
    assert token is not None
    shared = chats.shared(token)
    assert shared is not None and shared["id"] == chat["id"] and shared["owner"] == "Ann"
    again = chats.share(ann, chat["id"])
    assert again is not None and chats.shared(token) is None  # a new link replaces the old
    assert chats.unshare(ann, chat["id"]) and chats.shared(again) is None


def test_a_removed_or_disabled_persons_chats_go_with_them(accounts: Accounts, chats: Chats) -> None:
    ann, ben = two(accounts)
    a = make(chats, ann, "a", msgs("x"))
    token = chats.share(ann, a["id"])
    assert token is not None
    accounts.update(ann, disabled=True)
    assert chats.shared(token) is None
    accounts.update(ann, disabled=False)
    accounts.remove(ann)
    assert chats.get(ann, a["id"]) is None and chats.counts()["chats"] == 0
    make(chats, ben, "b", [])
    assert chats.delete_all(ben) == 1


def test_retention_forgets_old_chats(accounts: Accounts, chats: Chats, clock: FakeClock) -> None:
    ann, _ = two(accounts)
    old = make(chats, ann, "old", [])
    clock.advance(40 * 86400)
    new = make(chats, ann, "new", [])
    assert chats.prune(0) == 0
    assert chats.prune(30) == 1
    assert [c["id"] for c in chats.listed(ann)] == [new["id"]] and chats.get(ann, old["id"]) is None
