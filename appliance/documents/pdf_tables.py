"""Tables on a PDF page, found by where its text stands, and written back one row a line.

pypdf's plain extraction follows the content stream: a table's cells come out one a line, or
glued ("5 days25 days"), as the writer ordered them, so a row is no longer a row. Here the page
is read a second time for positions (pypdf's layout-mode reading, pinned in pyproject.toml):
a line whose text stands apart in two or more cells, and lines below it whose cells fall in
the same columns, are a table. The plain text keeps everything else as it reads today; only
the lines that hold a table's cells and nothing else are replaced by its rows, "cell | cell".
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from pypdf import PageObject
from pypdf._text_extraction import _layout_mode
from pypdf.generic import ContentStream, NameObject

CELL_GAP = 0.6  # ems between two pieces of one line that part cells (a justified space is ~0.3-0.5)
PROSE_CELL = 40  # characters: columns whose cells are all this long are a two-column page, not a table
ALIGN = 0.5  # ems within which two cells of a column line up (left, right or centred)
_MARKER = re.compile(r"[•◦▪▫●○■□‣⁃∙·*–—-]|\(?[0-9A-Za-z]{1,2}[.)]|\d+(?:\.\d+)*\.?")  # a list's
_CJK = re.compile("[\u1100-\u115f\u2e80-\ua4cf\uac00-\ud7a3\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef]")
_RUN = re.compile(r"\S+(?: \S+)*")  # a piece of a text object: words parted by single spaces
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class Piece:
    x0: float
    x1: float
    text: str
    size: float  # the font's height: an em


@dataclass(slots=True)
class Column:
    x0: float  # as far as its cells reach
    x1: float
    edges: list[tuple[float, float]] = field(default_factory=list)  # each of its cells' left and right

    def aligned(self, cell: Piece) -> bool:
        """The cell lines up with one above it: on the left, the right or the centre (words
        that only happen to stand apart in two lines of justified text do not)."""
        tol = ALIGN * cell.size
        return not self.edges or any(abs(cell.x0 - x0) <= tol or abs(cell.x1 - x1) <= tol
                                     or abs(cell.x0 + cell.x1 - x0 - x1) <= 2 * tol for x0, x1 in self.edges)


@dataclass(slots=True)
class Table:
    columns: list[Column]
    rows: list[dict[int, str]] = field(default_factory=list)  # each row's cell texts by id(column)
    cells: list[Piece] = field(default_factory=list)  # every piece of text the table holds

    def add(self, row: list[Piece], at: list[Column], new_row: bool) -> None:
        if new_row:
            self.rows.append({})
        cells = self.rows[-1]
        for cell, column in zip(row, at, strict=True):
            if not any(c is column for c in self.columns):
                self.columns.append(column)  # a header over an empty corner, a first filled cell
            cells[id(column)] = f"{cells.get(id(column), '')} {cell.text}".strip()  # a wrapped cell joins
            column.x0, column.x1 = min(column.x0, cell.x0), max(column.x1, cell.x1)
            column.edges.append((cell.x0, cell.x1))
            self.cells.append(cell)

    @property
    def monospaced(self) -> bool:
        """Every piece's characters equally wide (CJK aside, which is so in any font)."""
        per = [(p.x1 - p.x0) / len(p.text) for p in self.cells if len(p.text) >= 3 and not _CJK.search(p.text)]
        return len(per) >= 4 and max(per) <= 1.03 * min(per)

    def lines(self) -> list[str]:
        order = sorted(self.columns, key=lambda c: c.x0)
        return [" | ".join(row.get(id(c), "") for c in order) for row in self.rows]

    @property
    def kept(self) -> bool:
        """A header and two rows at least (two lines of justified text can happen to stand in
        columns), and not text that stands in columns without being a table: code set in a
        fixed-width font (its characters line up by the grid), two columns of running text (a
        newsletter's page), a list (a column of bullets or numbers before its items), or terms
        and their definitions ("name: the name of ...")."""
        if len(self.rows) < 3 or self.monospaced:
            return False
        order = sorted(self.columns, key=lambda c: c.x0)
        texts = [[row.get(id(c), "") for row in self.rows] for c in order]
        if all(statistics.median(len(t) for t in column) > PROSE_CELL for column in texts):
            return False
        return len(order) > 2 or not all(_MARKER.fullmatch(t) or t.endswith(":") for t in texts[0] if t)


def read_page(page: PageObject) -> str:
    """The page's text as pypdf's plain extraction gives it, its tables in rows."""
    raw = page.get("/Contents")
    try:
        stream = ContentStream(raw.get_object(), page.pdf, "bytes") if raw is not None else None
    except Exception:  # as plain extraction alone would take it (it may read nothing, or refuse)
        stream = None
    if stream is None:
        return page.extract_text()
    # Parsing the content stream is ~3/4 of a plain extraction (0.27 of 0.36 s of CPU for 20
    # pages of tables): parsed once here, pypdf's extraction takes the parsed stream it finds
    # under /Contents as it is, and the positions are read from the same operations. Put back
    # after, so that a long document does not keep every page's operations.
    page[NameObject("/Contents")] = stream
    try:
        plain = page.extract_text()
    finally:
        page[NameObject("/Contents")] = raw
    if plain.strip().count("\n") < 1:  # no two lines, no table: and a page without text is not parsed
        return plain
    try:
        return page_text(page, plain, stream)
    except MemoryError:
        raise
    except Exception:  # finding tables is a refinement: a page that reads never fails for it
        return plain


