"""API keys: the file format, constant-time lookup, reload keeping the old keys on errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.http.keys import KeyRing, KeysFileError, bearer, parse_keys

K1, K2, K3 = "k1-" + "a" * 29, "k2-" + "b" * 29, "k3-" + "c" * 29


def test_parse_keys_labels_comments_blank_lines() -> None:
    keys = parse_keys(f"# office keys\n\n{K1} alice\n{K2}   admin  # the operator\n{K3}\n")
    assert [k.label for k in keys] == ["alice", "admin", ""]
    assert [k.admin for k in keys] == [False, True, False]
    assert len({k.identity for k in keys}) == 3
    assert all(K1 not in k.identity for k in keys)


@pytest.mark.parametrize("text, why", [
    ("short-key\n", "16-256"),
    (f"{K1} a b\n", "KEY [LABEL]"),
    (f"{K1}\n{K1} again\n", "twice"),
    (f"{K1} bad/label\n", "label"),
    ("# nothing\n", "no keys"),
    ("k\u00e9y-with-accent-123456\n", "16-256"),
])
def test_bad_files_are_refused_without_showing_keys(text: str, why: str) -> None:
    with pytest.raises(KeysFileError) as e:
        parse_keys(text, "keys")
    assert why in str(e.value)
    for token in text.split():
        if len(token) >= 16:
            assert token not in str(e.value)


def test_find_matches_only_whole_keys(tmp_path: Path) -> None:
    ring = KeyRing(str(_write(tmp_path, f"{K1} alice\n{K2} admin\n")))
    k1, k2 = ring.find(K1), ring.find(K2)
    assert k1 is not None and k1.label == "alice" and k2 is not None and k2.admin
    assert ring.find(K1[:-1]) is None and ring.find(K1 + "x") is None and ring.find("") is None


def test_reload_picks_up_new_keys_and_keeps_old_ones_on_a_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"{K1}\n")
    ring = KeyRing(str(path))
    assert ring.enabled and ring.find(K1) and not ring.find(K2)
    path.write_text(f"{K2} admin\n")
    assert ring.reload()
    assert ring.find(K2) and not ring.find(K1)
    path.write_text("too-short\n")
    assert not ring.reload()
    assert ring.find(K2)  # the old keys stay in force
    path.unlink()
    assert not ring.reload() and ring.find(K2)


def test_a_bad_file_at_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KeysFileError, match="no keys"):
        KeyRing(str(_write(tmp_path, "")))
    with pytest.raises(KeysFileError):
        KeyRing(str(tmp_path / "missing"))


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "k"
    p.write_text(text)
    return p


def test_keys_off() -> None:
    ring = KeyRing()
    assert not ring.enabled and not ring.reload() and ring.find(K1) is None


@pytest.mark.parametrize("header, token", [
    (f"Bearer {K1}", K1), (f"bearer   {K1} ", K1), (f"Basic {K1}", None), ("Bearer", None), (None, None), ("", None),
])
def test_bearer(header: str | None, token: str | None) -> None:
    assert bearer(header) == token


def test_a_third_field_is_the_keys_daily_quota() -> None:
    keys = parse_keys(f"{K1} alice 20000\n{K2} bob 0\n{K3} carol\n")
    assert [k.quota for k in keys] == [20000, 0, None]  # None: the configured default
    for bad in (f"{K1} alice many\n", f"{K1} alice -5\n", f"{K1} alice 1 2\n", f"{K1} alice 1 later\n",
                f"{K1} alice 1 background x\n"):
        with pytest.raises(KeysFileError) as e:
            parse_keys(bad, "keys")
        assert "KEY LABEL QUOTA" in str(e.value) and K1 not in str(e.value)


def test_a_fourth_field_puts_every_request_of_the_key_in_the_background_lane() -> None:
    keys = parse_keys(f"{K1} nightly 0 background\n{K2} bob 10 people\n{K3} carol\n")
    assert [k.background for k in keys] == [True, False, False] and keys[0].quota == 0
