"""Tests for appliance.engine.textstream: whole UTF-8 characters only; stop strings held back, then cut."""

from __future__ import annotations

import itertools
import random

import pytest

from appliance.engine.textstream import TextStream

# 1-, 2-, 3- and 4-byte characters and a ZWJ sequence
MIXED = "Hi 你好, café 😀! 👩‍💻 ok"
REPLACEMENT = "\ufffd"


def run(ts: TextStream, pieces: list[bytes]) -> list[str]:
    """Push every piece, then flush; return each piece of output."""
    return [ts.push(p) for p in pieces] + [ts.flush()]


def split_at(data: bytes, cuts: tuple[int, ...]) -> list[bytes]:
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


def random_pieces(rng: random.Random, data: bytes) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), rng.randint(0, min(8, len(data) - 1))))
    return split_at(data, tuple(cuts))


# -- UTF-8 ----------------------------------------------------------------------------------
def test_ascii_passthrough() -> None:
    ts = TextStream()
    assert ts.push(b"Hello") == "Hello"
    assert ts.push(b", world") == ", world"
    assert ts.flush() == ""
    assert ts.text == "Hello, world"
    assert not ts.stopped


def test_empty_push() -> None:
    ts = TextStream(("END",))
    assert ts.push(b"") == ""
    assert ts.push(b"a") == "a"
    assert ts.push(b"") == ""


def test_chinese_char_split_over_pushes() -> None:
    data = "你".encode()
    assert len(data) == 3
    ts = TextStream()
    assert ts.push(data[:1]) == ""
    assert ts.push(data[1:2]) == ""
    assert ts.push(data[2:]) == "你"


def test_emoji_split_over_pushes() -> None:
    data = "😀".encode()
    ts = TextStream()
    assert [ts.push(data[i:i + 1]) for i in range(4)] == ["", "", "", "😀"]


def test_every_two_way_split() -> None:
    data = MIXED.encode()
    for i in range(len(data) + 1):
        out = run(TextStream(), [data[:i], data[i:]])
        assert all(REPLACEMENT not in o for o in out), i
        assert "".join(out) == MIXED, i


def test_every_three_way_split() -> None:
    data = MIXED.encode()
    for i, j in itertools.combinations(range(len(data) + 1), 2):
        ts = TextStream()
        out = run(ts, [data[:i], data[i:j], data[j:]])
        assert all(REPLACEMENT not in o for o in out), (i, j)
        assert "".join(out) == MIXED == ts.text, (i, j)


def test_byte_at_a_time() -> None:
    data = MIXED.encode()
    ts = TextStream()
    out = [ts.push(data[i:i + 1]) for i in range(len(data))]
    assert all(REPLACEMENT not in o for o in out)
    assert "".join(out) == MIXED
    assert ts.flush() == ""


def test_every_split_with_stop_that_never_completes() -> None:
    # A stop string sharing prefixes with the text makes the stream hold text back.
    data = MIXED.encode()
    for i, j in itertools.combinations(range(len(data) + 1), 2):
        ts = TextStream(("你好吗", "😀😀", "ok!"))
        out = run(ts, [data[:i], data[i:j], data[j:]])
        assert all(REPLACEMENT not in o for o in out), (i, j)
        assert "".join(out) == MIXED == ts.text, (i, j)
        assert not ts.stopped


@pytest.mark.parametrize("data", [b"\xff", b"a\xffb", b"\xc3\x28", b"\xed\xa0\x80",
                                  b"\xf8\x88\x80\x80\x80"])
def test_invalid_utf8_replaced(data: bytes) -> None:
    ts = TextStream()
    out = ts.push(data) + ts.flush()
    assert out == data.decode("utf-8", errors="replace")
    assert REPLACEMENT in out


def test_truncated_character_at_end_replaced_on_flush() -> None:
    ts = TextStream()
    assert ts.push("a你".encode()[:-1]) == "a"
    assert ts.flush() == REPLACEMENT
    assert ts.text == "a" + REPLACEMENT


def test_truncated_character_followed_by_ascii() -> None:
    ts = TextStream()
    assert ts.push("你".encode()[:2]) == ""
    assert ts.push(b"A") == REPLACEMENT + "A"


# -- stop strings -------------------------------------------------------------------------
def test_stop_inside_one_push() -> None:
    ts = TextStream(("END",))
    assert ts.push(b"Hello END world") == "Hello "
    assert ts.stopped
    assert ts.push(b"more") == ""
    assert ts.flush() == ""
    assert ts.text == "Hello "


