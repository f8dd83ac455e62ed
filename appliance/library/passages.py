"""A document cut into passages a chat can cite: whole paragraphs packed up to ~160 tokens,
never across a page (so each passage has one page to cite), a table cut between its rows
with its header row on top of each passage, and the words a passage is found by (English
words, Chinese as overlapping character pairs)."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace
from html.parser import HTMLParser

from appliance.documents.document import Document

# Han, kana and hangul: written without spaces, so searched by character pairs (as Lucene's
# CJK analyzer does): 会议纪要 -> 会议 议纪 纪要, which a two-character question word matches.
CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_CJK_RUN = re.compile(f"[{CJK}]+")
_WORD = re.compile(f"[{CJK}]+|[^\\W_{CJK}]+", re.UNICODE)  # A4复印纸 -> a4, 复印, 印纸
_PARAGRAPH = re.compile(r"\n\s*\n|\n(?=\s*(?:[-*•]|\d+[.)]) )")
# A code: a word of three capitals or more (AED, VPN) or of letters and digits (A4, B2,
# ISO9001). Not two capitals: the stemmer leaves two letters as they are, and IT, US, OR are
# as often the words it, us, or (on the evaluation set, "let IT know" weighted as a code put
# a passage holding "it" first: fused hit@1 0.84 -> 0.80 for English). Not plain numbers and
# ordinals ("15 days", "3rd floor"): the stemmer keeps them as written.
_CODE = re.compile(r"[A-Z]{3,}|[^\W_\d]+\d[^\W_]*", re.UNICODE)
_SENTENCE = re.compile(r"(?<=[.!?;:])\s+|(?<=[。！？；：])")  # "at 11:00" stays whole

ROW = " | "  # between a table row's cells, as the PDF and DOCX readers write them
TARGET_TOKENS = 160  # a passage's size: the embedding model reads 256 word pieces at most
MOST_TOKENS = 220
MAX_QUERY_TERMS = 64  # a question's words searched, the rest dropped: bounded before it starts
# A question's CJK characters searched one by one, the rest dropped. Each is a prefix query
# over every pair it starts, dearer than a pair: a question's 10 to 15 characters took 8 to
# 10 ms on 2,000 made-up Chinese passages (its pairs 1 to 2 ms), 46 to 103 ms on 20,000 (10
# to 21 ms) on the 2-core development box.
MAX_QUERY_CHARACTERS = 32


def estimate_tokens(text: str) -> int:
    """Word pieces, roughly: a CJK character is one, other text ~4.5 characters one (measured
    on the evaluation set with the embedding model's tokenizer: 4.3 to 4.9 for English)."""
    cjk = sum(len(m) for m in _CJK_RUN.findall(text))
    return cjk + (len(text) - cjk) * 2 // 9 + 1


def terms(text: str, limit: int | None = None) -> list[str]:
    """The words text is searched by: lower-case words, and pairs of CJK characters."""
    out: list[str] = []
    for m in _WORD.finditer(text):
        w = m.group(0)
        if _CJK_RUN.fullmatch(w):
            out.extend([w] if len(w) == 1 else [w[i:i + 2] for i in range(len(w) - 1)])
        else:
            out.append(w.lower())
        if limit is not None and len(out) >= limit:
            return out[:limit]
    return out


def characters(text: str, limit: int | None = None) -> list[str]:
    """The text's CJK characters, each once, in order: searched as the first of a pair
    (library/store.py's `characters`), they find a word the pairs miss, written with one
    character the same and one not (发薪水 and 工资发放 share 发; 薪水 and 薪酬, 薪)."""
    return list(dict.fromkeys(c for run in _CJK_RUN.findall(text) for c in run))[:limit]


def codes(text: str) -> list[str]:
    """The question's codes, as `terms` writes them (lower-case): the words the library matches
    as written as well as by stem, since a stemmer reads AED as a plural-less "a"."""
    out = [w.lower() for w in (m.group(0) for m in _WORD.finditer(text))
           if not _CJK_RUN.fullmatch(w) and _CODE.fullmatch(w)]
    return list(dict.fromkeys(out))


@dataclass(frozen=True, slots=True)
class Passage:
    seq: int  # its place in the document, from 0
    page: int | None  # the PDF page it is on (None: the document has no pages)
    text: str


@dataclass(frozen=True, slots=True)
class _Unit:
    start: int  # where it begins in the text (its page)
    text: str
    table: int | None = None  # a table's row: where its table begins (its header row's start)
    header: str = ""  # a table's row: its table's header row, which each passage of rows begins with


def _units(text: str) -> list[_Unit]:
    """Paragraphs with where they begin, a table's rows one by one; a paragraph too long for a
    passage is cut into sentences, and a sentence still too long into pieces."""
    out: list[_Unit] = []
    pos = 0
    for part in _PARAGRAPH.split(text) + [""]:
        start = text.find(part, pos) if part else pos
        pos = start + len(part)
        for at, segment, rows in _segments(part, start):
            out.extend(rows or _prose(text, at, segment))
    # A row too long for a passage is no data row (a page laid out in a table): cut as text.
    return _continued([piece for u in out for piece in (
        [u] if u.table is None or estimate_tokens(u.text) <= MOST_TOKENS else _prose(text, u.start, u.text))])


def _continued(units: list[_Unit]) -> list[_Unit]:
    """A table right after another's last row (past a page break or a blank line), with as many
    cells and a first row that is not that table's header, is that table going on (a long
    table over pages, its header not repeated): its rows take that table's header."""
    going_on: dict[int, _Unit] = {}  # a table's start: a row of the table it continues
    out: list[_Unit] = []
    for unit in units:
        before = out[-1] if out else None
        if unit.table is not None and unit.table in going_on:
            unit = replace(unit, table=going_on[unit.table].table, header=going_on[unit.table].header)
        elif (unit.table == unit.start and before is not None and before.table is not None
              and unit.text.count(ROW) == before.text.count(ROW) and unit.text != before.header):
            going_on[unit.start] = before
            unit = replace(unit, table=before.table, header=before.header)
        out.append(unit)
    return out


def _segments(part: str, start: int) -> list[tuple[int, str, list[_Unit]]]:
    """The paragraph's runs of text and its tables (two lines or more that part cells by " | ",
    as the readers write a row), in order: (start, text, []) or (start, "", the table's rows)."""
    lines, at = [], start
    for line in part.split("\n"):
        lines.append((at, line, ROW in line))
        at += len(line) + 1
    out: list[tuple[int, str, list[_Unit]]] = []
    for is_row, run in itertools.groupby(lines, key=lambda line: line[2]):
        group = list(run)
        if is_row and len(group) > 1:
            head = group[0]
            out.append((head[0], "", [_Unit(s, line.strip(), head[0], head[1].strip()) for s, line, _ in group]))
        elif out and not out[-1][2]:  # a lone row is text: joined to the text before it
            first, before, _ = out[-1]
            out[-1] = (first, part[first - start:group[-1][0] + len(group[-1][1]) - start], [])
        else:
            out.append((group[0][0], part[group[0][0] - start:group[-1][0] + len(group[-1][1]) - start], []))
    return out


def _prose(text: str, start: int, part: str) -> list[_Unit]:
    """A run of text whole, or cut into sentences (and pieces) when too long for a passage."""
    if not part.strip():
        return []
    if estimate_tokens(part) <= MOST_TOKENS:
        return [_Unit(start, part.strip())]
    out: list[_Unit] = []
    offset = start
    for sentence in _SENTENCE.split(part):
        at = text.find(sentence, offset) if sentence else offset
        offset = at + len(sentence)
        step = MOST_TOKENS * 4 if not _CJK_RUN.search(sentence) else MOST_TOKENS
        for i in range(0, len(sentence), step):
            piece = sentence[i:i + step].strip()
            if piece:
                out.append(_Unit(at + i, piece))
    return out


def split(doc: Document, text: str | None = None) -> list[Passage]:
    """The document's passages in order: paragraphs packed up to TARGET_TOKENS, a new one at
    every page; a table cut between its rows, each passage of its rows led by its header row
    (so "which row" is answerable from any of them)."""
    passages: list[Passage] = []
    body: list[_Unit] = []
    size, page = 0, None

    def flush() -> None:
        nonlocal body, size
        if body:
            passages.append(Passage(len(passages), page, "\n".join(u.text for u in body)))
        body, size = [], 0

    for unit in _units(doc.text if text is None else text):
        at = doc.page_at(unit.start)
        cost = estimate_tokens(unit.text)
        row = unit.table is not None and unit.start != unit.table  # a row below its header
        if body and (at != page or size + cost > TARGET_TOKENS):
            head = body[-1].start == unit.table  # the header alone at the end: it moves on with its rows
            if not (head and len(body) == 1 and at == page):
                if head:
                    body.pop()
                flush()
        if not body:
            page = at
            if row:
                body.append(_Unit(unit.start, unit.header, unit.table))
                size += estimate_tokens(unit.header)
        body.append(unit)
        size += cost
    flush()
    return passages


class _Text(HTMLParser):
    SKIP = frozenset({"script", "style", "head", "template", "noscript"})
    BLOCK = frozenset({"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article",
                       "table", "ul", "ol", "pre", "blockquote"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if tag in self.SKIP:
            self.skipping += 1
        elif tag in self.BLOCK:
            self.out.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self.BLOCK:
            self.out.append("\n\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.out.append(data)


def html_text(html: str) -> str:
    """An HTML page's readable text, paragraphs kept apart (scripts and styles left out)."""
    parser = _Text()
    parser.feed(html)
    parser.close()
    text = "".join(parser.out)
    return re.sub(r"\n\s*\n\s*", "\n\n", re.sub(r"[ \t\r\f\v]+", " ", text)).strip()
