"""An answer attributed to the sources it was given, after it is written, whatever [n] the
model put in it (a 0.5B model cites the right document in 7 of 36 answers): the answer's
figures (numbers as values: "1,000" is "1000", "£160" is 160), names (capitalised words
and codes: AED, VPN, A4) and phrases (word pairs; for CJK, character pairs and triples)
looked for in each source. Each source the answer used gets the sentence of it that best
supports the answer; a [n] whose passage holds none of its sentence's evidence is dropped;
figures and names found in no source are unsupported. Pure functions: no I/O, no model."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from appliance.library.passages import CJK

_CJK_RUN = re.compile(f"[{CJK}]+")
# [1], [1, 2], [1][2]: the numbers the prompt gave its sources (library/cite.py).
MARK = re.compile(r"\s?\[(\d{1,3}(?:\s*[,，]\s*\d{1,3})*)\]")
# A figure: a number, its currency before it, its percent after. Not a digit of a code (A4,
# B2), nor a list's "1." at a line's start (see _LIST).
_FIGURE = re.compile(r"(?<![A-Za-z0-9.,])([£$€¥￥]?)(\d+(?:[,，]\d{3})*(?:\.\d+)?)(\s?[%％])?")
_LIST = re.compile(r"^\s*\d{1,2}[.)、]\s", re.MULTILINE)
_LATIN = re.compile(r"[A-Za-z][A-Za-z0-9&'’-]*")
# A code: three capitals or more (AED, VPN), or letters and digits (A4, B2); as passages.py's.
CODE = re.compile(r"[A-Z]{2,}[A-Z0-9]*|[A-Za-z]+\d[A-Za-z0-9]*")
# Sentences: after . ! ? with a space, after 。！？ at once, and at each line (passages keep lists).
_SENTENCE = re.compile(r"(?<=[.!?])\s+|(?<=[。！？；])|\n+")
_STARTS = set(".!?:;\n\"'(“‘-*•#。！？：；")
# Words too common to tell sources apart (and words of the answer's own framing).
STOP = frozenset("""a an the and or but if of to in on at by for with from as is are was were be been being it its
this that these those there here than then so such not no yes do does did done can could may might must shall should
will would i you he she we they me him her us them my your our their what which who whom whose when where why how
all any each every some more most other own same very just also only about into over under after before between per
up down out off again once see according source sources library says say said stated states based above below
answer question cited cite please note however therefore many much get gets got""".split())

SUPPORTED, PARTLY = 0.5, 0.2  # an answer without figures or names: the share of its phrases found in a source
USED = 2.0  # a source is used at this weight of the answer's evidence at least (a name is 2, a phrase 1)


class Verdict(StrEnum):
    SUPPORTED = "supported"  # every figure and name of the answer is in a source (or most of its phrases)
    PARTLY = "partly"  # some are
    UNSUPPORTED = "unsupported"  # none is
    NOT_IN_LIBRARY = "not_in_library"  # nothing was close enough to ask the model (grounding.py)


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a text asserts that a source can hold: figures by value, names in lower case,
    phrases (word pairs, CJK pairs and triples), and how each figure and name was written."""

    figures: frozenset[str] = frozenset()
    names: frozenset[str] = frozenset()
    phrases: frozenset[str] = frozenset()
    written: tuple[tuple[str, str], ...] = ()  # (key, as the text wrote it), figures and names

    def __sub__(self, other: Evidence) -> Evidence:
        return Evidence(self.figures - other.figures, self.names - other.names, self.phrases - other.phrases,
                        tuple((k, w) for k, w in self.written if k not in other.figures | other.names))

    @property
    def claims(self) -> frozenset[str]:
        return self.figures | self.names

    def weight(self, held: Evidence) -> float:
        """How much of this evidence `held` (a source's) holds: a figure 3, a name 2, a phrase 1."""
        return (3 * len(self.figures & held.figures) + 2 * len(self.names & held.names)
                + len(self.phrases & held.phrases))


@dataclass(frozen=True, slots=True)
class Use:
    """One source as the answer used it: `support` is its sentence that best supports the
    answer (None when unused)."""

    n: int
    used: bool
    support: str | None


@dataclass(frozen=True, slots=True)
class Attribution:
    uses: tuple[Use, ...]  # one per source, in the order given
    verdict: Verdict
    unsupported: tuple[str, ...]  # the answer's figures and names in no source, as it wrote them
    dropped: tuple[int, ...]  # the [n] the model wrote that its passage does not support


