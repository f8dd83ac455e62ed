"""A passage's table rows as the prompt shows them: each cell (or each row) a line that names
it by its row and its column's header, the cells the question names first, so a small model
reads a cell without counting columns.

The passage is stored as the readers write a table (a header row, then rows, cells parted by
" | ": passages.py); on the evaluation set the 0.5B model, given that grid, answered 2 of 8
table questions (广东 中级 with 江苏 初级's figure). A cell a line alone did no better (1 of
8: it took the first line of the column asked, Paris's for Berlin); with the cells the
question names first, 4 of 8. Only the prompt changes: a cell's text is copied as it stands
and nothing is dropped (the server's attribution matches an answer's figures against the
stored text), and what the prompt shows is what its cost counts (http/retrieval.py
tokenizes the rendered block; a matrix shown a cell a line costs ~1.4 times its grid).

  Berlin, Grades E4–E5: €61        a matrix: the first column names the row, the header the
                                   columns (every cell a line, row and column named)
  Name: Ann; Room: Kestrel          any other table: a row a line, each cell after its header
  Paris | €58 | €66                 no header (its first line holds figures as the rows do):
                                    as stored, nothing to name the cells by
"""

from __future__ import annotations

import itertools
import re

from appliance.library.passages import ROW, terms

# A figure: a number with at most a short currency before it or unit after it (€58, 40元,
# DKK 470, US$74, 1,200, 3.5 h, 15%), what a table's body holds and a header seldom does. A
# label with digits in it is none: a code (E4, P5: letters against the digits) or text that
# runs on past them (Grades E1–E3, 满1年不满3年).
_FIGURE = re.compile(r"(?:[A-Za-z]{0,3}[^\w\s]|[A-Za-z]{1,3}\s)?\d[\d,.\s]*\D{0,6}")
# Value columns at most for a cell a line: wider, each cell's line would repeat the row's
# label that many times; a row a line costs less and still names every cell.
WIDE = 4
# A grade in a question (E2, P5, M2) and a band of them in a table (E1–E3, P4–6); not \b:
# in Chinese a code stands against characters that are word characters too (是P5职级).
_CODE = re.compile(r"(?<![A-Za-z\d])([A-Za-z]{1,3})(\d+)(?![\d–—-])")
_BAND = re.compile(r"(?<![A-Za-z\d])([A-Za-z]{1,3})(\d+)\s*[–—-]\s*([A-Za-z]{0,3})(\d+)(?!\d)")


def is_figure(cell: str) -> bool:
    return _FIGURE.fullmatch(cell.strip()) is not None


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.split(ROW.strip())]


def _headed(header: list[str]) -> bool:
    """The first line is a header: none of its cells after the first is a figure (a table
    without a header begins with a row of figures, as its other rows go on)."""
    return not any(is_figure(c) for c in header[1:] if c)


def _joined(rows: list[list[str]]) -> list[list[str]]:
    """A row that holds one piece of text and nothing else is the rest of a cell the reader
    wrapped onto a line of its own: joined to that cell in the row above. A lone figure stays
    a row of its own (a total, say): a figure is never moved."""
    out: list[list[str]] = []
    for row in rows:
        filled = [i for i, c in enumerate(row) if c]
        if out and len(filled) == 1 and not is_figure(row[filled[0]]) and filled[0] < len(out[-1]):
            i = filled[0]
            out[-1] = [*out[-1][:i], f"{out[-1][i]} {row[i]}".strip(), *out[-1][i + 1:]]
        else:
            out.append(row)
    return out


def _matrix(header: list[str], rows: list[list[str]]) -> bool:
    """Row labels down the first column (no figure among them; a total's may be empty) and
    two to WIDE+1 columns."""
    return 2 <= len(header) <= WIDE + 1 and not any(is_figure(r[0]) for r in rows)


def _cell_lines(header: list[str], row: list[str]) -> list[str]:
    """A matrix row, a cell a line: "row, column: cell" (a cell past the header's columns
    after the row's label alone, one in a row without a label after its column alone)."""
    label, out = row[0], []
    for head, cell in itertools.zip_longest(header[1:], row[1:], fillvalue=""):
        if cell:
            out.append(f"{', '.join(k for k in (label, head) if k)}: {cell}")
    return out or [label]


def _row_line(header: list[str], row: list[str]) -> str:
    """A row a line: "column: cell; column: cell" (a cell under no header as it stands)."""
    pairs = itertools.zip_longest(header, row, fillvalue="")
    return "; ".join(f"{head}: {cell}" if head else cell for head, cell in pairs if cell)


def table(lines: list[str]) -> list[str]:
    """A table's lines (its header first, if it has one) as the prompt shows them."""
    header = _cells(lines[0])
    if not _headed(header):
        return lines
    rows = _joined([_cells(line) for line in lines[1:]])
    if _matrix(header, rows):
        return [line for row in rows for line in _cell_lines(header, row)]
    return [_row_line(header, row) for row in rows]


def _words(text: str) -> set[str]:
    """Its words as `terms` gives them, an English plural's s dropped (associate, associates)."""
    return {w[:-1] if w.endswith("s") and len(w) > 3 and w.isascii() else w for w in terms(text)}


def _in_range(codes: list[tuple[str, int]], line: str) -> int:
    """How many of the question's codes (E2, P5) fall in a band the line names (E1–E3, P4–P6)."""
    bands = [(a.lower(), int(lo), int(hi)) for a, lo, b, hi in _BAND.findall(line) if not b or b.lower() == a.lower()]
    return sum(any(a == x and lo <= n <= hi for x, lo, hi in bands) for a, n in codes)


def _first(lines: list[str], question: str) -> list[str]:
    """The lines that name more of the question's words first, in their order otherwise (a
    stable sort: nothing is dropped). Given a grid or every cell in the order of the table,
    the 0.5B model answered with the first cell of the column asked (广东 中级 with 杭州
    中级's figure): the cell the question names by its row and its column is read first."""
    asked = _words(question)
    codes = [(a.lower(), int(n)) for a, n in _CODE.findall(question)]
    score = [len(asked & _words(line)) + _in_range(codes, line) for line in lines]
    return [line for _, line in sorted(zip(score, lines), key=lambda p: -p[0])]


def render(text: str, question: str = "") -> str:
    """A passage's text with each table in it (two lines or more that part cells by " | ",
    as passages.py finds them) named cell by cell, the cells the question names first; its
    other lines as they stand."""
    out: list[str] = []
    for is_row, run in itertools.groupby(text.split("\n"), key=lambda line: ROW in line):
        group = list(run)
        out.extend(_first(table(group), question) if is_row and len(group) > 1 else group)
    return "\n".join(out)
