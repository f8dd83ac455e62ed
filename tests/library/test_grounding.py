"""Whether the library holds anything close to a question (library/grounding.py), and what the
server says when not, in the question's language."""

from __future__ import annotations

from appliance.library.attribute import Attribution, Verdict
from appliance.library.grounding import Closeness, closeness, keys, not_in_library, unsupported_note
from appliance.library.store import Found


def found(text: str, near: float | None = None) -> Found:
    return Found(1, "lib_1", "Handbook", None, text, near)


def test_a_questions_words_are_content_stems_and_cjk_pairs_without_the_frame() -> None:
    assert keys("How many days of holiday do full-time staff get?") == {"days", "holid", "full", "time", "staff"}
    # 领了 了结 证可 可以 以休 休几 几天 hold a character of grammar or asking: a question's frame.
    assert keys("领了结婚证可以休几天假？") == {"结婚", "婚证", "天假"}
    assert keys("A4纸") == {"a4", "纸"}


def test_closeness_is_the_nearest_cosine_and_the_best_share_of_words() -> None:
    got = closeness(["Where is the spare key kept?"],
                    [found("The spare key is in the blue pot.", 0.3), found("Keys are kept at reception.", 0.6)])
    assert got.near == 0.6 and got.words == 2 / 3  # spare, key (the first); key, kept (the second: "keys" is "keys")
    assert closeness(["年假有几天？"], [found("全职员工每年享有15天带薪年假。")]) == Closeness(None, 1.0, read=False)
    # A form of the question searched besides it (a translation) counts as the question.
    assert closeness(["年假", "annual leave"], [found("Annual leave is 27 days.")]).words == 1.0
    assert closeness(["hello"], []) == Closeness(None, 0.0)


def test_close_by_meaning_or_by_words_and_by_fewer_words_unread() -> None:
    assert Closeness(0.30, 0.0).close() and Closeness(0.1, 0.55).close()
    assert not Closeness(0.29, 0.54).close()
    assert Closeness(None, 0.15).close() and not Closeness(None, 0.14).close()
    assert Closeness(0.5, 0.0).close(near=0.6, words=0.7) is False


def test_a_chinese_questions_words_keep_their_rule_when_its_translation_is_read() -> None:
    # The translation brings a cosine; the Chinese question's own words are still judged by
    # the rule for questions not read by meaning (0.15), not by English's 0.55.
    got = closeness(["上班忘了打卡，一个月能补几次？", "How many times a month can I fix a missed clock-in?"],
                    [found("员工忘记打卡的，每月可补卡2次，需在OA系统提交补卡申请。", 0.2)])
    assert got.read is False and got.near == 0.2 and 0.15 <= got.words < 0.55
    assert got.close()
    assert not Closeness(0.2, 0.14, read=False).close() and Closeness(0.41, 0.0, read=False).close()


def test_the_server_says_it_in_the_questions_language() -> None:
    assert not_in_library("Where is the gym?").startswith("The library does not say")
    assert not_in_library("健身房在哪里？") == "资料库中没有与这个问题相关的内容，无法回答。"


def test_an_unsupported_answer_is_noted_and_a_supported_one_is_not() -> None:
    bad = Attribution((), Verdict.UNSUPPORTED, ("14",), ())
    assert unsupported_note("How many spaces?", bad) == "\n\n(The library does not say this: 14 is in none of its sources.)"
    two = Attribution((), Verdict.UNSUPPORTED, ("14", "£200", "Kestrel"), ())
    assert unsupported_note("How many?", two).endswith("14, £200 and Kestrel are in none of its sources.)")
    assert unsupported_note("有多少车位？", bad) == "\n\n（资料库中没有这一说法：14 不在任何来源中。）"
    assert unsupported_note("How many?", Attribution((), Verdict.PARTLY, ("14",), ())) == ""
    assert unsupported_note("How many?", Attribution((), Verdict.UNSUPPORTED, (), ())) == ""
