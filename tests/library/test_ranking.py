"""How the library ranks what it finds: reciprocal rank fusion that keeps a list's first place
above the middle of both lists, and a Chinese question searched by its characters one by one
beside its character pairs (a word written another way shares a character, not a pair)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from helpers.embedding import FakeEmbedder, wait_ready

from appliance.documents.reader import DocumentReader
from appliance.library.library import Library, fuse
from appliance.library.passages import characters, terms
from appliance.library.store import OFFICE, LibraryStore

PAY = "薪酬于每月15日发放。"  # the question's 薪水 and 发 are here as 薪酬 and 发放: no pair in common
CLOCK = "什么时候开会，请看日历。"  # shares the question's pairs 什么, 时候, none of its subject
PARKING = "停车场在地下二层。"


def test_fusion_keeps_what_a_list_is_surest_of_above_the_middle_of_both() -> None:
    # Words (weight 1) and meaning (weight 2) of 20 candidates each: 99 is meaning's first and
    # not among the words; 7 is eighth in both. The list's first place outranks the middle of
    # both (at RRF_K 60 it did not: 2/61 against 3/68)...
    words = [*range(100, 107), 7, *range(107, 119)]
    meaning = [99, *range(200, 206), 7, *range(206, 218)]
    ranked = fuse([words, meaning], [1.0, 2.0])
    assert ranked.index(99) < ranked.index(7)
    # ...and agreeing near the top still counts: second in both beats first in one alone.
    assert fuse([[1, 2], [3, 2]], [1.0, 2.0])[0] == 2


def test_a_questions_characters_are_its_cjk_ones_each_once() -> None:
    assert characters("A4纸多少钱？一箱纸") == ["纸", "多", "少", "钱", "一", "箱"]
    assert characters("How much is A4 paper?") == []
    assert characters("会议纪要", 2) == ["会", "议"]


def make(state: Path) -> Library:
    fake = FakeEmbedder()
    lib = Library(LibraryStore(state), DocumentReader(), fake.embed, fake.embed_sync, clock=lambda: 1000.0)
    lib.start()
    for n, text in enumerate([PAY, CLOCK, PARKING]):
        wait_ready(lib, asyncio.run(lib.add(OFFICE, "op", f"d{n}.txt", "text/plain", text.encode())).id)
    return lib


def texts(lib: Library, ids: list[int]) -> list[str]:
    found = lib.store.found(ids, [OFFICE])
    return [found[i].text for i in ids]


def test_a_chinese_word_written_another_way_is_found_by_its_characters(tmp_path: Path) -> None:
    lib = make(tmp_path)
    try:
        question = "薪水什么时候发？"
        # By pairs alone the pay passage is not found at all; the clock one shares two pairs.
        assert texts(lib, lib.store.keyword(OFFICE, terms(question), 20)) == [CLOCK]
        # Its characters find both (not the parking one, which has none of them)...
        assert sorted(texts(lib, lib.store.characters(OFFICE, characters(question), 20))) == sorted([PAY, CLOCK])
        # ...a character only where a pair starts with it: 放 ends PAY's run 日发放, 酬 does not.
        assert lib.store.characters(OFFICE, ["放"], 20) == []
        assert texts(lib, lib.store.characters(OFFICE, ["酬"], 20)) == [PAY]
        # A search by words (the rankings fused) gives both.
        found = asyncio.run(lib.search([OFFICE], question, ways=("words",)))
        assert sorted(f.text for f in found) == sorted([PAY, CLOCK])
        # An English question has no characters: its words are searched as before.
        assert lib._written([OFFICE], "pay day") == lib._words([OFFICE], "pay day")
        # A scope that holds nothing has no table to search.
        assert lib.store.characters("person:nobody", ["薪"], 20) == []
    finally:
        lib.stop()
