"""A document cut into passages a chat can cite: whole paragraphs packed up to ~160 tokens,
never across a page (so each passage has one page to cite), and the words a passage is found
by (English words, Chinese as overlapping character pairs)."""

from __future__ import annotations

import re
from dataclasses import dataclass
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

TARGET_TOKENS = 160  # a passage's size: the embedding model reads 256 word pieces at most
MOST_TOKENS = 220
MAX_QUERY_TERMS = 64  # a question's words searched, the rest dropped: bounded before it starts


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


def _units(text: str) -> list[tuple[int, str]]:
    """Paragraphs with where they begin; one too long for a passage is cut into sentences,
    and a sentence still too long into pieces."""
    out: list[tuple[int, str]] = []
    pos = 0
    for part in _PARAGRAPH.split(text) + [""]:
        start = text.find(part, pos) if part else pos
        pos = start + len(part)
        if not part.strip():
            continue
        if estimate_tokens(part) <= MOST_TOKENS:
            out.append((start, part.strip()))
            continue
        offset = start
        for sentence in _SENTENCE.split(part):
            at = text.find(sentence, offset) if sentence else offset
            offset = at + len(sentence)
            step = MOST_TOKENS * 4 if not _CJK_RUN.search(sentence) else MOST_TOKENS
            for i in range(0, len(sentence), step):
                piece = sentence[i:i + step].strip()
                if piece:
                    out.append((at + i, piece))
    return out


def split(doc: Document, text: str | None = None) -> list[Passage]:
    """The document's passages in order: paragraphs packed up to TARGET_TOKENS, a new one at
    every page."""
    passages: list[Passage] = []
    body: list[str] = []
    size, page = 0, None

    def flush() -> None:
        nonlocal body, size
        if body:
            passages.append(Passage(len(passages), page, "\n".join(body)))
        body, size = [], 0

    for start, unit in _units(doc.text if text is None else text):
        at = doc.page_at(start)
        cost = estimate_tokens(unit)
        if body and (at != page or size + cost > TARGET_TOKENS):
            flush()
        if not body:
            page = at
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
