"""A passage's tables as the prompt shows them (library/rows.py): every cell on a line that
names it by its row and its column's header, every figure as stored, the text around as is."""

from __future__ import annotations

import pytest

from appliance.library.cite import block
from appliance.library.rows import WIDE, is_figure, render
from appliance.library.store import Found

ZH = "\n".join([
    "表1 项目驻场补贴（元/天）",
    "驻场地区 | 初级顾问 | 中级顾问 | 高级顾问",
    "江苏、上海 | 75元 | 95元 | 125元",
    "广东 | 88元 | 105元 | 148元",
    "驻场补贴按月汇总，随次月工资发放。",
])


def figures(text: str) -> list[str]:
    return [c.strip() for line in text.split("\n") if " | " in line for c in line.split("|") if is_figure(c)]


def test_a_chinese_matrix_names_each_cell_by_its_row_and_column() -> None:
    assert render(ZH).split("\n") == [
        "表1 项目驻场补贴（元/天）",
        "江苏、上海, 初级顾问: 75元", "江苏、上海, 中级顾问: 95元", "江苏、上海, 高级顾问: 125元",
        "广东, 初级顾问: 88元", "广东, 中级顾问: 105元", "广东, 高级顾问: 148元",
        "驻场补贴按月汇总，随次月工资发放。",
    ]


def test_an_english_matrix_keeps_every_figure_as_written() -> None:
    text = "\n".join(["City | Grades E1–E3 | Grades E4–E5", "Copenhagen | DKK 470 | DKK 540",
                      "New York | US$74 | US$86", "Berlin | €52 | €61"])
    shown = render(text)
    assert "Berlin, Grades E4–E5: €61" in shown.split("\n") and "New York, Grades E1–E3: US$74" in shown
    assert all(f in shown for f in figures(text)) and len(shown.split("\n")) == 6


def test_a_table_without_a_header_is_shown_as_stored() -> None:
    """Its first line holds figures as its rows do: nothing names the columns."""
    text = "Paris | €58 | €66\nBerlin | €52 | €61\nDublin | €54 | €62"
    assert render(text) == text


def test_a_table_whose_first_column_is_no_label_names_each_cell_on_its_row() -> None:
    text = "Year | Staff | Revenue\n2024 | 96 | £5.1m\n2025 | 118 | £5.4m"
    assert render(text) == "Year: 2024; Staff: 96; Revenue: £5.1m\nYear: 2025; Staff: 118; Revenue: £5.4m"


def test_a_wide_table_shows_a_row_a_line_with_every_cell_named() -> None:
    """A cell a line would repeat the row's label once per column: past WIDE, a row a line."""
    header = ["Grade", *(f"Band {i}" for i in range(WIDE + 1))]
    row = ["E4", *(f"£{10 + i}" for i in range(WIDE + 1))]
    shown = render(" | ".join(header) + "\n" + " | ".join(row))
    assert shown == "Grade: E4; " + "; ".join(f"Band {i}: £{10 + i}" for i in range(WIDE + 1))


def test_a_wrapped_cell_joins_its_row_and_a_lone_figure_stays_a_row() -> None:
    text = "\n".join(["Standby period | Grade E1 | Grade E2", "Weekday night | £27 | £34",
                      "(17:30 to 08:00) |  |", "Sunday | £79 | £97", " |  | £237"])
    assert render(text).split("\n") == [
        "Weekday night (17:30 to 08:00), Grade E1: £27", "Weekday night (17:30 to 08:00), Grade E2: £34",
        "Sunday, Grade E1: £79", "Sunday, Grade E2: £97", "Grade E2: £237"]


def test_empty_cells_and_a_missing_header_cell_are_left_out_or_unnamed() -> None:
    text = " | Weekday | Weekend\nAnn | 3 days |  \nBob |  | 2 days | on call"
    assert render(text).split("\n") == ["Ann, Weekday: 3 days", "Bob, Weekend: 2 days", "Bob: on call"]


def test_the_cells_the_question_names_come_first_and_none_is_dropped() -> None:
    shown = render(ZH, "中级顾问在广东驻场，每天补贴多少钱？").split("\n")
    assert shown[1] == "广东, 中级顾问: 105元" and sorted(shown) == sorted(render(ZH).split("\n"))
    assert shown[0] == "表1 项目驻场补贴（元/天）" and shown[-1] == "驻场补贴按月汇总，随次月工资发放。"


def test_a_grade_asked_is_found_in_its_band_and_a_plural_matches() -> None:
    text = "\n".join(["Period | Grades E1–E3 | Grades E4–E5 | Associates", "Saturday | £71 | £88 | £104",
                      "Sunday | £79 | £97 | £116"])
    assert render(text, "I'm grade E2 on standby on a Sunday.").split("\n")[0] == "Sunday, Grades E1–E3: £79"
    assert render(text, "An associate on a Saturday?").split("\n")[0] == "Saturday, Associates: £104"
    zh = "工龄 | P1–P3 | P4–P6\n满1年不满3年 | 60元 | 90元\n满3年不满5年 | 140元 | 190元"
    assert render(zh, "我是P5职级，满3年不满5年").split("\n")[0] == "满3年不满5年, P4–P6: 190元"
    assert render(zh, "P7呢？") == render(zh)  # out of every band: the table's own order


@pytest.mark.parametrize("text", [
    "No table here.\nJust two lines of text.",
    "A lone row is text: a | b\nand the line after it.",
    "",
])
def test_text_without_a_table_is_shown_as_it_is(text: str) -> None:
    assert render(text) == text


def test_figures_and_codes() -> None:
    assert all(is_figure(c) for c in ("€58", "US$74", "DKK 470", "£27", "40元", "15%", "1,200", "5 days"))
    assert not any(is_figure(c) for c in ("E1", "P5", "Grades E1–E3", "满1年不满3年", "广东", "Weekday night"))


def test_the_prompt_block_shows_the_rows_and_the_client_the_passage_as_stored() -> None:
    found = Found(7, "d", "补贴标准", 1, ZH)
    assert block(2, found, "广东") == f"[2] 补贴标准, page 1:\n{render(ZH, '广东')}"
    assert "\n广东, 初级顾问: 88元\n" in block(2, found, "广东") and "广东, 中级顾问: 105元" in block(2, found)
    assert found.text == ZH  # what attribution matches answers against, and the client shows