def cjk_share(text: str) -> float:
    """The share of the text's letters that are CJK (the question's language: > 0.3 is Chinese)."""
    cjk = sum(len(m) for m in _CJK_RUN.findall(text))
    letters = cjk + sum(len(m) for m in _LATIN.findall(text))
    return cjk / letters if letters else 0.0


def sentences(text: str) -> list[str]:
    """The text's sentences, list marks and blanks aside."""
    parts = (p.strip().lstrip("-*•# ").strip() for p in _SENTENCE.split(text))
    return [p for p in parts if p]


def figure_key(number: str) -> str:
    """A number as a value: "1,000" and "1000.00" are "1000"."""
    value = number.replace(",", "").replace("，", "")
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    return value.lstrip("0") or "0"


def _figures(text: str) -> list[tuple[str, str]]:
    text = _LIST.sub(" ", text)
    return [(figure_key(m.group(2)), (m.group(1) + m.group(2) + (m.group(3) or "").strip()))
            for m in _FIGURE.finditer(text)]


def names_in(text: str) -> list[tuple[str, str]]:
    """Codes anywhere, and capitalised words not first in their sentence (a sentence's first
    word is capitalised whatever it is)."""
    out = []
    for m in _LATIN.finditer(text):
        word = m.group(0).rstrip("'’-")
        before = text[:m.start()].rstrip()
        first = not before or before[-1] in _STARTS or MARK.search(before[-6:]) is not None and before.endswith("]")
        if CODE.fullmatch(word) or (word[0].isupper() and not first and word.lower() not in STOP and len(word) > 1):
            out.append((word.lower(), word))
    return out


def _words(text: str) -> list[str]:
    return [w.lower() for w in _LATIN.findall(text)]


def _phrases(text: str) -> set[str]:
    """Word pairs of the text's content words, and CJK runs' character pairs and triples."""
    words = [w for w in _words(text) if w not in STOP]
    out = {f"{a} {b}" for a, b in zip(words, words[1:])} | {w for w in words if len(w) > 3}
    for run in _CJK_RUN.findall(text):
        out |= {run[i:i + k] for k in (2, 3) for i in range(len(run) - k + 1)}
    return out


def evidence(text: str) -> Evidence:
    """What `text` asserts (its [n] marks aside)."""
    text = MARK.sub(" ", text)
    figures, names = _figures(text), names_in(text)
    return Evidence(frozenset(k for k, _ in figures), frozenset(k for k, _ in names), frozenset(_phrases(text)),
                    tuple(dict.fromkeys([*figures, *names])))


# A source's numbers written as words: an answer's "6 months" is its "six months". Only a
# source's: in an answer, "one" is as often a pronoun as a figure.
_SPELLED = {w: str(i) for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve "
                                            "thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty".split())}
_SPELLED |= {"thirty": "30", "forty": "40", "fifty": "50", "hundred": "100", "thousand": "1000"}


def held(text: str) -> Evidence:
    """What a source holds: its figures (digits, and numbers as words), every word as a name
    (in lower case), its phrases."""
    words = _words(text)
    figures = {k for k, _ in _figures(text)} | {_SPELLED[w] for w in words if w in _SPELLED}
    return Evidence(frozenset(figures), frozenset(words), frozenset(_phrases(text)))


def _found(said: Evidence, helds: Sequence[Evidence]) -> set[str]:
    """The answer's figures and names that some source holds."""
    return ({k for k in said.figures if any(k in h.figures for h in helds)}
            | {k for k in said.names if any(k in h.names for h in helds)})


def _used(said: Evidence, helds: Sequence[Evidence]) -> set[int]:
    """The sources the answer came from (1-based), best first, each adding what no better one
    held: a figure or name of the answer, or USED + 1 of its phrases' weight (a source that
    shares a word or two with every answer is not used for that)."""
    order = sorted(range(len(helds)), key=lambda i: (-said.weight(helds[i]), i))
    used: set[int] = set()
    covered = Evidence()
    for i in order:
        h = helds[i]
        new = Evidence(said.figures & h.figures - covered.figures, said.names & h.names - covered.names,
                       said.phrases & h.phrases - covered.phrases)
        if new.claims or (new.weight(new) >= USED + 1 and not used) or new.weight(new) >= 2 * (USED + 1):
            used.add(i + 1)
            covered = Evidence(covered.figures | new.figures, covered.names | new.names,
                               covered.phrases | new.phrases)
    return used


