"""Whether an answer is about what its question asks (library/about.py): a figure quoted from a
passage that does not name what the question names, or from a passage far less about the
question than another source given, is astray; the note says so in the question's language."""

from __future__ import annotations

from appliance.library.about import GAP, Astray, astray, moneys, names, note, share, weights

SUMMER = "2. Summer party. Friday 3 July at the boathouse. Budget £45 per head; partners are not included."
WINTER = "The office closes between Christmas and New Year; the closure does not count as annual leave."
KESTREL = "4. Meeting rooms. Booking displays go up outside Room Kestrel on 2 March."
HERON = "Meeting of 11 June, Room Heron. Works run from 3 to 21 August on the second floor."
INSURANCE = "公司为转正员工购买补充商业医疗保险，门诊及住院费用在社保报销后的自付部分可再报销。"
MEALS = "工作日午餐补贴每人每天28元，随当月工资发放。"


def test_a_question_names_its_capitalised_words_but_not_its_first_nor_codes() -> None:
    assert names("What is the budget per head for the Christmas party?") == ["Christmas"]
    assert names("How many people can Room Kestrel seat?") == ["Room", "Kestrel"]
    # I'm is no thing named; E2 is a code (a table writes it within E1–E5).
    assert names("I'm grade E2 and on standby on a Sunday. What am I paid?") == ["Sunday"]
    assert names("公司食堂的午餐一份多少钱？") == []


def test_a_word_every_source_holds_weighs_nothing() -> None:
    weight = weights("What is the summer party budget?", [SUMMER, "The summer party rota.", "Summer hours."])
    assert weight["summe"] == 0.0 and weight["budge"] > weight["party"] > 0.0
    assert share(weight, SUMMER) == 1.0 and share(weight, "Summer hours.") == 0.0 < share(weight, "A party.")
    assert share({}, "anything") == 1.0


def test_a_figure_from_a_passage_that_does_not_name_the_questions_thing_is_astray() -> None:
    question = "What is the budget per head for the Christmas party?"
    got = astray(question, "The budget for the Christmas party is £45 per head [1].", [SUMMER, WINTER])
    assert got == Astray(("£45",), ("Christmas",), False) and got
    # The same figure asked of the passage's own thing is about the question.
    assert not astray("What is the budget per head for the summer party?", "It is £45 [1].", [SUMMER, WINTER])
    # The document's title names what its passages are about.
    assert not astray(question, "It is £45 [1].", [SUMMER], ["Christmas party plans"])


def test_each_figure_is_judged_by_the_passages_that_hold_it() -> None:
    # The 2 is Kestrel's passage's; the 21 is Room Heron's "21 August": astray for it alone.
    got = astray("How many people can Room Kestrel seat?", "Page 2 says Room Kestrel seats 21 people.",
                 [KESTREL, HERON])
    assert got.figures == ("21",) and got.names == ("Kestrel",)


def test_a_name_is_not_judged_in_another_script() -> None:
    # Qinghe is 青禾 in pinyin: a Chinese passage cannot spell it, so it is not held to it.
    assert not astray("How much is Qinghe's meal allowance per day?", "It is 28 yuan a day [1].", [MEALS])


def test_a_figure_from_a_passage_far_less_about_the_question_is_astray() -> None:
    question = "公司买的补充商业医疗保险，每人保额是多少？"
    got = astray(question, "根据[1]，每人保额是28元。", [INSURANCE, MEALS])
    assert got == Astray(("28",), (), True)
    assert share(weights(question, [INSURANCE, MEALS]), INSURANCE) - GAP >= 0.0
    assert not astray("工作日午餐补贴每人每天多少钱？", "每人每天28元。", [INSURANCE, MEALS])


def test_a_figure_from_a_passage_in_the_other_language_is_not_held_to_the_questions_words() -> None:
    # The English question's words are in no Chinese passage: the English source beside it
    # holds more of them, and that says nothing of which passage answers.
    english = "Staff receive a meal allowance when travelling on business; the daily rates are set by the policy."
    question = "How much is the daily meal allowance at work?"
    assert not astray(question, "It is 28 yuan a day [2].", [english, MEALS]).closer


def test_a_source_in_the_other_language_is_read_by_the_questions_translation() -> None:
    # A Chinese question answered with an English passage's figure: its translation says what
    # the English passages would have to be about, and the travel policy's £65 is not that.
    hotel = "Hotels. The most you may claim for a night's hotel outside London is £65."
    party = "今年年会设抽奖环节，一等奖、二等奖的奖品名单另行公布。"
    question, also = "今年年会抽奖的一等奖是什么？", "What is the first prize in this year's annual party lottery?"
    assert astray(question, "根据[2]，一等奖是 £65。", [party, hotel], also=also).closer
    # And an English question answered right from a Chinese passage is not refused for it.
    fee = "会议决定：新云服务器合同年费46.8万元，由信息部负责签约。"
    other = "Cloud services. Every new contract with a cloud provider is reviewed by IT before signing."
    assert not astray("What is the yearly fee of the new cloud server contract?", "It is 46.8万元 a year [1].",
                      [fee, other], also="新云服务器合同的年费是多少？")


def test_figures_in_no_source_or_in_most_are_left_to_attribution() -> None:
    assert not astray("What is the Christmas budget?", "It is £99.", [SUMMER, WINTER])  # in none: attribute.py's
    everywhere = ["The 2026 rota.", "Plans for 2026.", "The 2026 party is in July."]
    assert astray("When is the Christmas party?", "In 2026.", everywhere) == Astray(())


def test_a_figure_in_another_currency_than_its_sources_is_astray() -> None:
    lunch = "Meals: breakfast £12, lunch £15, evening meal £32."
    assert moneys("£15, 45元, 16.3万元, 20 pounds, € 150, 12 days") == \
        {"15": {"GBP"}, "45": {"CNY"}, "16.3": {"CNY"}, "20": {"GBP"}, "150": {"EUR"}}
    got = astray("食堂的午餐一份多少钱？", "午餐一份15元。", [lunch, "前台服务时间为8:30至18:00。"])
    assert got.currency and got.figures == ("15",)
    assert not astray("How much is lunch?", "Lunch is 15 pounds [1].", [lunch, "Opening hours 8:30 to 18:00."])
    assert not astray("How much is lunch?", "Lunch is 15.", [lunch, "Opening hours 8:30 to 18:00."])
    # An amount with two marks is in either: the model's pound sign on the minutes' 46.8万元.
    assert moneys("£46.8万元") == {"46.8": {"GBP", "CNY"}}
    fee = "新的云服务器合同年费46.8万元，由赵磊负责。"
    assert not astray("What is the cloud contract's yearly fee?", "The yearly fee is £46.8万元.",
                      [fee, "Hotels in London: up to £160 a night."]).currency


def test_the_note_says_it_in_the_questions_language() -> None:
    named = Astray(("£45",), ("Christmas",))
    assert note("What is the Christmas budget?", named) == \
        "\n\n(The library does not say this: the sources that give £45 do not mention Christmas.)"
    assert note("How much?", Astray(("28", "£5"), (), True)).endswith(
        "the sources that give 28 and £5 are about something other than what was asked.)")
    assert note("每人保额是多少？", Astray(("28",), (), True)) == \
        "\n\n（资料库中没有这一说法：给出 28 的来源说的不是所问的内容。）"
    assert note("How much?", Astray(("15",), currency=True)).endswith("its sources give 15 in another currency.)")
    assert note("多少钱？", Astray(("15",), currency=True)).endswith("来源中的 15 是另一种货币。）")
    assert note("How much?", Astray(("28",))) == ""
