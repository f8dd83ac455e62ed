"""The parsers, run inside the worker: PDF page by page (pypdf; its tables in rows, see
pdf_tables.py), DOCX paragraphs and tables in document order (python-docx; headers, footers,
footnotes and text boxes are left out), and UTF-8 text as it is. Each stops at max_chars and
refuses what it cannot read with a coded error."""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator

import docx
from docx.table import Table
from docx.text.paragraph import Paragraph
from pypdf import PdfReader
from pypdf.errors import DependencyError, FileNotDecryptedError, LimitReachedError

from appliance.documents.document import Document, DocumentLimits
from appliance.documents.failures import failure
from appliance.documents.kinds import Kind
from appliance.documents.pdf_tables import read_page
from appliance.documents.zipguard import check_docx
from appliance.errors import ApplianceError


class TextSink:
    """Text gathered piece by piece up to max_chars; a piece that does not fit is cut."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.parts: list[str] = []
        self.size = 0
        self.truncated = False
        self.marks: list[int] = []  # where each marked piece (a PDF's page) begins in the text

    def add(self, piece: str, sep: str = "\n", mark: bool = False) -> bool:
        """Append `piece` (after `sep` unless first); False once full, so the reader stops.
        mark: note where it begins (a PDF's pages, which the library cites)."""
        if self.parts:
            piece = sep + piece
        if mark and self.size < self.max_chars:
            self.marks.append(self.size + (len(sep) if self.parts else 0))
        room = self.max_chars - self.size
        if len(piece) > room:
            piece, self.truncated = piece[:room], True
        if piece:
            self.parts.append(piece)
            self.size += len(piece)
        return not self.truncated

    def text(self) -> str:
        return "".join(self.parts)


def extract(kind: Kind, data: bytes, limits: DocumentLimits) -> Document:
    read = {Kind.PDF: read_pdf, Kind.DOCX: read_docx, Kind.TEXT: read_text}[kind]
    return read(data, limits)


def read_text(data: bytes, limits: DocumentLimits) -> Document:
    """UTF-8 with or without a BOM; a NUL byte or invalid UTF-8 means binary, not text."""
    nul = data.find(b"\x00")
    if nul >= 0:
        raise failure("invalid_text", f"the file holds a NUL byte at offset {nul:,}: it is binary, not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise failure("invalid_text", f"the file is not UTF-8 text (invalid byte at offset {e.start:,}): "
                                      "save it as UTF-8") from None
    if not text.strip():
        raise failure("no_text_found", "the text file holds only white space")
    sink = TextSink(limits.max_chars)
    if "\f" not in text:
        sink.add(text)
        return _done(Kind.TEXT, sink, None)
    # Form feeds part pages, as pdftotext writes them: the library cites such a text's pages.
    starts: list[int] = []
    pages = text.removesuffix("\n").removesuffix("\f").split("\f")  # pdftotext ends with one: no page after it
    for number, page in enumerate(pages, 1):
        if page.strip():
            starts.append(number)
            if not sink.add(page.strip("\n"), "\n\n", mark=True):
                break
    return _done(Kind.TEXT, sink, len(pages), list(zip(starts, sink.marks)))


def read_pdf(data: bytes, limits: DocumentLimits) -> Document:
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)  # tries the empty user password itself
        count = len(reader.pages)
        if count > limits.max_pages:
            raise failure("too_many_pages", f"the PDF has {count:,} pages; at most {limits.max_pages:,} are read")
        sink = TextSink(limits.max_chars)
        starts: list[int] = []  # the page number of each marked start
        for number in range(count):
            text = clean(read_page(reader.pages[number])).strip()  # cleaned before its start is noted
            if text:
                starts.append(number + 1)
                if not sink.add(text, "\n\n", mark=True):
                    break
    except (FileNotDecryptedError, DependencyError):
        raise failure("encrypted_pdf", "the PDF is encrypted (it needs a password, or a cipher this reader lacks): "
                                       "send an unprotected copy") from None
    except LimitReachedError as e:
        raise limit_failure(e) from None
    except (MemoryError, ApplianceError):
        raise
    except Exception as e:
        raise failure("broken_pdf", f"the PDF cannot be read: {type(e).__name__}: {e}"[:300]) from None
    if not sink.parts:
        pages = f"{count:,} page" + ("s" if count != 1 else "")
        raise failure("no_text_found", f"the PDF ({pages}) has no text layer: "
                                       "it may be a scan (text in images is not read)")
    return _done(Kind.PDF, sink, count, list(zip(starts, sink.marks)))


