"""An answer attributed to its sources (library/attribute.py): figures, names and phrases,
English and Chinese; the supporting sentence; a wrong [n] dropped; an invented figure
unsupported."""

from __future__ import annotations

from appliance.library.attribute import Verdict, attribute, cjk_share, evidence, figure_key, sentences

FLEXI = ("Working hours. Core hours are 10:00 to 16:00. You may carry over up to 12 hours of flexitime credit "
         "to the next month; hours beyond that are lost.")
LEAVE = "Annual leave. Full-time staff receive 27 days of annual leave a year, plus bank holidays."
GIFTS = "Gifts. Record any gift from a client worth more than £1,200 in the gifts register, kept by Priya Natarajan."
AED = "First aid. The AED hangs beside Reception on the ground floor, next to the A4 printer."
NIANJIA = "年假：全职员工每年享有15天带薪年假。未休完的年假须在次年6月30日前休完。"
BAOXIAO = "报销：出差前最晚提前3个工作日在系统中提交申请。市内交通每天最多报销100元。"


def test_figures_are_values_with_their_currency_and_percent() -> None:
    assert figure_key("1,000") == figure_key("1000") == figure_key("1000.00") == "1000"
    assert figure_key("4.60") == "4.6" and figure_key("007") == "7"
    got = evidence("It costs £1,200, 6% of pay, 35 MB at most; 6,800万元 in all.")
    assert got.figures == {"1200", "6", "35", "6800"}
    assert dict(got.written)["1200"] == "£1,200" and dict(got.written)["6"] == "6%"
    # A list's numbers, a code's digit and a citation are no figures.
    assert evidence("1. See the A4 printer [2].\n2. Then ask.").figures == frozenset()


def test_names_are_codes_and_capitalised_words_not_first_in_a_sentence() -> None:
    got = evidence("The AED is by Reception. Ask Priya Natarajan about the VPN and the A4 paper.")
    assert got.names == {"aed", "reception", "priya", "natarajan", "vpn", "a4"}  # "The", "Ask": first words


def test_sentences_split_english_chinese_and_lines() -> None:
    assert sentences("One is £1.08m. Two! 三。四？\n- five") == ["One is £1.08m.", "Two!", "三。", "四？", "five"]


def test_an_english_answer_is_attributed_to_the_source_that_holds_its_figure() -> None:
    got, text = attribute("You can carry over up to 12 hours of flexitime [1].", [LEAVE, FLEXI, GIFTS],
                          "How much spare flexitime can I save up?")
    assert [u.used for u in got.uses] == [False, True, False]
    assert got.uses[1].support == ("You may carry over up to 12 hours of flexitime credit to the next month; "
                                   "hours beyond that are lost.")
    assert got.uses[0].support is None
    assert got.verdict is Verdict.SUPPORTED and got.unsupported == ()
    # The model cited [1] (the leave passage): it does not hold 12 hours, so it is dropped.
    assert got.dropped == (1,) and text == "You can carry over up to 12 hours of flexitime."


def test_a_number_is_found_however_it_is_written() -> None:
    got, _ = attribute("Gifts above 1200 pounds must be recorded [3].", [LEAVE, FLEXI, GIFTS])
    assert got.verdict is Verdict.SUPPORTED and got.dropped == () and got.uses[2].used
    # A source's number in words holds the answer's in digits (not the other way: "one" may be a pronoun).
    got, _ = attribute("Probation lasts 6 months.", ["New starters serve a probation period of six months."])
    assert got.verdict is Verdict.SUPPORTED and got.uses[0].used
    got, _ = attribute("Take the one by the door.", ["There are 3 keys by the door."])
    assert got.unsupported == ()


def test_an_invented_figure_is_unsupported() -> None:
    got, text = attribute("The office has 14 parking spaces [1].", [LEAVE, FLEXI], "How many parking spaces are there?")
    assert got.verdict is Verdict.UNSUPPORTED and got.unsupported == ("14",)
    assert got.dropped == (1,) and not any(u.used for u in got.uses) and text == "The office has 14 parking spaces."


def test_an_answer_with_one_figure_found_and_one_not_is_partly_supported() -> None:
    got, text = attribute("Staff get 27 days [2], and 5 more after ten years [2].", [FLEXI, LEAVE])
    assert got.verdict is Verdict.PARTLY and got.unsupported == ("5",) and got.dropped == (2,)
    assert text == "Staff get 27 days [2], and 5 more after ten years."  # only the mark its sentence lacks


