"""A question's words put into the library's other language by the dictionary (lexicon.py,
issue 49): each word's usual renderings and, apart, the names; the real CC-CEDICT read from
the pinned package; and the search that finds an other-language passage by them, with no
translation from the chat model."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.library import indexed, open_library

from appliance.library.language import Lang
from appliance.library.lexicon import LEXICON, NO_GLOSS, Lexicon
from appliance.library.library import Library, LibraryLimits
from appliance.library.store import OFFICE, DocRow

# Entries as CC-CEDICT writes them: traditional, simplified, pinyin, senses.
ENTRIES = [
    "補貼 补贴 [bu3 tie1] /to subsidize/subsidy/allowance/to supplement (one's salary etc)/benefit/",
    "津貼 津贴 [jin1 tie1] /allowance/",
    "西藏 西藏 [Xi1 zang4] /Tibet/Xizang or Tibet Autonomous Region 西藏自治區|西藏自治区[Xi1 zang4 Zi4 zhi4 qu1]/",
    "倫敦 伦敦 [Lun2 dun1] /London, capital of United Kingdom/",
    "酒店 酒店 [jiu3 dian4] /wine shop/pub (public house)/hotel/restaurant/CL:家[jia1]/",
    "出差 出差 [chu1 chai1] /to go on an official or business trip/",
    "出 出 [chu1] /to go out/to come out/",
    "年費 年费 [nian2 fei4] /annual fee/",
    "陪審團 陪审团 [pei2 shen3 tuan2] /jury/",
    "辭職 辞职 [ci2 zhi2] /to resign/",
    "食堂 食堂 [shi2 tang2] /dining hall; cafeteria/CL:個|个[ge4]/",
    "禮物 礼物 [li3 wu4] /gift/present/CL:件[jian4],個|个[ge4],份[fen4]/",
    "呈交 呈交 [cheng2 jiao1] /to present/to submit/",
    "去年 去年 [qu4 nian2] /last year/",
    "的 的 [de5] /of/~'s (possessive particle)/",
    "# a comment line, and a malformed one:",
    "nonsense",
]


def lexicon() -> Lexicon:
    return Lexicon(ENTRIES)


def test_an_english_question_becomes_each_words_usual_chinese_words_and_its_names_apart() -> None:
    got = lexicon().gloss("What allowance does Qinghe pay for a trip to Tibet?", Lang.ZH)
    # "allowance" is 津贴's first sense and 补贴's third: the first sense's word comes first.
    assert got.words.split()[:3] == ["津贴", "补贴", "西藏"]
    assert got.names == "西藏"  # capitalised in the question and a name in the dictionary
    # A pair the dictionary has as a sense is read as one: "annual fee".
    assert lexicon().gloss("Is there an annual fee?", Lang.ZH).words == "年费"
    # A plural is read as its singular when only that is known.
    assert "津贴" in lexicon().gloss("Which allowances are paid?", Lang.ZH).words.split()


def test_a_chinese_question_is_cut_into_the_longest_known_words() -> None:
    got = lexicon().gloss("在伦敦出差住酒店的补贴", Lang.EN)
    words = got.words.split()
    assert {"london", "hotel", "business", "trip", "subsidy", "allowance"} <= set(words)
    assert "of" not in words and "out" not in words  # single characters (的, 出) are not glossed
    assert got.names == "london"  # the name's first sense, up to its comma


def test_a_question_already_in_the_language_or_of_no_known_word_glosses_to_nothing() -> None:
    assert lexicon().gloss("补贴是多少？", Lang.ZH) == NO_GLOSS
    assert lexicon().gloss("How are you today?", Lang.ZH) == NO_GLOSS


def test_an_unreadable_dictionary_leaves_the_translation_to_cross_alone(caplog: pytest.LogCaptureFixture) -> None:
    def unreadable() -> Iterator[str]:
        raise OSError("the file is gone")
        yield ""  # a generator: it fails when read, as a missing file does
    lex = Lexicon(unreadable())
    assert lex.gloss("What allowance is paid?", Lang.ZH) == NO_GLOSS
    assert "could not be read (the file is gone)" in caplog.text
    assert Lexicon([]).gloss("What allowance is paid?", Lang.ZH) == NO_GLOSS  # nothing known, nothing raised


def test_the_dictionary_is_read_in_one_thread_however_many_uploads_ask() -> None:
    gate, reading = threading.Event(), threading.Event()

    def slow() -> Iterator[str]:  # read as the real file is, held until the test lets it go
        reading.set()
        gate.wait(30)
        yield from ENTRIES

    lex = Lexicon(slow())
    assert lex.warm() is True
    reading.wait(30)
    assert [lex.warm() for _ in range(5)] == [False] * 5  # being read: no second thread
    gate.set()
    assert lex.gloss("What allowance is paid?", Lang.ZH).words  # read once, whole
    assert lex.ready and lex.warm() is False


def test_a_thing_is_a_word_given_as_a_sense_of_its_own_and_never_as_a_doing() -> None:
    lex = lexicon()
    # jury is only ever a thing; present is also "to present"; pounds are an amount's unit,
    # how far a question's frame, days a time.
    assert lex.things("How many days of leave for jury service, or for a present, how far, in pounds?") == ["jury"]
    assert lex.things("辞职前要在食堂退还去年的礼物吗？") == ["食堂", "礼物"]  # 辞职 is "to resign", 去年 a time


def test_a_things_kin_are_its_renderings_and_through_them_its_synonyms() -> None:
    lex = lexicon()
    assert lex.kin("jury") == ["陪审团"]
    assert lex.kin("present") == ["呈交", "礼物", "submit", "gift"]  # renderings first, then what they also mean
    assert lex.kin("食堂") == ["dining hall", "cafeteria"]  # a phrase is found when all its words are
    assert lex.kin("伦敦") == ["london", "london capital united kingdom"]  # a name's first sense up to its comma


def test_the_real_dictionary_gives_the_words_office_papers_use() -> None:
    got = LEXICON.gloss("What daily travel allowance is paid for a trip to Tibet or Xinjiang?", Lang.ZH)
    assert {"补贴", "补助", "津贴"} <= set(got.words.split())
    assert got.names.split() == ["西藏", "新疆"]
    english = LEXICON.gloss("开自己的车出差，一个纳税年度里超过一万英里以后，每英里补贴多少？", Lang.EN).words.split()
    assert {"mile", "allowance", "exceed", "business", "trip"} <= set(english)


def add(lib: Library, text: str) -> DocRow:
    row = asyncio.run(lib.add(OFFICE, "op", "d.txt", "text/plain", text.encode()))
    indexed(lib, row.id)
    got = lib.store.doc(row.id)
    assert got is not None
    return got


def test_an_english_question_finds_the_chinese_passage_by_the_dictionary_without_a_translation(
        tmp_path: Path) -> None:
    lib = open_library(tmp_path)
    lib.start()
    travel = add(lib, "Business travel: book trains through the travel desk and keep every receipt.")
    add(lib, "出差补助：每天一百二十元，包含餐费。")
    tibet = add(lib, "赴西藏、新疆出差的，每天补助提高至一百八十元。")
    question = "What is the daily allowance for a business trip to Tibet?"
    words = ("words",)  # the tests' embedding model ranks every passage by meaning
    alone = asyncio.run(lib.search([OFFICE], question, ways=words, gloss=False))
    assert [f.doc for f in alone] == [travel.id]  # English words match English passages only
    found = asyncio.run(lib.search([OFFICE], question, ways=words))  # no translation came: the dictionary alone
    assert found[0].doc == tibet.id  # the name, 西藏, tells the two allowances apart
    lib.stop()
    off = open_library(tmp_path / "off", LibraryLimits(translate=False))
    off.start()
    add(off, "赴西藏、新疆出差的，每天补助提高至一百八十元。")
    assert asyncio.run(off.search([OFFICE], question, ways=words)) == []  # crossing turned off: no dictionary either
    off.stop()


def test_a_thing_no_document_mentions_in_either_language_or_by_a_synonym_is_unmentioned(tmp_path: Path) -> None:
    lib = open_library(tmp_path)
    lib.start()
    add(lib, "Annual leave: full-time staff receive 27 days a year. Gifts from a customer above £50 are recorded.")
    add(lib, "员工食堂位于三楼，午餐每份十五元。")
    ask = lambda question: asyncio.run(lib.unmentioned([OFFICE], question))  # noqa: E731
    assert ask("How many days of leave do I get for jury service?") == ["jury"]
    assert ask("Above what value must I record a present from a client?") == []  # client: customer
    assert ask("How much is lunch in the cafeteria?") == []  # the Chinese page's 食堂
    assert ask("健身房几点开门？") == ["健身房"]
    assert ask("How many days of leave do I get?") == []
    assert ask("What percentage of the lunch is it?") == []  # a page writes 6%, not "percentage"
    lib.stop()
    off = open_library(tmp_path / "off", LibraryLimits(translate=False))
    off.start()
    assert asyncio.run(off.unmentioned([OFFICE], "How many days of leave for jury service?")) == []  # dictionary off
    off.stop()


def test_a_phrase_is_mentioned_only_by_a_passage_holding_all_its_words_however_many_hold_each(
        tmp_path: Path) -> None:
    # 60 short passages say "dining" again and again, 60 "hall": each word's best passages by
    # bm25. The one passage holding both is long and says each once, so it ranks below all of
    # them for either word alone; it is still found (one FTS5 AND query, not the intersection
    # of each word's first passages).
    lib = open_library(tmp_path)
    lib.start()
    filler = " ".join(f"filler{i}" for i in range(150))
    pages = [f"Dining dining dining {i}." for i in range(60)] + [f"Hall hall hall {i}." for i in range(60)]
    add(lib, "\f".join(pages))
    assert not lib._mentions([OFFICE], "dining hall")
    assert lib._mentions([OFFICE], "dining") and lib._mentions([OFFICE], "hall")
    add(lib, f"{filler} The dining hall is on the third floor. {filler}")
    assert lib._mentions([OFFICE], "dining hall")
    assert not lib._mentions([OFFICE], "dining room") and not lib._mentions(["someone-else"], "dining hall")
    lib.stop()
