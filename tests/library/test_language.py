"""A question in the other language than the library's documents (issue 49): a text's language
by its CJK share, each document's read once and kept in memory, the decision to search in the
other language too (only when the scopes hold documents in it, and not when it is turned
off), and the translated question's rankings fused with the question's own, the translated
first when the question names what only the other language's documents hold."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path

from helpers.library import indexed, open_library

from appliance.library.language import Lang, Languages, crossing, language, leads, names, written_as_name
from appliance.library.library import Library, LibraryLimits, interleave
from appliance.library.store import OFFICE, DocRow, person_scope

PARKING = "Parking permits are issued by reception on the ground floor for a yearly fee of twenty pounds."
LUNCH = "午餐补贴：每个工作日二十八元，随工资发放。"
QUESTION_ZH = "停车证在哪里办？"


def make(state: Path, limits: LibraryLimits | None = None, gate: threading.Event | None = None) -> Library:
    lib = open_library(state, limits, gate)
    lib.start()
    return lib


def add(lib: Library, text: str, scope: str = OFFICE) -> DocRow:
    row = asyncio.run(lib.add(scope, "op", "d.txt", "text/plain", text.encode()))
    indexed(lib, row.id)
    got = lib.store.doc(row.id)
    assert got is not None
    return got


def test_a_text_is_chinese_by_its_share_of_cjk_letters() -> None:
    assert language("AED 在哪里？") is Lang.ZH
    assert language("请问 Microsoft Teams 会议怎么预约") is Lang.ZH
    assert language("Ask 张伟 for the keys to the store room.") is Lang.EN
    assert language("How many days of holiday do I get?") is Lang.EN
    assert language("2026 -- 15:00 ?") is None  # nothing to tell by: not translated
    assert Lang.EN.other is Lang.ZH and Lang.ZH.other is Lang.EN


def test_the_question_is_searched_in_the_other_language_only_where_documents_are_in_it(tmp_path: Path) -> None:
    lib = make(tmp_path)
    add(lib, PARKING)
    # English documents only: a Chinese question crosses, an English one does not.
    assert asyncio.run(lib.crossing([OFFICE], QUESTION_ZH)) is Lang.EN
    assert asyncio.run(lib.crossing([OFFICE], "Where do I get a parking permit?")) is None
    # A Chinese document in a scope the caller does not read does not count...
    mine = person_scope("p1")
    add(lib, LUNCH, mine)
    assert asyncio.run(lib.crossing([OFFICE], "How much is the lunch allowance?")) is None
    # ...in one they read, it does.
    assert asyncio.run(lib.crossing([OFFICE, mine], "How much is the lunch allowance?")) is Lang.ZH
    assert asyncio.run(lib.crossing([OFFICE], "2026?")) is None
    lib.stop()


def test_translating_turned_off_never_crosses(tmp_path: Path) -> None:
    lib = make(tmp_path, LibraryLimits(translate=False))
    add(lib, PARKING)
    assert asyncio.run(lib.crossing([OFFICE], QUESTION_ZH)) is None
    lib.stop()


def test_a_documents_language_is_read_once_and_again_when_it_is_replaced() -> None:
    read: list[str] = []

    def sample(row: DocRow) -> list[str]:
        read.append(row.id)
        return [LUNCH if row.chars == 20 else PARKING]

    langs = Languages(sample)
    row = DocRow("lib_1", OFFICE, "t", "d.txt", "text", 10, None, 90, False, 1, 1, "ready", None, 1.0, "op")
    assert langs.of(row) is Lang.EN and langs.of(row) is Lang.EN
    assert read == ["lib_1"]
    replaced = dataclasses.replace(row, chars=20)  # the same id, another file
    assert langs.of(replaced) is Lang.ZH and read == ["lib_1", "lib_1"]
    # Asked whether any is English, it reads no further than the first that is.
    other = dataclasses.replace(row, id="lib_2")
    assert langs.holds([row, other], Lang.EN) and read == ["lib_1", "lib_1"]
    assert crossing("停车证？", lambda lang: langs.holds([replaced], lang)) is None
    assert crossing("停车证？", lambda lang: langs.holds([replaced, row], lang)) is Lang.EN


def test_a_document_still_being_indexed_is_read_from_its_passages(tmp_path: Path) -> None:
    gate = threading.Event()  # its embeddings wait: nothing of it in memory yet
    lib = make(tmp_path, gate=gate)
    row = asyncio.run(lib.add(OFFICE, "op", "d.txt", "text/plain", PARKING.encode()))
    assert lib.vectors.first(row.id, 8) == []
    assert asyncio.run(lib.crossing([OFFICE], QUESTION_ZH)) is Lang.EN
    gate.set()
    indexed(lib, row.id)
    lib.stop()


def test_the_translated_question_finds_what_the_question_alone_cannot(tmp_path: Path) -> None:
    lib = make(tmp_path)
    add(lib, "The canteen opens at noon and closes at two; lunch is served hot.")
    add(lib, LUNCH)
    parking = add(lib, PARKING)  # last: first only by its words
    # Chinese pairs match no English word, and the embedding model cannot read Chinese (the
    # dictionary's words are tests/library/test_lexicon.py's: here they are left out).
    assert asyncio.run(lib.search([OFFICE], QUESTION_ZH, gloss=False)) == []
    english = "Where do I get a parking permit?"
    words = ("words",)
    found = asyncio.run(lib.search([OFFICE], QUESTION_ZH, ways=words, also=english, gloss=False))
    assert [f.doc for f in found] == [parking.id]
    assert asyncio.run(lib.search([OFFICE], QUESTION_ZH, also=english, gloss=False))[0].doc == parking.id
    # A blank translation (it failed) searches the question alone.
    assert asyncio.run(lib.search([OFFICE], QUESTION_ZH, also=" ", gloss=False)) == []
    lib.stop()


def test_the_translated_search_takes_every_other_place() -> None:
    assert interleave([1, 2, 3], [7, 8], 2) == [1, 7, 2, 8, 3]
    assert interleave([1, 2, 3, 4], [7, 8], 3) == [1, 2, 7, 3, 4, 8]
    assert interleave([1, 2], [2, 9, 8], 2) == [1, 2, 9, 8]  # each once; what is left of either comes last
    assert interleave([], [7, 8], 2) == [7, 8] and interleave([1], [], 2) == [1]


def test_the_translated_search_can_neither_push_out_nor_be_pushed_out(tmp_path: Path) -> None:
    lib = make(tmp_path, LibraryLimits(translated_every=2))
    english = add(lib, PARKING)
    chinese = add(lib, "停车证由前台办理，每年二十英镑。")
    found = asyncio.run(lib.search([OFFICE], QUESTION_ZH, also="parking permits"))
    assert [f.doc for f in found][:2] == [chinese.id, english.id]  # the question's own best, then the other's
    lib.stop()


def test_a_name_is_a_capitalised_word_within_an_english_sentence_or_any_latin_word_in_chinese() -> None:
    assert names("What does Qinghe pay for a trip to Tibet? Where is the AED, I ask.") == ["qinghe", "tibet", "aed"]
    assert names("How much is it? London hotels are dear.") == []  # a sentence's first word
    assert names("报销超过多少英镑需要 Owen Blake 签批？") == ["owen", "blake"]
    assert names("停车证在哪里办？") == [] and names("how much is it") == []


def test_the_translation_leads_for_a_name_its_own_languages_documents_lack() -> None:
    where: dict[str, dict[Lang, bool]] = {
        "london": {Lang.EN: True}, "qinghe": {}, "teams": {Lang.EN: True, Lang.ZH: True},
        "owen": {Lang.EN: True}, "blake": {Lang.EN: True}, "spring": {Lang.EN: False}, "team": {Lang.EN: False}}
    held = where.__getitem__
    assert leads("How much is Qinghe's meal allowance?", "青禾的餐费补贴是多少？", held)  # in no English document
    assert leads("在伦敦住酒店每晚多少？", "How much is a hotel in London a night?", held)  # only English ones
    assert leads("Owen Blake 签批的上限？", "Up to what does Owen Blake sign?", held)
    assert not leads("请问 Teams 会议怎么预约？", "How do I book a Teams meeting?", held)  # both hold it
    assert not leads("停车证在哪里办？", "Where do I get a parking permit?", held)  # no name
    assert not leads("Where does Qinghe park?", "", {"qinghe": {Lang.EN: False}}.__getitem__)  # its own hold it
    # Capitalised by the model only: the English documents write "spring" and "team" as words.
    assert not leads("春季团建去哪儿玩？", "Where do the Spring Team meet?", held)


def test_a_word_is_written_as_a_name_where_most_of_its_places_capitalise_it() -> None:
    assert written_as_name("london", ["Hotels in London.", "london.example is our site; London office"])
    assert not written_as_name("team", ["Management Team Minutes", "the team met", "each team lead"])
    assert not written_as_name("owen", ["no such word here"])


def test_a_name_only_the_other_languages_documents_hold_puts_their_passage_first(tmp_path: Path) -> None:
    lib = make(tmp_path)
    chinese = add(lib, "出差住宿标准：一般员工每晚四百元。")
    english = add(lib, "Hotels in London: up to 160 pounds a night.")
    question = "在伦敦出差住酒店，每晚最多报销多少？"
    found = asyncio.run(lib.search([OFFICE], question, also="How much is a hotel in London a night?"))
    assert [f.doc for f in found][:2] == [english.id, chinese.id]
    # Named nowhere in the other language's documents: the question's own best stays first.
    found = asyncio.run(lib.search([OFFICE], question, also="How much is a hotel in Paris a night?"))
    assert found[0].doc == chinese.id
    lib.stop()