# pypdf raises one LimitReachedError for all its limits. Only those on what a stream inflates
# to are a zip bomb; the rest bound the structure: tokens per content stream (2,000,000, which
# a page of a million drawn characters reaches), array and dictionary entries, page and
# outline trees, font tables. Their messages are pypdf's (pinned in pyproject.toml).
INFLATE_LIMITS = ("decompressing", "decoding work")


def limit_failure(e: LimitReachedError) -> ApplianceError:
    if any(words in str(e).lower() for words in INFLATE_LIMITS):
        return failure("zip_bomb", f"a compressed stream in the PDF expands beyond the reader's limit ({e})")
    return failure("pdf_too_complex", f"the PDF is built past a limit of the reader ({e}): a page drawn "
                                      "with millions of operations, or a damaged or hostile file; "
                                      "print it to a new PDF and send that")


def read_docx(data: bytes, limits: DocumentLimits) -> Document:
    check_docx(data, limits)
    try:
        document = docx.Document(io.BytesIO(data))
        sink = TextSink(limits.max_chars)
        for block in _blocks(document.iter_inner_content()):
            if not sink.add(block):
                break
    except (MemoryError, ApplianceError):
        raise
    except Exception as e:
        raise failure("broken_docx", f"the DOCX document cannot be read: {type(e).__name__}: {e}"[:300]) from None
    if not sink.text().strip():
        raise failure("no_text_found", "the DOCX document holds no text in its paragraphs or tables")
    return _done(Kind.DOCX, sink, None)


def _blocks(content: Iterable[Paragraph | Table]) -> Iterator[str]:
    """Paragraph texts and table rows in document order; runs of empty paragraphs kept as one."""
    blank = True
    for item in content:
        lines = [item.text] if isinstance(item, Paragraph) else _table_rows(item)
        for line in lines:
            if line.strip() or not blank:
                yield line
            blank = not line.strip()


def _table_rows(table: Table) -> list[str]:
    """One line per row, cells joined by " | "; a cell merged across columns (repeated by
    python-docx) once, one merged down rows on each (each row reads alone); a cell's own
    paragraphs, line breaks and nested tables flattened onto its row."""
    rows = []
    for row in table.rows:
        cells: list[str] = []
        seen: set[int] = set()
        for cell in row.cells:
            if id(cell._tc) in seen:
                continue
            seen.add(id(cell._tc))
            # A line break within a cell's paragraph (Shift+Enter) would cut the row's line.
            cells.append(" ".join(" ".join(line.split()) for line in _blocks(cell.iter_inner_content()) if line.strip()))
        rows.append(" | ".join(cells))
    return rows


def clean(text: str) -> str:
    """A PDF's broken ToUnicode map can yield NULs and lone surrogates, which no tokenizer or
    JSON encoder takes: drop the one, replace the other (U+FFFD); surrogate pairs are joined."""
    return text.replace("\x00", "").encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _done(kind: Kind, sink: TextSink, pages: int | None, page_starts: list[tuple[int, int]] | None = None) -> Document:
    # A PDF's pages are cleaned one by one as they are read (their starts stay true); this
    # catches what other readers gave.
    text = clean(sink.text())
    return Document(kind.value, text, pages, len(text), sink.truncated, page_starts)
