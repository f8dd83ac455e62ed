"""Whether the library holds anything close enough to a question to ask the model at all,
and what the server says, in the question's language, when it does not (or when the
answer's figures and names are in none of its sources). The 0.5B model answers every
question it is given sources for: on the evaluation set it refused 0 of 4 unanswerable
ones, inventing figures from near-miss passages; the server decides instead.

Closeness is measured two ways: the cosine of the question's embedding to the nearest
passage found (only for text the embedding model reads: English), and the share of the
question's content words (English, by a five-letter stem) or character pairs (CJK) that
one found passage holds. bench/library/grounding.py chose the thresholds."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from appliance.library.attribute import STOP, Attribution, Verdict, cjk_share
from appliance.library.passages import CJK
from appliance.library.store import Found

_CJK_RUN = re.compile(f"[{CJK}]+")
_LATIN = re.compile(r"[A-Za-z][A-Za-z0-9]*|\d+")
# Characters of asking and of grammar (what, how many, can, of): a CJK pair holding one is a
# question's frame or crosses two words (了结, 以休), which no passage is expected to hold.
FRAME = frozenset("的了是在吗呢要能可以几多少么什哪怎我你他她们每个一这那有和与或及就都也还把被给让从到对为最请该得会想")
STEM = 5  # letters a word is compared by: holiday and holidays, policy and policies
CHINESE = 0.3  # a question with more of its letters CJK is answered in Chinese

# Chosen on the evaluation set (bench/library/grounding.py: 67 answerable questions, 12
# unanswerable near misses). Read by meaning (English), a question is close at a cosine of
# 0.30 or with 0.55 of its words in one passage: 0 of 34 answerable refused, 1 of 6
# unanswerable (u06); not read (Chinese), with 0.15 of its words: 2 of 33 refused (both
# without their page among the sources), 1 of 6 unanswerable. The cosine was 0.40 (3 of 34
# refused: q07, q14, x08; 2 of 6) until the checks after the answer caught most near misses
# (about.py, Library.unmentioned: 11 of 12 in the whole run); at 0.30, q14 is answered from its
# page. Near misses ("the summer party" for the Christmas party's budget) are as close as
# answers; what the model invents from them is caught after it writes (attribute.py,
# unsupported_note), and what it quotes from them for the thing asked too (about.py).
NEAR = 0.30  # the nearest passage's cosine at or above which a question is close
WORDS = 0.55  # the share of the question's words one passage holds at or above which it is close
WORDS_UNREAD = 0.15  # the same, for a question the embedding model does not read


@dataclass(frozen=True, slots=True)
class Closeness:
    near: float | None  # the nearest found passage's cosine (None: nothing was read by meaning)
    words: float  # the largest share of the question's words one found passage holds
    # Whether the question itself is read by meaning (English). A Chinese question's `near`
    # comes from its English translation (translate.py) when it has one: its words are still
    # judged by the rule for questions not read (0.15), as the thresholds were chosen. Judged by
    # 0.55, the after-run refused 4 more answerable Chinese questions for 2 more near misses.
    read: bool = True

    def close(self, near: float = NEAR, words: float = WORDS, unread: float = WORDS_UNREAD) -> bool:
        """Close enough to ask the model: by meaning, or by words (with less of them when the
        question is not read by meaning)."""
        if self.near is not None and self.near >= near:
            return True
        return self.words >= (words if self.read and self.near is not None else unread)


def keys(text: str) -> set[str]:
    """The words a question is compared by: English content words by their stem, numbers,
    and CJK character pairs (a run of one, itself)."""
    out = {w.lower()[:STEM] for w in _LATIN.findall(text) if w.lower() not in STOP and (len(w) > 2 or not w.isalpha())}
    for run in _CJK_RUN.findall(text):
        pairs = {run} if len(run) == 1 else {run[i:i + 2] for i in range(len(run) - 1)}
        out |= {p for p in pairs if not FRAME & set(p)}
    return out


def closeness(questions: Sequence[str], found: Sequence[Found]) -> Closeness:
    """How close the found passages come to the question (or to any of its forms searched:
    a translation is compared as the question)."""
    nears = [f.near for f in found if f.near is not None]
    shares = [0.0]
    for q in questions:
        asked = keys(q)
        if asked:
            shares += [len(asked & keys(f.text)) / len(asked) for f in found]
    return Closeness(max(nears) if nears else None, max(shares), not chinese(questions[0]) if questions else True)


def chinese(question: str) -> bool:
    return cjk_share(question) > CHINESE


def not_in_library(question: str) -> str:
    """The server's answer when nothing in the library is close to the question."""
    if chinese(question):
        return "资料库中没有与这个问题相关的内容，无法回答。"
    return "The library does not say: nothing in it is close to this question."


def listed(items: Sequence[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def unmentioned_note(question: str, things: Sequence[str]) -> str:
    """What the answer gets at its end when its question names things no document mentions."""
    if chinese(question):
        return f"\n\n（资料库中没有这一说法：没有任何文件提到{'、'.join(f'“{t}”' for t in things)}。）"
    return f"\n\n(The library does not say this: no document mentions {listed([f'“{t}”' for t in things])}.)"


def unsupported_note(question: str, got: Attribution) -> str:
    """What the answer gets at its end when none of its figures and names is in a source
    ("" otherwise)."""
    if got.verdict is not Verdict.UNSUPPORTED or not got.unsupported:
        return ""
    if chinese(question):
        return f"\n\n（资料库中没有这一说法：{'、'.join(got.unsupported)} 不在任何来源中。）"
    verb = "is" if len(got.unsupported) == 1 else "are"
    return f"\n\n(The library does not say this: {listed(got.unsupported)} {verb} in none of its sources.)"


def closest_note(question: str, n: int, title: str, page: int | None, sentence: str) -> str:
    """What an answer that does not stand gets at its end: the sentence of its sources closest
    to the question (library/closest.py), with its source's number, title and page."""
    if chinese(question):
        where = (f"《{title}》" if title else "") + (f"第{page}页" if page is not None else "")
        return f"\n\n（来源中最接近的是 [{n}] {where}：“{sentence}”）".replace(" ：", "：")
    where = ", ".join(w for w in (title, f"page {page}" if page is not None else "") if w)
    return f"\n\n(The closest the sources come is [{n}] {where}: “{sentence}”)".replace(" :", ":")
