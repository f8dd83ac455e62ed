"""Tables on a PDF page, found by where its text stands, and written back one row a line.

pypdf's plain extraction follows the content stream: a table's cells come out one a line, or
glued ("5 days25 days"), as the writer ordered them, so a row is no longer a row. Here the page
is read a second time for positions (pypdf's layout-mode reading, pinned in pyproject.toml):
a line whose text stands apart in two or more cells, and lines below it whose cells fall in
the same columns, are a table. The plain text keeps everything else as it reads today; only
the lines that hold a table's cells and nothing else are replaced by its rows, "cell | cell".
"""

from __future__ import annotations

import itertools
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from pypdf import PageObject
from pypdf._text_extraction import _layout_mode
from pypdf.generic import ContentStream, NameObject

CELL_GAP = 0.6  # ems between two pieces of one line that part cells (a justified space is ~0.3-0.5)
PROSE_CELL = 40  # characters: columns whose cells are all this long are a two-column page, not a table
WRAP = 0.15  # ems by which rows stand further apart than a wrapped cell's lines, at the least
LINE = 1.4  # ems from one line of a cell to the next, at the most
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
    columns: list[Column] = field(default_factory=list)
    lines: list[tuple[float, list[Piece], list[Column]]] = field(default_factory=list)  # y, cells, their columns
    cells: list[Piece] = field(default_factory=list)  # every piece of text the table holds

    def add(self, y: float, row: list[Piece], at: list[Column]) -> None:
        for cell, column in zip(row, at, strict=True):
            if not any(c is column for c in self.columns):
                self.columns.append(column)  # a header over an empty corner, a first filled cell
            column.x0, column.x1 = min(column.x0, cell.x0), max(column.x1, cell.x1)
            column.edges.append((cell.x0, cell.x1))
            self.cells.append(cell)
        self.lines.append((y, row, at))

    def rows(self) -> list[dict[int, str]]:
        """Each row's cell texts by id(column). A line joins the row above (its cells wrapped)
        when it holds one cell, or when it leaves a column empty and stands closer to the line
        above than rows stand apart (a cell's lines are set closer than rows with padding)."""
        size = statistics.median(c.size for c in self.cells)
        pitches = [0.0] + [a[0] - b[0] for a, b in itertools.pairwise(self.lines)]
        tight = min(pitches[1:], default=0.0)
        apart = max(pitches, default=0.0) - tight > WRAP * size and tight <= LINE * size
        rows: list[dict[int, str]] = []
        for (_, row, at), pitch in zip(self.lines, pitches, strict=True):
            wrapped = len(row) == 1 or (apart and pitch <= tight + WRAP * size and len(row) < len(self.columns))
            if not rows or not wrapped:
                rows.append({})
            for cell, column in zip(row, at, strict=True):
                rows[-1][id(column)] = f"{rows[-1].get(id(column), '')} {cell.text}".strip()
        return rows

    @property
    def monospaced(self) -> bool:
        """Every piece's characters equally wide (CJK aside, which is so in any font)."""
        per = [(p.x1 - p.x0) / len(p.text) for p in self.cells if len(p.text) >= 3 and not _CJK.search(p.text)]
        return len(per) >= 4 and max(per) <= 1.03 * min(per)

    def text(self) -> list[str]:
        order = sorted(self.columns, key=lambda c: c.x0)
        return [" | ".join(row.get(id(c), "") for c in order) for row in self.rows()]

    @property
    def kept(self) -> bool:
        """A header and two rows at least (two lines of justified text can happen to stand in
        columns), and not text that stands in columns without being a table: code set in a
        fixed-width font (its characters line up by the grid), two columns of running text (a
        newsletter's page), a list (a column of bullets or numbers before its items), or terms
        and their definitions ("name: the name of ...")."""
        rows = self.rows()
        if len(rows) < 3 or self.monospaced:
            return False
        order = sorted(self.columns, key=lambda c: c.x0)
        texts = [[row.get(id(c), "") for row in rows] for c in order]
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
    # Parsing the content stream is ~3/4 of a plain extraction: parsed once here, pypdf's
    # extraction takes the parsed stream it finds under /Contents as it is, and the positions
    # are read from the same operations (put back after: a long document does not keep every
    # page's operations). Measured, CPU on one core: 20 pages of 25-row tables 0.27 s plain,
    # 0.39 s with tables (0.49 s parsing twice); a 36-page LaTeX manual 0.82 s and 1.60 s.
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
            rows = table.text()
            lines[start:end] = rows
            done = start + len(rows)
    return "\n".join(lines)


def positioned_lines(page: PageObject, stream: ContentStream) -> list[tuple[float, list[Piece]]]:
    """The page's lines top to bottom, each its height and its pieces: a text object's text cut
    where it holds two spaces or more (a writer that places cells within one text object)."""
    groups = _layout_mode.text_show_operations(iter(stream.operations), page._layout_mode_fonts(), True, None)
    if not groups:
        return []
    lines = _layout_mode.y_coordinate_groups(groups).items()
    return [(float(y), [p for g in line for p in _pieces(g)]) for y, line in lines]


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


def tables(lines: list[tuple[float, list[Piece]]]) -> list[Table]:
    """Runs of lines whose cells fall in the same columns, the first of two cells or more; a
    line of one cell inside a column, between two rows, continues the row above (a wrapped cell)."""
    found: list[Table] = []
    table: Table | None = None
    held: list[tuple[float, list[Piece], list[Column]]] = []  # one-cell lines: a wrapped cell, or text below
    for y, line in lines:
        row = cells(line)
        at = _columns(table, row) if table is not None else None
        if table is not None and at is not None:
            if len(row) == 1:
                held.append((y, row, at))
                continue
            for wrapped in held:
                table.add(*wrapped)
            table.add(y, row, at)
        else:
            if table is not None and table.kept:
                found.append(table)
            table = Table() if len(row) > 1 else None
            if table is not None:
                table.add(y, row, [Column(c.x0, c.x1) for c in row])
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
        # A heading above or a line below may be made of the cells' words too ("Total"): the
        # table is the part of the run that holds as many characters as its cells.
        ends = list(itertools.accumulate((len(_SPACE.sub("", line)) for line in lines[i:j]), initial=0))
        for first, last in itertools.combinations(range(len(ends)), 2):
            if ends[last] - ends[first] == want:
                return i + first, i + last
        i = j + 1
    return None


def _only_pieces(line: str, vocabulary: list[str]) -> bool:
    rest = _SPACE.sub("", line)
    if not rest:
        return False
    for word in vocabulary:
        rest = rest.replace(word, "")
    return not rest
