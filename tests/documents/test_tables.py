"""Tables stay tables: a PDF's table read row by row (its cells found by where they stand,
whatever order the writer drew them in), a DOCX's in document order, each row one line of
cells parted by " | "; paragraphs read as pypdf's plain extraction gives them, as before."""

from __future__ import annotations

import asyncio
import io

import docx
import pytest
from helpers.documents import laid_out_pdf, office_files
from pypdf import PdfReader

from appliance.documents.document import DocumentLimits
from appliance.documents.extract import read_docx, read_pdf
from appliance.documents.reader import DocumentReader

LIMITS = DocumentLimits()
INTRO = ("Every employee earns annual leave by length of service, as the table below shows. Leave is "
         "booked through the HR portal at least two weeks ahead.")
LEAVE = [["Service", "Annual leave", "Carry over"], ["Under 5 years", "25 days", "5 days"],
         ["5 to 9 years", "27 days", "5 days"], ["10 years or more", "30 days", "8 days"]]
ROWS = ["Service | Annual leave | Carry over", "Under 5 years | 25 days | 5 days",
        "5 to 9 years | 27 days | 5 days", "10 years or more | 30 days | 8 days"]
AFTER = "Unused leave beyond the carry-over lapses on 31 March."
PAGE = ["Annual leave", INTRO, LEAVE, AFTER]


def pdf_without_padding(title: str, grid: list[list[str]]) -> bytes:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("helpers.documents.PADDING", 0.0)
        return laid_out_pdf(title, [grid])


def plain(pdf: bytes) -> list[str]:
    """pypdf's plain extraction, page by page: what the reader gave before tables were found."""
    return [page.extract_text() for page in PdfReader(io.BytesIO(pdf)).pages]


@pytest.mark.parametrize("by_column", [False, True])
def test_pdf_table_rows_come_out_whole_and_paragraphs_as_before(by_column: bool) -> None:
    pdf = laid_out_pdf("Staff Handbook", [PAGE], by_column=by_column)
    before = plain(pdf)[0].split("\n")
    if by_column:  # the fault this mends: a cell a line, "5 to 9 years" no longer beside "27 days"
        assert "5 to 9 years" in before and "27 days" in before
    text = read_pdf(pdf, LIMITS).text
    # The intro's two lines, the heading (which is also a header cell) and the text after the
    # table are the plain extraction's own lines: paragraphs read as before, no layout spacing.
    assert " ".join(before[2:4]) == INTRO and before[-1] == AFTER
    assert text.split("\n") == ["Staff Handbook", "Annual leave", *before[2:4], *ROWS, AFTER]


def test_a_pdf_without_tables_reads_exactly_as_before() -> None:
    pages = [["Minutes", "Present: MP, TC, OB.\n1. Print tender deferred to March.\n2. Coffee: Roastwell from 1 March."],
             "会议纪要 第三条 😀 naïve café\n第二段文字。"]
    pdf = laid_out_pdf("Board minutes", pages)
    assert read_pdf(pdf, LIMITS).text == "\n\n".join(p.strip() for p in plain(pdf))


def test_two_columns_of_running_text_are_not_a_table() -> None:
    left = ["The office opens at eight and closes at six on", "weekdays; on Saturdays only the ground floor",
            "is open, from nine until one, for deliveries."]
    right = ["Visitors sign in at reception and wear a badge", "at all times; they are met by the person they",
             "visit, who also signs them out when they leave."]
    pdf = laid_out_pdf("Building", [[list(pair) for pair in zip(left, right, strict=True)]])
    assert read_pdf(pdf, LIMITS).text == plain(pdf)[0].strip()
    assert " | " not in read_pdf(pdf, LIMITS).text


@pytest.mark.parametrize("by_column", [False, True])
def test_wrapped_cells_join_their_row_and_an_empty_corner_keeps_its_column(by_column: bool) -> None:
    # A cell's lines stand closer than rows (the cells' padding): a line that leaves a column
    # empty at that distance continues the row; one cell alone continues it at any distance.
    grid = [["", "Q1", "Q2"], ["North", "1,200", "1,350"], ["South", "980", "1,010 (after the\nMarch correction)"],
            ["East and\nNorth-East", "1,100 (two\nshops)", "1,200"], ["West", "640", "700"]]
    pdf = laid_out_pdf("Sales", [["Sales by region.", grid, "Figures in pounds."]], by_column=by_column)
    assert read_pdf(pdf, LIMITS).text.split("\n") == [
        "Sales", "Sales by region.", " | Q1 | Q2", "North | 1,200 | 1,350", "South | 980 | 1,010 (after the March correction)",
        "East and North-East | 1,100 (two shops) | 1,200", "West | 640 | 700", "Figures in pounds."]


