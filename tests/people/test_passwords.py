from __future__ import annotations

import pytest

from appliance.people import passwords
from appliance.people.passwords import Hasher, PasswordRejected, check_new, hash_password, verify


def test_a_hash_verifies_its_password_only() -> None:
    stored = hash_password("correct horse battery")
    assert stored.startswith(f"scrypt${passwords.N}$8$1$")
    assert verify("correct horse battery", stored)
    assert not verify("correct horse batterY", stored)
    assert hash_password("correct horse battery") != stored  # salted


def test_no_stored_hash_never_verifies_and_still_does_the_work(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = passwords._derive
    monkeypatch.setattr(passwords, "_derive", lambda pw, salt, n, r, p: calls.append(n) or real(pw, salt, n, r, p))
    assert not verify("anything at all", None)
    assert not verify("anything at all", "garbage")
    assert not verify("x" * (passwords.MAX_LENGTH + 1), hash_password("a password"))
    # Every refusal hashed at the real cost: the time does not say the name is unknown.
    assert calls[0] == passwords.N and calls[1] == passwords.N and calls[-1] == passwords.N


def test_parameters_travel_with_the_hash() -> None:
    cheap = Hasher(n=2**10)
    stored = cheap.hash("a long password")
    assert verify("a long password", stored)
    assert cheap.needs_rehash(stored) is False and Hasher().needs_rehash(stored) is True


@pytest.mark.parametrize(("password", "why"), [("short", "at least"), ("x" * 2000, "at most"), ("Alice Smith", "name")])
def test_new_passwords_are_checked(password: str, why: str) -> None:
    with pytest.raises(PasswordRejected, match=why):
        check_new(password, "alice smith")