def support(source: str, said: Evidence) -> str | None:
    """The source's sentence that holds the most of the answer's evidence (None: none holds any)."""
    scored = [(said.weight(held(s)), -i, s) for i, s in enumerate(sentences(source))]
    best = max(scored, default=None)
    return best[2] if best is not None and best[0] > 0 else None


def verdict(said: Evidence, helds: Sequence[Evidence], used: set[int]) -> Verdict:
    if said.claims:
        found = len(_found(said, helds))
        return Verdict.SUPPORTED if found == len(said.claims) else Verdict.PARTLY if found else Verdict.UNSUPPORTED
    if not said.phrases:
        return Verdict.SUPPORTED if used else Verdict.UNSUPPORTED
    share = len(said.phrases & frozenset().union(*(h.phrases for h in helds))) / len(said.phrases)
    return Verdict.SUPPORTED if share >= SUPPORTED else Verdict.PARTLY if share >= PARTLY else Verdict.UNSUPPORTED


def _segments(answer: str) -> list[tuple[int, int]]:
    """The answer's sentences as spans, a sentence's trailing [n] kept with it ("27 days. [1]")."""
    spans: list[tuple[int, int]] = []
    start = 0
    for m in [*_SENTENCE.finditer(answer), None]:
        end = m.start() if m is not None else len(answer)
        piece = answer[start:end]
        if spans and not MARK.sub("", piece).strip(" .。,，;；"):
            spans[-1] = (spans[-1][0], end)  # marks alone: the sentence before's
        elif piece.strip():
            spans.append((start, end))
        start = m.end() if m is not None else len(answer)
    return spans


def _holds(sentence: Evidence, h: Evidence) -> bool:
    """Whether a source supports a sentence that cites it: one of its figures or names, or
    (without any) one of its phrases; a sentence asserting nothing is not contradicted."""
    if sentence.claims:
        return bool(sentence.figures & h.figures or sentence.names & h.names)
    return not sentence.phrases or bool(sentence.phrases & h.phrases)


def checked_marks(answer: str, helds: Sequence[Evidence], asked: Evidence) -> tuple[str, list[int]]:
    """The answer with each [n] its passage does not support taken out, and those n. A mark
    answers for what its sentence says since the mark before it ("27 days [2], and 5 more
    [2]": the second for the 5); marks side by side ([1][2]) for the same words."""
    out, dropped, pos = [], [], 0
    for start, end in _segments(answer):
        said, since = Evidence(), start
        for m in MARK.finditer(answer, start, end):
            stretch = evidence(answer[since:m.start()]) - asked
            said, since = (stretch if stretch.claims or stretch.phrases else said), m.end()
            ns = [int(x) for x in re.split(r"\s*[,，]\s*", m.group(1))]
            keep = [n for n in ns if 1 <= n <= len(helds) and _holds(said, helds[n - 1])]
            dropped += [n for n in ns if n not in keep]
            lead = m.group(0)[: len(m.group(0)) - len(m.group(0).lstrip())]
            out.append(answer[pos:m.start()] + (f"{lead}[{', '.join(map(str, keep))}]" if keep else ""))
            pos = m.end()
    out.append(answer[pos:])
    return "".join(out), sorted(set(dropped))


def attribute(answer: str, sources: Sequence[str], question: str = "") -> tuple[Attribution, str]:
    """The answer attributed to `sources` (numbered from 1, as the prompt numbered them), and
    its text with the dropped [n] taken out. What the question itself says is no evidence:
    an answer repeats it, and every source found for it holds some of it."""
    asked = evidence(question)
    said = evidence(answer) - asked
    helds = [held(s) for s in sources]
    used = _used(said, helds)
    judged = verdict(said, helds, used)
    if not used and judged is Verdict.SUPPORTED and helds:  # held by phrases spread thin: the best one shows it
        best = max(range(len(helds)), key=lambda i: (said.weight(helds[i]), -i))
        used = {best + 1} if said.weight(helds[best]) > 0 else used
    uses = tuple(Use(n, n in used, support(s, said) if n in used else None) for n, s in enumerate(sources, 1))
    found = _found(said, helds)
    unsupported = tuple(dict.fromkeys(w for k, w in said.written if k not in found))
    text, dropped = checked_marks(answer, helds, asked)
    return Attribution(uses, judged, unsupported, tuple(dropped)), text
