"""The sentence of an answer's sources closest to its question (library/closest.py), and the
check that quotes it after an answer that does not stand (http/grounded.Check)."""

from __future__ import annotations

from appliance.http.grounded import Check
from appliance.library.closest import LONGEST, closest, says, shown

LAPTOP = ("Devices\nReport a lost or stolen laptop or phone to the service desk within one hour, day or night. "
          "The desk is on the second floor.")
LEAVE = "Full-time employees receive 27 days of paid annual leave. Leave is booked in PeopleDesk."
RESIGN = "离职\n转正后员工须提前30天以书面形式提出。试用期内须提前3天通知。"


def test_a_heading_or_a_label_says_nothing() -> None:
    assert not says("Devices") and not says("Notice periods") and not says("表2 工龄津贴")
    assert not says("The rules for devices are these:") and not says("补充医疗保险的规定如下：")
    assert says("Report a lost laptop within one hour.") and says("转正后员工须提前30天以书面形式提出。")


def test_the_sentence_holding_most_of_the_question_is_chosen() -> None:
    got = closest(["How quickly must I report a stolen laptop?"], [LEAVE, LAPTOP])
    assert got is not None and got.n == 2
    assert got.sentence == "Report a lost or stolen laptop or phone to the service desk within one hour, day or night."
    assert got.share >= 0.5
    # Chinese: by character pairs; the heading 离职 alone is not quoted.
    zh = closest(["如果已经转正了，想辞职要提前多久打招呼？"], [LEAVE, RESIGN])
    assert zh is not None and zh.n == 2 and zh.sentence == "转正后员工须提前30天以书面形式提出。"


def test_a_tie_goes_to_the_better_ranked_source() -> None:
    got = closest(["How many days of annual leave?"], [LEAVE, LEAVE])
    assert got is not None and got.n == 1


def test_the_translation_finds_a_sentence_the_question_cannot() -> None:
    question = "员工手机丢了要多久内报告？"
    assert closest([question], [LAPTOP]) is None  # no character of it in an English source
    got = closest([question, "How soon must a lost phone be reported?"], [LAPTOP])
    assert got is not None and "within one hour" in got.sentence


def test_too_little_of_the_question_is_nothing_quoted() -> None:
    assert closest(["What is the parking fee for visitors at the Berlin office?"], [LEAVE, LAPTOP]) is None
    assert closest([""], [LAPTOP]) is None and closest(["Laptop?"], []) is None
    # One word in common is not enough, whatever its share.
    assert closest(["laptop"], [LAPTOP]) is None


def test_a_long_sentence_is_cut_in_the_note_only() -> None:
    long = "The laptop policy says " + "that every stolen laptop matters " * 20 + "and must be reported."
    got = closest(["Report a stolen laptop policy"], [long])
    assert got is not None and got.sentence == long
    assert len(shown(got.sentence)) == LONGEST + 1 and shown(got.sentence).endswith("…") and shown("short") == "short"


def test_a_form_short_of_the_thresholds_does_not_hide_another_that_meets_them() -> None:
    vpn = "To reset your VPN password, open the self-service portal and choose Reset."
    # "VPN？" alone holds its one word wholly (share 1.0, but one word): the translation's 0.67 counts.
    got = closest(["VPN？", "How do I reset my VPN token?"], [vpn])
    assert got is not None and got.sentence == vpn and got.share == 0.667


def test_a_table_is_quoted_a_cell_by_its_row_and_column_never_its_header() -> None:
    allowances = ("Table 1: Daily allowance abroad\nCity | Grades E1–E3 | Grades E4–E5 | Directors\n"
                  "Paris | €58 | €66 | €82\nBerlin | €52 | €61 | €77")
    got = closest(["What is the daily allowance in Berlin for grades E4–E5?"], [allowances])
    assert got is not None and got.sentence == "Berlin, Grades E4–E5: €61"
    assert says("广东, 中级顾问: 105元")
    header = closest(["Which grades and cities does the table list?"], [allowances])
    assert header is None or "|" not in header.sentence


