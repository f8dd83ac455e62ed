"""Which language a text is in, as far as the library's search needs to know: Chinese or
English, by its share of CJK characters; each document's, kept in memory; and the language a
question should also be searched in. Words match only words of their own language and the
embedding model reads English only, so a Chinese question finds no English passage unless
the chat model puts it into English (http/translate.py), and the other way round; and whether
the translated search should come first: when the question names what only the other
language's documents hold (`leads`)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from enum import Enum

from appliance.library.passages import CJK
from appliance.library.store import DocRow

_CJK_CHAR = re.compile(f"[{CJK}]")
_LETTER = re.compile(f"[^\\W\\d_{CJK}]")
# A text is Chinese from this share of its letters (CJK characters and Latin letters) on:
# "AED 在哪里" is 0.57, "请问 Microsoft Teams 会议怎么预约" 0.36; an English line naming a
# person, "Ask 张伟 for the keys", 0.13. A Latin word has ~5 letters where a Chinese one has 1-2.
CHINESE_FROM = 0.25
SAMPLE = 8  # a document's first passages read for its language
# A name as a question writes it: in English a capitalised word or a code (Qinghe, London,
# VPN) that does not start a sentence; in Chinese any word in Latin letters (Owen Blake).
_LATIN_WORD = re.compile(r"[^\W\d_" + CJK + r"]{2,}")
_STARTS = re.compile(r"(?:^|[.!?;:。！？；：]\s*)$")
MOST_KNOWN = 4096  # documents whose language is kept; beyond it the memory starts over


class Lang(Enum):
    EN = "en"
    ZH = "zh"

    @property
    def other(self) -> Lang:
        return Lang.ZH if self is Lang.EN else Lang.EN


def cjk_share(text: str) -> float:
    """CJK characters among the text's letters (0.0 without letters)."""
    cjk, letters = len(_CJK_CHAR.findall(text)), len(_LETTER.findall(text))
    return cjk / (cjk + letters) if cjk + letters else 0.0


def language(text: str) -> Lang | None:
    """The text's language (None: no letters to tell by)."""
    if not _CJK_CHAR.search(text) and not _LETTER.search(text):
        return None
    return Lang.ZH if cjk_share(text) >= CHINESE_FROM else Lang.EN


class Languages:
    """Each document's language, read once from its first passages (`sample`) and kept in
    memory by the document's id, passages and characters (a replaced document has the same
    id): nothing stored changes, and a restart reads each again when first asked."""

    def __init__(self, sample: Callable[[DocRow], list[str]]) -> None:
        self._sample = sample
        self._known: dict[tuple[str, int, int], Lang | None] = {}
        self._lock = threading.Lock()  # searches read it from worker threads

    def of(self, row: DocRow) -> Lang | None:
        key = (row.id, row.passages, row.chars)
        with self._lock:
            if key in self._known:
                return self._known[key]
        lang = language("\n".join(self._sample(row)))
        with self._lock:
            if len(self._known) >= MOST_KNOWN:
                self._known.clear()
            self._known[key] = lang
        return lang

    def holds(self, docs: Iterable[DocRow], lang: Lang) -> bool:
        """Whether any of the documents is in `lang` (read until the first that is)."""
        return any(self.of(row) is lang for row in docs)


def crossing(question: str, holds: Callable[[Lang], bool]) -> Lang | None:
    """The language to search the question in as well: the other one than the question's,
    when the documents searched hold some in it (None: the question's own is enough)."""
    asked = language(question)
    if asked is None:
        return None
    return asked.other if holds(asked.other) else None


def names(text: str) -> list[str]:
    """The names the text writes in Latin letters (lower-case, each once): in Chinese every
    Latin word; in English the capitalised ones but a sentence's first word and "I"."""
    lang, out = language(text), []
    for m in _LATIN_WORD.finditer(text):
        word = m.group(0)
        if lang is Lang.ZH or (word[0].isupper() and word != "I" and not _STARTS.search(text[:m.start()])):
            out.append(word.lower())
    return list(dict.fromkeys(out))


def leads(question: str, translated: str, held: Callable[[str], dict[Lang, bool]]) -> bool:
    """Whether the translated search should lead the question's own: a name the question
    writes that no document in its language holds (Qinghe in English asked of 青禾's Chinese
    papers), or one its translation writes that only the other language's hold, as a name
    (London, when a Chinese question's 伦敦 is in no Chinese document). A name is what tells one
    office's, city's or person's papers from another's; a question's other words are in both
    languages' documents alike. `held`: the languages of the documents holding a word, each
    with whether they write it as a name (capitalised mostly): the model capitalises words
    that are none ("Where do the Spring Team meet?"), which the documents write "team"."""
    asked = language(question)
    if asked is None:
        return False
    if any(asked not in held(name) for name in names(question)):
        return True
    mine = set(names(question))
    for name in names(translated):
        where = held(name) if name not in mine else {}
        if asked not in where and where.get(asked.other, False):
            return True
    return False


def written_as_name(word: str, texts: Iterable[str]) -> bool:
    """Whether the texts write the word (and words it starts) capitalised in most places."""
    found = [m.group(0) for text in texts for m in re.finditer(rf"\b{re.escape(word)}\w*", text, re.IGNORECASE)]
    return sum(w[0].isupper() for w in found) * 2 > len(found)