def test_stop_at_very_start() -> None:
    ts = TextStream(("<|im_end|>",))
    assert ts.push(b"<|im_end|>") == ""
    assert ts.stopped and ts.text == ""


def test_stop_spanning_pushes() -> None:
    ts = TextStream(("END",))
    assert ts.push(b"Hel") == "Hel"
    assert ts.push(b"lo E") == "lo "  # "E" may start the stop string: held
    assert ts.push(b"N") == ""  # "EN" still held
    assert not ts.stopped
    assert ts.push(b"D and more") == ""
    assert ts.stopped
    assert ts.text == "Hello "
    assert ts.push(b"x") == "" and ts.flush() == ""


def test_held_prefix_released_when_not_a_stop() -> None:
    ts = TextStream(("END",))
    assert ts.push(b"a E") == "a "
    assert ts.push(b"N") == ""
    assert ts.push(b"x") == "ENx"
    assert not ts.stopped
    assert ts.text == "a ENx"


def test_held_prefix_released_on_flush() -> None:
    ts = TextStream(("END",))
    assert ts.push(b"the EN") == "the "
    assert ts.flush() == "EN"
    assert ts.text == "the EN"
    assert not ts.stopped


def test_overlapping_prefix_kept_correctly() -> None:
    # "aab": after "aaa" only the last "aa" can still start the stop string.
    ts = TextStream(("aab",))
    assert ts.push(b"a") == ""
    assert ts.push(b"a") == ""
    assert ts.push(b"a") == "a"
    assert ts.push(b"b") == ""
    assert ts.stopped and ts.text == "a"


def test_multiple_stops_earliest_wins() -> None:
    ts = TextStream(("world", "lo"))
    assert ts.push(b"Hello world") == "Hel"
    assert ts.stopped


def test_multiple_stops_earliest_wins_regardless_of_order() -> None:
    for stops in (("C", "B"), ("B", "C")):
        ts = TextStream(stops)
        assert ts.push(b"aaBbbC") == "aa"


def test_multiple_stops_hold_longest_prefix() -> None:
    ts = TextStream(("xyz", "yzw"))
    assert ts.push(b"abxy") == "ab"  # "xy" could start "xyz"
    assert ts.push(b"zz") == ""
    assert ts.stopped and ts.text == "ab"


def test_empty_stop_strings_ignored() -> None:
    ts = TextStream(("", "END"))
    assert ts.push(b"abc") == "abc"
    assert not ts.stopped


def test_stop_with_multibyte_characters_split() -> None:
    data = "答案是42。\n\n用户：".encode()
    stop = "用户："
    for i, j in itertools.combinations(range(len(data) + 1), 2):
        ts = TextStream((stop,))
        out = run(ts, [data[:i], data[i:j], data[j:]])
        assert "".join(out) == "答案是42。\n\n" == ts.text, (i, j)
        assert ts.stopped
        assert all(REPLACEMENT not in o for o in out)


def test_random_chunking_matches_reference() -> None:
    # Whatever the chunking, the output is the text before the earliest stop (or all of it).
    rng = random.Random(42)
    alphabet = ["a", "b", "E", "N", "D", "你", "😀", " ", "\n"]
    stops_pool = [("END",), ("EN", "D你"), ("😀 ",), ("aab", "ba"), ("\n\n",), ()]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
        stops = rng.choice(stops_pool)
        hits = [i for i in (text.find(s) for s in stops) if i != -1]
        data = text.encode()
        ts = TextStream(stops)
        out = run(ts, random_pieces(rng, data))
        assert all(REPLACEMENT not in o for o in out), (text, stops)
        if hits:
            # The earliest stop that completes first wins; with held-back prefixes the stream
            # can only stop at or before the earliest occurrence in the full text.
            assert ts.stopped, (text, stops)
            assert text.startswith(ts.text)
            assert len(ts.text) <= min(hits)
            assert any(text[len(ts.text):].startswith(s) for s in stops)
        else:
            assert not ts.stopped
            assert ts.text == text
        assert "".join(out) == ts.text


def test_random_chunking_single_stop_exact() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        text = "".join(rng.choice("abEND你😀") for _ in range(rng.randint(1, 30)))
        ts = TextStream(("END",))
        out = run(ts, random_pieces(rng, text.encode()))
        cut = text.find("END")
        expected = text if cut == -1 else text[:cut]
        assert "".join(out) == expected == ts.text, text
        assert ts.stopped == (cut != -1)
