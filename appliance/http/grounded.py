"""A library chat's answer checked against its sources (library/attribute.py), for every chat
API the same way: the server's own answer when nothing in the library was close enough to
ask the model (library/grounding.py; no slot spent), a note at the end of an answer whose
figures and names are in no source, or come from passages about something other than the
question (library/about.py), or whose question names a thing no document mentions
(Library.unmentioned): its verdict is then unsupported; after an answer that does not stand,
the sentence of its sources closest to the question, quoted (library/closest.py); and what the answer's last
chunk (a whole answer's body) carries: the sources again, each with `used` and `support`,
and `grounding`.
The pipeline calls it per choice (pipeline.Review); the shapes put `wire(i)` on the wire."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from appliance.library import about
from appliance.library.attribute import Attribution, Verdict, attribute
from appliance.library.closest import Closest, closest, shown
from appliance.library.grounding import closest_note, not_in_library, unmentioned_note, unsupported_note


class Check:
    """One library chat: its question, the sources its prompt numbered, and each choice's
    answer attributed to them once it is written."""

    def __init__(self, question: str, sources: list[dict[str, Any]], close: bool = True, also: str = "",
                 unknown: list[str] | None = None) -> None:
        self.question, self.sources, self.also = question, sources, also  # also: its translation, if searched
        # The things the question names that no document mentions (Library.unmentioned): an
        # answer is then of something else, whatever its sources hold.
        self.unknown = unknown or []
        # Nothing close enough: the server answers, in the question's language.
        self.answer = None if close else not_in_library(question)
        self._got: dict[int, tuple[Attribution, str, str]] = {}  # choice: (attribution, answer, without dropped [n])
        self._astray: dict[int, about.Astray] = {}  # choice: its figures' passages not about the question
        self._quoted: dict[int, Closest] = {}  # choice: the sentence quoted after it (library/closest.py)

    def _attribute(self, i: int, text: str) -> Attribution:
        texts = [s["text"] for s in self.sources]
        got, cleaned = attribute(text, texts, self.question)
        off = about.astray(self.question, text, texts, [s.get("title") or "" for s in self.sources], self.also)
        if off:  # its figures are in a source, said there of something else: the library does not say
            got = replace(got, verdict=Verdict.UNSUPPORTED)
            self._astray[i] = off
        if self.unknown and self.sources:  # asked of what no document mentions: the library does not say
            got = replace(got, verdict=Verdict.UNSUPPORTED)
        self._got[i] = (got, text, cleaned)
        return got

    def note(self, i: int, text: str) -> str:
        """Choice i's answer is written whole: what its end gets ("" nothing). An answer with
        no source to check (none fitted) is not the library's to judge."""
        if self.answer is not None:
            return ""
        got = self._attribute(i, text)
        if not self.sources:
            return ""
        if i in self._astray:  # the more telling: which figure, from a passage about what
            said = about.note(self.question, self._astray[i])
        else:
            said = unmentioned_note(self.question, self.unknown) if self.unknown else unsupported_note(self.question, got)
        return said + self._closest(i, got)

    def _closest(self, i: int, got: Attribution) -> str:
        """An answer that does not stand (unsupported, or from no source) gets the sentence of
        its sources closest to the question, quoted, from a source it did not use (those are
        shown with their own sentence already; after an answer astray, they are what the note
        has just said is about something else): unless the question names what no document
        mentions (any sentence would be of something else)."""
        if self.unknown or (got.verdict is not Verdict.UNSUPPORTED and any(u.used for u in got.uses)):
            return ""
        used = frozenset(u.n for u in got.uses if u.used)
        near = closest([self.question, self.also], [s["text"] for s in self.sources], skip=used)
        if near is None:
            return ""
        self._quoted[i] = near
        source = self.sources[near.n - 1]
        return closest_note(self.question, near.n, source.get("title") or "", source.get("page"), shown(near.sentence))

    def clean(self, i: int, text: str) -> str:
        """A whole answer's text as sent: the [n] its passage does not support taken out (the
        note after it has none)."""
        got = self._got.get(i)
        if got is None or not text.startswith(got[1]):
            return text
        return got[2] + text[len(got[1]):]

    def wire(self, i: int) -> dict[str, Any]:
        """What choice i's last chunk carries: the sources, each `used` (by the answer) and its
        `support`, and `quoted` (by the server after it: its support is the sentence quoted),
        and `grounding` (its verdict, the figures and names in no source, the [n] dropped)."""
        if self.answer is not None:
            return {"sources": [], "grounding": {"verdict": Verdict.NOT_IN_LIBRARY.value, "unsupported": [],
                                                 "dropped": [], "unmentioned": []}}
        got = self._got[i][0] if i in self._got else self._attribute(i, "")
        q = self._quoted.get(i)
        sources = [{**s, "used": u.used, "support": q.sentence if q is not None and q.n == u.n else u.support,
                    "quoted": q is not None and q.n == u.n} for s, u in zip(self.sources, got.uses)]
        return {"sources": sources, "grounding": {"verdict": got.verdict.value, "unsupported": list(got.unsupported),
                                                  "dropped": list(got.dropped), "unmentioned": list(self.unknown)}}