def page_text(page: PageObject, plain: str, stream: ContentStream) -> str:
    """`plain` (the page's plain extraction) with each table found on the page in rows."""
    lines = plain.split("\n")
    done = 0  # lines up to here are settled: the next table is looked for after them
    for table in tables(positioned_lines(page, stream)):
        found = _locate(lines, done, [c.text for c in table.cells])
        if found is not None:
            start, end = found
            lines[start:end] = table.lines()
            done = start + len(table.rows)
    return "\n".join(lines)


def positioned_lines(page: PageObject, stream: ContentStream) -> list[list[Piece]]:
    """The page's lines top to bottom, each its pieces left to right: a text object's text cut
    where it holds two spaces or more (a writer that places cells within one text object)."""
    groups = _layout_mode.text_show_operations(iter(stream.operations), page._layout_mode_fonts(), True, None)
    if not groups:
        return []
    return [[p for g in line for p in _pieces(g)] for line in _layout_mode.y_coordinate_groups(groups).values()]


def _pieces(group: Any) -> list[Piece]:
    text, x0, x1, size = group["text"], group["tx"], group["displaced_tx"], group["font_height"]
    per = (x1 - x0) / max(len(text), 1)  # where a piece within the text object starts, pro rata
    return [Piece(x0 + m.start() * per, x0 + m.end() * per, m.group(), size) for m in _RUN.finditer(text)]


def cells(line: list[Piece]) -> list[Piece]:
    """The line's pieces joined where they stand closer than CELL_GAP ems."""
    out: list[Piece] = []
    for p in sorted(line, key=lambda p: p.x0):
        last = out[-1] if out else None
        if last is not None and p.x0 - last.x1 < CELL_GAP * max(last.size, p.size):
            out[-1] = Piece(last.x0, max(last.x1, p.x1), f"{last.text} {p.text}", max(last.size, p.size))
        else:
            out.append(p)
    return out


def tables(lines: list[list[Piece]]) -> list[Table]:
    """Runs of lines whose cells fall in the same columns, two rows of two cells at least; a
    line of one cell inside a column, between two rows, continues the row above (a wrapped cell)."""
    found: list[Table] = []
    table: Table | None = None
    held: list[tuple[list[Piece], list[Column]]] = []  # one-cell lines: a wrapped cell, or text below
    for line in lines:
        row = cells(line)
        at = _columns(table, row) if table is not None else None
        if table is not None and at is not None:
            if len(row) == 1:
                held.append((row, at))
                continue
            for wrapped, where in held:
                table.add(wrapped, where, new_row=False)
            table.add(row, at, new_row=True)
        else:
            if table is not None and table.kept:
                found.append(table)
            table = Table([]) if len(row) > 1 else None
            if table is not None:
                table.add(row, [Column(c.x0, c.x1) for c in row], new_row=True)
        held = []
    if table is not None and table.kept:
        found.append(table)
    return found


def _columns(table: Table, row: list[Piece]) -> list[Column] | None:
    """The column of each cell of `row`, left to right, each its own; None: the row does not
    fit the table (a cell across two columns, two in one, or one cell outside them all).
    A cell between columns or beyond the last opens a new one (a header over an empty corner)."""
    at: list[Column] = []
    for cell in row:
        hits = [c for c in table.columns if cell.x0 <= c.x1 and cell.x1 >= c.x0]
        if len(hits) > 1 or (len(row) == 1 and not hits):
            return None
        column = hits[0] if hits else Column(cell.x0, cell.x1)
        if not column.aligned(cell):
            return None
        if at and column.x0 <= at[-1].x0:
            return None
        at.append(column)
    return at


def _locate(lines: list[str], start: int, pieces: list[str]) -> tuple[int, int] | None:
    """The run of `lines` (from `start`) that holds exactly the table's pieces and nothing
    else, in whatever order the plain extraction put them; None: it is not found whole."""
    vocabulary = sorted({_SPACE.sub("", p) for p in pieces if p.strip()}, key=len, reverse=True)
    want = sum(len(_SPACE.sub("", p)) for p in pieces)
    i = start
    while i < len(lines):
        j = i
        while j < len(lines) and _only_pieces(lines[j], vocabulary):
            j += 1
        sizes = [len(_SPACE.sub("", line)) for line in lines[i:j]]
        for first in range(len(sizes)):  # a heading that is also a cell's text may stand first
            if sum(sizes[first:]) == want:
                return i + first, j
        i = j + 1
    return None


def _only_pieces(line: str, vocabulary: list[str]) -> bool:
    rest = _SPACE.sub("", line)
    if not rest:
        return False
    for word in vocabulary:
        rest = rest.replace(word, "")
    return not rest
