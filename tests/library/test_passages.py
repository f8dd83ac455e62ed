"""Passages and tables: a table is cut between its rows, never inside one, and every passage
of its rows begins with its header row, so any of them tells which column is which."""

from __future__ import annotations

from helpers.documents import office_files

from appliance.documents.document import Document, DocumentLimits
from appliance.documents.extract import read_docx, read_pdf
from appliance.library.passages import TARGET_TOKENS, estimate_tokens, split

HEADER = "Grade | Role | Daily allowance | Hotel limit"
ROWS = [f"G{i} | Role number {i} of the office | £{20 + i} a day | £{100 + 5 * i} a night" for i in range(40)]
INTRO = "Travel policy. Staff who travel are paid a daily allowance by grade, as below."
AFTER = "Receipts are kept for six years."


def doc(text: str, starts: list[tuple[int, int]] | None = None) -> Document:
    return Document("pdf" if starts else "docx", text, len(starts) if starts else None, len(text), False, starts)


def test_a_long_table_is_cut_between_rows_each_passage_led_by_its_header() -> None:
    text = "\n".join([INTRO, HEADER, *ROWS, AFTER])  # as the DOCX reader writes it: a line a block
    passages = split(doc(text))
    assert len(passages) >= 4 and passages[0].text.startswith(f"{INTRO}\n{HEADER}\n{ROWS[0]}")
    seen = []
    for p in passages:
        lines = p.text.split("\n")
        rows = [line for line in lines if line in ROWS]
        if rows:
            assert HEADER in lines[:2]  # led by the header (the first passage by the intro, then it)
            assert lines.index(HEADER) < lines.index(rows[0])
        assert all(line in ROWS or line in (INTRO, HEADER, AFTER) for line in lines)  # no row cut
        assert estimate_tokens(p.text) <= TARGET_TOKENS + estimate_tokens(HEADER)
        seen += rows
    assert seen == ROWS and passages[-1].text.endswith(AFTER)
    assert [p.text.split("\n")[0] for p in passages[1:]] == [HEADER] * (len(passages) - 1)


def test_a_header_at_a_passage_end_moves_on_with_its_rows() -> None:
    filler = " ".join(["The office keeps its rules in this handbook."] * 15)  # ~150 tokens
    text = "\n\n".join([filler, "\n".join([HEADER, *ROWS[:3]])])
    passages = split(doc(text))
    assert [p.text for p in passages] == [filler, "\n".join([HEADER, *ROWS[:3]])]
    small = "\n\n".join(["Short intro.", "\n".join([HEADER, *ROWS[:3]])])
    assert [p.text for p in split(doc(small))] == ["\n".join(["Short intro.", HEADER, *ROWS[:3]])]


def test_a_table_over_two_pages_repeats_its_header_on_the_second() -> None:
    first = "\n".join([HEADER, *ROWS[:2]])
    second = "\n".join(ROWS[2:4])
    text = f"{first}\n\n{second}"  # as the PDF reader parts pages; the second without a header row
    passages = split(doc(text, [(1, 0), (2, len(first) + 2)]))
    assert [(p.page, p.text) for p in passages] == [(1, first), (2, f"{HEADER}\n{second}")]
    # Its header repeated by the writer, or a table of other columns: a table of its own.
    repeated = f"{first}\n\n{HEADER}\n{second}"
    assert [p.text for p in split(doc(repeated, [(1, 0), (2, len(first) + 2)]))] == [first, f"{HEADER}\n{second}"]
    other = f"{first}\n\nRoom | Seats\nKestrel | 12\nHeron | 8"
    assert [p.text for p in split(doc(other))] == [f"{first}\nRoom | Seats\nKestrel | 12\nHeron | 8"]


def test_a_lone_line_with_a_bar_is_text_and_text_without_tables_is_cut_as_before() -> None:
    text = "Menu: Home | About\nThe canteen opens at noon.\n\nSecond paragraph."
    assert [p.text for p in split(doc(text))] == ["Menu: Home | About\nThe canteen opens at noon.\nSecond paragraph."]
    long = " ".join(f"Sentence {i} of a long paragraph about desks." for i in range(60))
    pieces = [p.text for p in split(doc(long))]
    assert len(pieces) > 1 and " ".join(pieces).replace("\n", " ") == long


def test_a_pdf_and_a_docx_table_give_the_same_passages_each_with_the_header() -> None:
    grid = [[cell.strip() for cell in HEADER.split("|")]] + [[cell.strip() for cell in row.split("|")] for row in ROWS]
    pdf, data = office_files("Travel", [[INTRO, grid[:21], AFTER], [INTRO, [grid[0], *grid[21:]]]])
    from_pdf, from_docx = split(read_pdf(pdf, DocumentLimits())), split(read_docx(data, DocumentLimits()))
    for passages in (from_pdf, from_docx):
        with_rows = [p for p in passages if any(row in p.text for row in ROWS)]
        assert all(HEADER in p.text.split("\n")[:3] for p in with_rows) and len(with_rows) >= 4
        assert sum(p.text.count(" a night") for p in passages) == len(ROWS)  # each row once, whole
    assert {p.page for p in from_pdf} == {1, 2}
    assert [p.text for p in from_pdf if p.page == 2][0].startswith(f"{INTRO}\n{HEADER}\n{ROWS[20]}")
