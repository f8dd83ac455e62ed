from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from helpers.fakes import FakeClock

from appliance.people.accounts import KEY_PREFIX, AccountError, Accounts, Role
from appliance.people.db import FILE_NAME, Database, Store, StoreError
from appliance.people.passwords import Hasher
from appliance.people.schema import MIGRATIONS


def break_store(db: Store) -> None:
    """Every statement fails from here on: SQLite's file closed, PostgreSQL's server unreachable."""
    if not isinstance(db, Database):
        db.url = "postgresql://appliance@127.0.0.1:1/gone"  # type: ignore[attr-defined]
    db.close()


def signed_up(accounts: Accounts, name: str = "Ann", password: str = "ann's long password"):
    account, invite = accounts.add(name)
    session, token = accounts.accept(invite, password)
    return account, session, token


def test_an_invite_sets_a_password_once_and_signs_in(accounts: Accounts) -> None:
    account, invite = accounts.add("Ann Lee", Role.ADMIN, quota=5000)
    assert accounts.invited(invite) == account
    session, token = accounts.accept(invite, "a good long password")
    assert session.account.name == "Ann Lee" and session.account.admin and session.account.quota == 5000
    assert accounts.session(token) == session
    assert accounts.invited(invite) is None
    with pytest.raises(AccountError, match="not valid"):
        accounts.accept(invite, "another long password")
    assert accounts.sign_in("ann lee", "a good long password") is not None  # names match without case
    assert accounts.sign_in("Ann Lee", "a wrong long password") is None
    assert accounts.sign_in("Nobody", "a good long password") is None


def test_names_are_unique_and_checked(accounts: Accounts) -> None:
    accounts.add("Ann")
    with pytest.raises(AccountError, match="already"):
        accounts.add(" ANN ")
    with pytest.raises(AccountError, match="printable"):
        accounts.add("Ann\nAdmin")
    with pytest.raises(AccountError, match="printable"):
        accounts.add("")


def test_an_invite_expires_and_a_new_one_replaces_it(accounts: Accounts, clock: FakeClock) -> None:
    account, first = accounts.add("Ben")
    second = accounts.invite(account.id)
    assert accounts.invited(first) is None and accounts.invited(second) is not None
    clock.t += accounts.invite_s + 1
    assert accounts.invited(second) is None


def test_every_sign_in_is_a_new_session_and_sign_out_ends_one(accounts: Accounts, clock: FakeClock) -> None:
    _, s1, t1 = signed_up(accounts)
    found = accounts.sign_in("Ann", "ann's long password")
    assert found is not None
    s2, t2 = found
    assert t1 != t2 and s1.csrf != s2.csrf
    accounts.sign_out(s1)
    assert accounts.session(t1) is None and accounts.session(t2) is not None
    accounts.sign_out_everywhere(s2.account.id)
    assert accounts.session(t2) is None
    clock.t += 1
    assert accounts.session(t2) is None


def test_disabling_ends_sessions_and_keys_at_once(accounts: Accounts) -> None:
    account, session, token = signed_up(accounts)
    _, key = accounts.new_key(account.id, "my script")
    assert key.startswith(KEY_PREFIX) and accounts.find_key(key) == session.account
    assert accounts.session(token) is not None  # both cached now
    accounts.update(account.id, disabled=True)
    assert accounts.session(token) is None and accounts.find_key(key) is None
    assert accounts.sign_in("Ann", "ann's long password") is None
    accounts.update(account.id, disabled=False)
    assert accounts.find_key(key) is None  # a disabled person's keys are gone, not paused


def test_sessions_expire(accounts: Accounts, clock: FakeClock) -> None:
    _, _, token = signed_up(accounts)
    clock.t += accounts.session_s + 10
    assert accounts.session(token) is None


def test_keys_are_a_persons_own(accounts: Accounts) -> None:
    ann, _, _ = signed_up(accounts)
    ben, _, _ = signed_up(accounts, "Ben")
    listing, key = accounts.new_key(ann.id, "excel")
    assert [k["label"] for k in accounts.keys(ann.id)] == ["excel"] and accounts.keys(ben.id) == []
    assert key not in str(accounts.keys(ann.id))
    assert not accounts.revoke_key(ben.id, listing["id"])  # not Ben's to revoke
    assert accounts.find_key(key) is not None
    assert accounts.revoke_key(ann.id, listing["id"])
    assert accounts.find_key(key) is None
    assert accounts.find_key("ap-" + "x" * 43) is None and accounts.find_key("not a key") is None


def test_changing_the_password_ends_the_other_sessions(accounts: Accounts) -> None:
    _, session, token = signed_up(accounts)
    with pytest.raises(AccountError, match="current password"):
        accounts.change_password(session, "wrong wrong wrong", "a newer long password")
    _, new_token = accounts.change_password(session, "ann's long password", "a newer long password")
    assert accounts.session(token) is None and accounts.session(new_token) is not None
    assert accounts.sign_in("Ann", "a newer long password") is not None


def test_a_weaker_stored_hash_is_upgraded_at_sign_in(db: Store, clock: FakeClock) -> None:
    old = Accounts(db, clock=clock, monotonic=clock, hasher=Hasher(n=2**10))
    signed_up(old)
    new = Accounts(db, clock=clock, monotonic=clock, hasher=Hasher(n=2**11))
    assert new.sign_in("Ann", "ann's long password") is not None
    stored = db.read(lambda tx: tx.one("SELECT password FROM people"))
    assert stored is not None and stored[0].startswith("scrypt$2048$")


def test_the_file_is_private_and_migrated_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    Database(state).close()
    db = Database(state)
    assert db.version == len(MIGRATIONS)
    assert stat.S_IMODE(os.stat(state / FILE_NAME).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700


def test_a_corrupt_file_is_one_error(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / FILE_NAME).write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="people store"):
        Database(state)


def test_signed_in_people_keep_working_while_the_store_fails(accounts: Accounts, clock: FakeClock) -> None:
    account, _, token = signed_up(accounts)
    _, key = accounts.new_key(account.id, "tool")
    assert accounts.session(token) is not None and accounts.find_key(key) is not None
    break_store(accounts.db)
    clock.t += 60
    assert accounts.session(token) is not None and accounts.find_key(key) is not None
    assert "people store" in accounts.db.trouble
    with pytest.raises(StoreError):
        accounts.add("Cat")


def test_on_a_store_that_takes_no_writes_people_still_sign_in(tmp_path: Path, clock: FakeClock) -> None:
    """A read-only disk: reads work, writes fail. A session is then kept in memory."""
    db = Database(tmp_path / "state")
    accounts = Accounts(db, clock=clock, monotonic=clock, hasher=Hasher(n=2**10))
    account, _, _ = signed_up(accounts)
    db._conn.execute("PRAGMA query_only = ON")  # SQLite refuses every write from here on
    found = accounts.sign_in("Ann", "ann's long password")
    assert found is not None
    session, token = found
    clock.advance(60)
    assert accounts.session(token) == session and "readonly" in db.trouble
    with pytest.raises(StoreError):
        accounts.sign_out(session)
    assert accounts.session(token) is None  # signed out here at least
