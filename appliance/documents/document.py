"""What crosses between the server and the extraction worker: the limits a read runs under,
and the document's text it gives back."""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, fields
from typing import Any

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class DocumentLimits:
    """Bounds on one extraction. The worker's rlimits come from cpu_s and memory; the parent
    kills it at wall_s. A 3,000-token PDF or DOCX takes ~0.25 s (see reader.py)."""

    max_bytes: int = 20 * MiB  # the upload itself (413 above)
    cpu_s: int = 5  # RLIMIT_CPU of the worker, whole seconds (its start and imports included: ~0.15 s)
    memory: int = 512 * MiB  # RLIMIT_AS of the worker (Python with pypdf and python-docx imported: ~52 MiB)
    wall_s: float = 10.0  # the parent kills the worker after this (waiting for a worker not counted);
    # above cpu_s, as the worker may get only part of a core beside the engine
    max_pages: int = 2000  # a PDF with more is refused before any page is read
    max_chars: int = 200_000  # text beyond this is cut (truncated: true); ~50k tokens, 12x a 4,096 context
    max_unzipped: int = 128 * MiB  # a DOCX's declared uncompressed total (zip bomb above)
    nice: int = 0  # the worker's niceness: the library's reads (not awaited by a person) yield to the chats

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> DocumentLimits:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})


@dataclass(frozen=True, slots=True)
class Document:
    """A document's text. pages: the PDF's page count (None for DOCX and text, which have none
    until rendered); chars: len(text); truncated: text was cut at max_chars."""

    kind: str  # "pdf", "docx" or "text"
    text: str
    pages: int | None
    chars: int
    truncated: bool
    # A PDF's pages with text: (page number, where its text begins in `text`), for citations.
    page_starts: list[tuple[int, int]] | None = None

    def page_at(self, offset: int) -> int | None:
        """The page number the character at `offset` is on (None: the document has no pages)."""
        starts = self.page_starts or []
        i = bisect.bisect_right(starts, offset, key=lambda s: s[1])  # a search: 2,000 pages x every paragraph
        return starts[i - 1][0] if i else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Document:
        text = raw["text"]
        pages = raw["pages"]
        if not isinstance(text, str) or not (pages is None or isinstance(pages, int)):
            raise ValueError("malformed document from the worker")
        starts = raw.get("page_starts")
        marks = [(int(n), int(o)) for n, o in starts] if isinstance(starts, list) else None
        return cls(str(raw["kind"]), text, pages, len(text), bool(raw["truncated"]), marks)