def test_rows_set_as_close_as_a_cells_lines_stay_rows() -> None:
    # Every row one line apart and none padded: nothing tells a wrapped cell from a row, so
    # a row with an empty cell stays a row.
    grid = [["Site", "Open", "Note"], ["Leeds", "Mon-Fri", ""], ["York", "Mon-Sat", "closed in August"], ["Hull", "", ""]]
    text = read_pdf(pdf_without_padding("Sites", grid), LIMITS).text
    assert "Site | Open | Note\nLeeds | Mon-Fri | \nYork | Mon-Sat | closed in August" in text


def test_chinese_tables_and_tables_on_later_pages() -> None:
    zh = [["城市", "住宿上限", "餐补"], ["北京、上海", "600元", "100元"], ["其他城市", "400元", "80元"]]
    pdf, _ = office_files("差旅标准", [["出差住宿按城市等级报销。", zh], [INTRO, LEAVE]])
    text = read_pdf(pdf, LIMITS).text
    assert "城市 | 住宿上限 | 餐补\n北京、上海 | 600元 | 100元\n其他城市 | 400元 | 80元" in text
    assert "\n".join(ROWS) in text.split("\n\n")[1]


def test_tables_come_through_the_worker_in_pdf_and_docx_alike() -> None:
    pdf, docx_data = office_files("Staff Handbook", [PAGE])
    reader = DocumentReader(DocumentLimits(cpu_s=30, wall_s=60.0))
    from_pdf = asyncio.run(reader.read(pdf, "handbook.pdf", "application/pdf"))
    from_docx = asyncio.run(reader.read(docx_data, "handbook.docx", ""))
    for doc in (from_pdf, from_docx):
        assert "\n".join(ROWS) in doc.text and doc.text.index(ROWS[0]) < doc.text.index(AFTER)
    assert from_docx.text.split("\n")[:2] == ["Staff Handbook", "Annual leave"]


def test_docx_vertically_merged_cell_names_each_row_it_spans() -> None:
    # Across columns a merged cell is read once; down rows it is repeated, as each row needs it
    # to be read alone ("Annual leave | 5 to 9 years | 27" answers which leave it is).
    document = docx.Document()
    grid = document.add_table(rows=4, cols=3)
    for r, row in enumerate([["Leave", "Service", ""], ["Annual leave", "Under 5 years", "25"],
                             ["", "5 to 9 years", "27"], ["Sick leave", "Any", "10"]]):
        for c, text in enumerate(row):
            grid.cell(r, c).text = text
    grid.cell(1, 0).merge(grid.cell(2, 0))
    grid.cell(0, 1).merge(grid.cell(0, 2))
    out = io.BytesIO()
    document.save(out)
    assert read_docx(out.getvalue(), LIMITS).text.split("\n") == [
        "Leave | Service", "Annual leave | Under 5 years | 25", "Annual leave | 5 to 9 years | 27", "Sick leave | Any | 10"]


def test_docx_cell_with_line_breaks_stays_on_its_row() -> None:
    grid = [["Region", "Total"], ["South", "1,010 (after the\nMarch correction)"], ["West", "700"]]
    _, data = office_files("Sales", [["Sales by region.", grid]])
    assert read_docx(data, LIMITS).text.split("\n") == [
        "Sales", "Sales by region.", "Region | Total", "South | 1,010 (after the March correction)", "West | 700"]


def test_lists_and_definitions_in_columns_are_text_and_a_numbered_table_a_table() -> None:
    bullets = [["•", "Desks are cleared every Friday."], ["•", "Lockers are emptied in August."],
               ["•", "Coffee machines are descaled monthly."]]
    terms = [["Owner:", "the person who books the room."], ["Host:", "the person who meets the visitor."],
             ["Guest:", "anyone without a badge."]]
    for block in (bullets, terms):
        pdf = laid_out_pdf("Rules", [["The rules.", block, "End of the rules."]])
        assert read_pdf(pdf, LIMITS).text == plain(pdf)[0].strip()
    numbered = [["No.", "Item", "Quantity"], ["1", "Paper, A4", "20 reams"], ["2", "Toner", "3"]]
    # The line below is made of a cell's words, yet is no part of the table.
    assert read_pdf(laid_out_pdf("Order", [[numbered, "Toner"]]), LIMITS).text.split("\n") == [
        "Order", "No. | Item | Quantity", "1 | Paper, A4 | 20 reams", "2 | Toner | 3", "Toner"]


def test_a_failure_to_find_tables_leaves_the_plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    pdf = laid_out_pdf("Staff Handbook", [PAGE], by_column=True)

    def broken(*_: object) -> None:
        raise KeyError("/Font")

    monkeypatch.setattr("appliance.documents.pdf_tables.positioned_lines", broken)
    assert read_pdf(pdf, LIMITS).text == plain(pdf)[0].strip()