def test_names_and_codes_support_an_answer_without_figures() -> None:
    got, _ = attribute("The AED is beside Reception [1].", [AED, LEAVE], "Where is the AED?")
    assert got.verdict is Verdict.SUPPORTED and [u.used for u in got.uses] == [True, False]
    assert got.uses[0].support == "The AED hangs beside Reception on the ground floor, next to the A4 printer."
    got, _ = attribute("Ask Margaret Quill at the Linden gate.", [AED, LEAVE])
    assert got.verdict is Verdict.UNSUPPORTED and got.unsupported == ("Margaret", "Quill", "Linden")


def test_what_the_question_says_is_no_evidence() -> None:
    # "14" and "parking" come from the question: not invented, and not what a source is used for.
    got, _ = attribute("I cannot tell whether there are 14 parking spaces.", [LEAVE], "Are there 14 parking spaces?")
    assert got.unsupported == () and not got.uses[0].used


def test_a_chinese_answer_is_attributed_by_its_figures_and_character_ngrams() -> None:
    got, text = attribute("全职员工每年有15天年假[2]。", [BAOXIAO, NIANJIA], "年假有几天？")
    assert [u.used for u in got.uses] == [False, True] and got.verdict is Verdict.SUPPORTED
    assert got.uses[1].support == "年假：全职员工每年享有15天带薪年假。"
    assert got.dropped == () and text == "全职员工每年有15天年假[2]。"
    # The wrong source cited, and a figure no source holds.
    got, text = attribute("出差打车每天最多报销80元[2]。", [BAOXIAO, NIANJIA], "打车每天能报多少？")
    assert got.verdict is Verdict.UNSUPPORTED and got.unsupported == ("80",) and got.dropped == (2,)
    assert text == "出差打车每天最多报销80元。" and got.uses[0].used  # its phrases are the travel passage's


def test_marks_out_of_range_or_joined_are_checked_one_by_one() -> None:
    got, text = attribute("Full-time staff receive 27 days [1, 2, 7].", [LEAVE, FLEXI])
    assert got.dropped == (2, 7) and text == "Full-time staff receive 27 days [1]."
    # A mark after the sentence's full stop is the sentence's.
    got, text = attribute("Full-time staff receive 27 days. [2]", [LEAVE, FLEXI])
    assert got.dropped == (2,) and text == "Full-time staff receive 27 days."


def test_an_answer_that_asserts_nothing_keeps_its_marks() -> None:
    got, text = attribute("See [1].", [LEAVE])
    assert got.dropped == () and text == "See [1]." and got.unsupported == ()


def test_an_answer_without_figures_or_names_is_judged_by_its_phrases() -> None:
    got, _ = attribute("Hours beyond that are lost at the end of the month.", [FLEXI, LEAVE])
    assert got.verdict is Verdict.SUPPORTED and [u.used for u in got.uses] == [True, False]
    got, _ = attribute("Pineapples ripen slowly in winter.", [FLEXI, LEAVE])
    assert got.verdict is Verdict.UNSUPPORTED and not any(u.used for u in got.uses)


def test_two_sources_used_when_each_adds_a_figure() -> None:
    got, _ = attribute("You get 27 days of leave, and can carry 12 hours of flexitime.", [LEAVE, FLEXI, GIFTS])
    assert [u.used for u in got.uses] == [True, True, False] and got.verdict is Verdict.SUPPORTED


def test_the_question_language_share() -> None:
    assert cjk_share("年假有几天？") == 1.0 and cjk_share("How many days?") == 0.0
    assert 0 < cjk_share("A4纸多少钱") < 1



def test_an_answer_supported_by_phrases_shows_the_source_that_holds_most_of_them() -> None:
    # Seen on the handbook: the answer was the section's heading, each phrase of it in a
    # source yet none enough to count as used; supported must come with a sentence to show.
    sources = ["4. Holidays and annual leave. Full-time employees receive 25 days of paid annual leave per year.",
               "Part-time employees receive leave pro rata.", "Sick leave is paid for 10 days."]
    got, _ = attribute("Holidays and annual leave", sources,
                       "How many days of paid annual leave do full-time employees get?")
    assert got.verdict is Verdict.SUPPORTED
    assert [u.used for u in got.uses] == [True, False, False]
    assert got.uses[0].support == "Holidays and annual leave."  # "4." is a sentence of its own