def test_the_sources_the_answer_used_are_not_quoted() -> None:
    got = closest(["How quickly must I report a stolen laptop?"], [LAPTOP, LAPTOP], skip=frozenset({1}))
    assert got is not None and got.n == 2
    assert closest(["How quickly must I report a stolen laptop?"], [LAPTOP], skip=frozenset({1})) is None


def source(n: int, text: str, title: str, page: int | None) -> dict[str, object]:
    return {"n": n, "document": f"d{n}", "title": title, "page": page, "text": text}


def test_an_answer_that_does_not_stand_gets_the_closest_sentence_and_its_source_is_used() -> None:
    question = "How quickly must I tell IT that my laptop was stolen?"
    check = Check(question, [source(1, LEAVE, "Staff Handbook", 2), source(2, LAPTOP, "IT Policy", 5)])
    note = check.note(0, "The library does not say.")
    assert note == ("\n\n(The closest the sources come is [2] IT Policy, page 5: “Report a lost or stolen laptop "
                    "or phone to the service desk within one hour, day or night.”)")
    wire = check.wire(0)
    assert [(s["n"], s["used"], s["quoted"]) for s in wire["sources"]] == [(1, False, False), (2, False, True)]
    assert wire["sources"][1]["support"].startswith("Report a lost or stolen laptop")
    assert wire["sources"][0]["support"] is None
    assert wire["grounding"]["verdict"] == "unsupported"
    # A Chinese question's note is in Chinese.
    zh = Check("如果已经转正了，想辞职要提前多久打招呼？", [source(1, RESIGN, "员工手册", 3)])
    assert zh.note(0, "根据[2]中的信息，如果已经转正了，如果想辞职要提前多久打招呼？") == \
        "\n\n（来源中最接近的是 [1] 《员工手册》第3页：“转正后员工须提前30天以书面形式提出。”）"
    # A source without a title or a page is named by its number alone.
    bare = Check("How quickly must I tell IT that my laptop was stolen?", [source(1, LAPTOP, "", None)])
    assert bare.note(0, "I do not know.").startswith("\n\n(The closest the sources come is [1]: “Report a lost")


def test_an_answer_that_stands_or_asks_of_what_is_unmentioned_gets_no_quote() -> None:
    question = "How quickly must I tell IT that my laptop was stolen?"
    sources = [source(1, LEAVE, "Staff Handbook", 2), source(2, LAPTOP, "IT Policy", 5)]
    check = Check(question, sources)
    assert check.note(0, "Within one hour, day or night [2].") == ""
    assert [(s["used"], s["quoted"]) for s in check.wire(0)["sources"]] == [(False, False), (True, False)]
    # The question names a thing no document mentions: any sentence would be of something else.
    jury = Check("How quickly must I tell the jury that my laptop was stolen?", sources, unknown=["jury"])
    assert "closest" not in jury.note(0, "The library does not say.")
    # Nothing close enough to ask the model: the server's own answer, no quote.
    far = Check(question, [], close=False)
    assert far.note(0, "anything") == "" and far.wire(0)["sources"] == []


def test_after_an_answer_astray_the_passage_it_came_from_is_not_quoted() -> None:
    # The Christmas party's budget asked (no "unmentioned" thing: the dictionary may be off),
    # answered with the summer party's £45: the note says so, and the quote, if any, is from
    # another source than the one the figure came from.
    party = "Summer party: the budget is £45 per head, partners not included."
    christmas = "The Christmas party is held in the canteen on the last Friday before the holidays."
    question = "What is the budget per head for the Christmas party?"
    check = Check(question, [source(1, party, "Minutes", 2), source(2, christmas, "Events", 1)])
    note = check.note(0, "The budget for the Christmas party is £45 per head [1].")
    assert note.startswith("\n\n(The library does not say this: the sources that give £45 do not mention Christmas.)")
    assert note.endswith("(The closest the sources come is [2] Events, page 1: “" + christmas + "”)")
    assert [(s["used"], s["quoted"]) for s in check.wire(0)["sources"]] == [(True, False), (False, True)]
    alone = Check(question, [source(1, party, "Minutes", 2)])
    assert "closest" not in alone.note(0, "The budget for the Christmas party is £45 per head [1].")
