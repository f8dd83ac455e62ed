"""Builders of the documents the document tests read: PDFs with hand-written text streams
(and a ToUnicode map for any characters), DOCX files, zip bombs, lying zip directories; and
office documents with tables, a PDF laid out at x,y and the same DOCX (`office_files`, which
the library's evaluation set uses too)."""

from __future__ import annotations

import io
import itertools
import json
import re
import struct
import zipfile

import docx
from pypdf import PdfWriter
from pypdf.generic import (
    ArrayObject,
    DecodedStreamObject,
    DictionaryObject,
    NameObject,
    NumberObject,
    StreamObject,
    TextStringObject,
)

MiB = 1024 * 1024


def _escape(text: bytes) -> bytes:
    return text.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")


def _font(writer: PdfWriter, chars: str) -> tuple[DictionaryObject, dict[str, int]]:
    """Helvetica, with a ToUnicode map giving each character of `chars` beyond ASCII a one-byte
    code of its own (1..31 and 128..255), so CJK and emoji round-trip through extraction."""
    codes: dict[str, int] = {}
    free = [*range(1, 32), *range(128, 256)]
    for ch in dict.fromkeys(c for c in chars if ord(c) > 126):
        codes[ch] = free.pop(0)
    font = DictionaryObject({NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
                             NameObject("/BaseFont"): NameObject("/Helvetica")})
    if codes:
        pairs = [(i, chr(i)) for i in range(32, 127)] + [(code, ch) for ch, code in codes.items()]
        lines = "".join(f"<{i:02X}> <{ch.encode('utf-16-be').hex().upper()}>\n" for i, ch in pairs)
        cmap = ("/CIDInit /ProcSet findresource begin 12 dict begin begincmap\n"
                "1 begincodespacerange <00> <FF> endcodespacerange\n"
                f"{len(pairs)} beginbfchar\n{lines}endbfchar\nendcmap CMapName currentdict /CMap defineresource pop end end")
        stream = DecodedStreamObject()
        stream.set_data(cmap.encode())
        font[NameObject("/ToUnicode")] = writer._add_object(stream)
    return font, codes


def _encode(line: str, codes: dict[str, int]) -> bytes:
    return bytes(codes[c] if c in codes else ord(c) for c in line)


def pdf_bytes(pages: list[str], *, blank: int = 0, user_password: str | None = None,
              owner_password: str | None = None) -> bytes:
    """A PDF with one page per string (lines split on \\n), then `blank` pages without content;
    encrypted (RC4, pypdf's default) when a password is given."""
    writer = PdfWriter()
    font, codes = _font(writer, "".join(pages))
    font_ref = writer._add_object(font)
    for text in pages:
        page = writer.add_blank_page(612, 792)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font_ref})})
        ops = b"".join(b"(" + _escape(_encode(line, codes)) + b") Tj T* " for line in text.split("\n"))
        page[NameObject("/Contents")] = writer._add_object(_stream(b"BT /F1 11 Tf 14 TL 72 740 Td " + ops + b"ET"))
    for _ in range(blank):
        writer.add_blank_page(612, 792)
    if user_password is not None or owner_password is not None:
        writer.encrypt(user_password or "", owner_password)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _stream(data: bytes) -> StreamObject:
    stream = DecodedStreamObject()
    stream.set_data(data)
    return stream.flate_encode()


def slow_pdf(operators: int = 1_000_000) -> bytes:
    """One page whose content stream shows a character a million times: ~7 MB of operators
    in ~30 KB of deflate, which pypdf takes ~17 s to walk (17 us an operator)."""
    return _one_page(b"BT /F1 12 Tf " + b"(x) Tj " * operators + b"ET")


def inflating_pdf(size: int) -> bytes:
    """One page whose content stream inflates to `size` bytes of spaces (pypdf refuses more than 75 MB)."""
    return _one_page(b"BT /F1 12 Tf (x) Tj ET" + b" " * size)


def token_heavy_pdf(tokens: int = 2_000_100) -> bytes:
    """One page whose content stream is `tokens` save-state operators (`q`): 4 MB in ~4 KB of
    deflate, past pypdf's default 2,000,000 tokens per content stream (~1.8 us a token to walk)."""
    return _one_page(b"BT /F1 12 Tf (x) Tj ET " + b"q " * tokens)


def wide_array_pdf(elements: int = 100_001) -> bytes:
    """One page whose content stream holds an array of `elements` numbers, past pypdf's 100,000."""
    return _one_page(b"BT /F1 12 Tf (x) Tj ET [" + b"0 " * elements + b"] 0 d")


def _one_page(content: bytes) -> bytes:
    writer = PdfWriter()
    font, _ = _font(writer, "")
    page = writer.add_blank_page(612, 792)
    page[NameObject("/Resources")] = DictionaryObject(
        {NameObject("/Font"): DictionaryObject({NameObject("/F1"): writer._add_object(font)})})
    page[NameObject("/Contents")] = writer._add_object(_stream(content))
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def docx_bytes(paragraphs: list[str], table: list[list[str]] | None = None, after: tuple[str, ...] = ()) -> bytes:
    """A DOCX with `paragraphs`, then a table of `table`'s rows, then the `after` paragraphs."""
    document = docx.Document()
    for text in paragraphs:
        document.add_paragraph(text)
    if table:
        grid = document.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, text in enumerate(row):
                grid.cell(r, c).text = text
    for text in after:
        document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def with_member(archive: bytes, name: str, size: int, chunk: bytes = b"\0" * MiB) -> bytes:
    """`archive` plus a deflated member of `size` bytes of `chunk`, written in pieces."""
    out = io.BytesIO(archive)
    with zipfile.ZipFile(out, "a", zipfile.ZIP_DEFLATED) as z, z.open(name, "w", force_zip64=True) as f:
        left = size
        while left > 0:
            piece = chunk[:left]
            f.write(piece)
            left -= len(piece)
    return out.getvalue()


def replace_member(archive: bytes, name: str, data: bytes) -> bytes:
    """`archive` with member `name` holding `data` instead (deflated)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, data if info.filename == name else src.read(info.filename))
    return out.getvalue()


def lie_about_size(archive: bytes, name: str, declared: int) -> bytes:
    """`archive` with `name`'s uncompressed size declared as `declared` in both its local header
    and the central directory (the CRC left alone): a directory that lies."""
    data = bytearray(archive)
    raw = name.encode()
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        name_len, = struct.unpack_from("<H", data, at + 28)
        if bytes(data[at + 46:at + 46 + name_len]) == raw:
            struct.pack_into("<I", data, at + 24, declared)
            local, = struct.unpack_from("<I", data, at + 42)
            struct.pack_into("<I", data, local + 22, declared)
            return bytes(data)
        at = data.find(b"PK\x01\x02", at + 4)
    raise KeyError(name)


def big_docx(paragraphs: int) -> bytes:
    """A DOCX whose document.xml holds `paragraphs` numbered paragraphs, written directly
    (python-docx takes ~1 ms a paragraph): ~100 bytes of XML each, deflating ~10x."""
    body = "".join(f"<w:p><w:r><w:t>Paragraph {i} of the long report, item {i * 7919 % 100003}.</w:t></w:r></w:p>"
                   for i in range(paragraphs))
    xml = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
           '<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
           f"<w:body>{body}</w:body></w:document>")
    return replace_member(docx_bytes(["x"]), "word/document.xml", xml.encode())


def raw_pdf(objects: list[bytes]) -> bytes:
    """A PDF written by hand, object 1 the catalog, with a correct xref table: for structures
    pypdf would never write (a page tree that holds itself)."""
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % at for at in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)


# --- office documents with tables: a PDF laid out at x,y positions, and the same as a DOCX --------

Rows = list[list[str]]  # a table: its rows of cells, the first its header
Block = str | Rows  # paragraphs (a blank line parts them), or a table
Page = str | Rows | list[Block]  # one block, or several in order
MARGIN, TOP, WIDTH, BOTTOM = 72.0, 740.0, 468.0, 60.0
COLUMN_GAP = 18.0  # points between a table's columns, as word processors leave about


def office_files(title: str, pages: list[Page]) -> tuple[bytes, bytes]:
    """(PDF, DOCX) of a document: `title`, then each page's blocks, a string's paragraphs
    parted by blank lines, a table (list of rows of cell strings, the first its header) drawn
    as columns; a PDF page per page (the title on the first), the DOCX's pages parted by page
    breaks. CJK and any other characters are kept (a two-byte font with a ToUnicode map).
    The evaluation set's table documents: `office_files(doc["title"], doc["pages"])`."""
    return laid_out_pdf(title, pages), office_docx(title, pages)


def blocks(page: Page) -> list[Block]:
    """A page's blocks: a string or a table alone is one block."""
    if isinstance(page, str):
        return [page]
    if page and all(isinstance(b, list) and all(isinstance(c, str) for c in b) for b in page):
        return [page]  # type: ignore[list-item]  # a table's rows
    return list(page)  # type: ignore[arg-type]


def _wide(ch: str) -> bool:
    return ord(ch) >= 0x1100 and (ch >= "\u2e80" or "\u1100" <= ch <= "\u115f")


def _glyph(ch: str) -> int:
    """A character's width in thousandths of an em, about Helvetica's (a proportional font, as
    office documents are set in), 1,000 for a wide (CJK) one."""
    if _wide(ch):
        return 1000
    for chars, width in (("ijlI.,;:'!| ", 278), ("frt()-[]/", 333), ("mw%", 833), ("MW@", 944)):
        if ch in chars:
            return width
    return 667 if ch.isupper() else 556


def _em(text: str) -> float:
    """The width of `text` in ems, by the font's widths."""
    return sum(_glyph(c) for c in text) / 1000


def _wrap(text: str, size: float, width: float) -> list[str]:
    """Lines of `text` within `width` points: at spaces, or anywhere in CJK."""
    lines, line = [], ""
    for token in re.findall(r"\S*\s*|", text.strip()):
        parts = [token] if not any(_wide(c) for c in token) else list(token)
        for part in parts:
            if line and _em(line + part.rstrip()) * size > width:
                lines.append(line.rstrip())
                line = ""
            line += part
    return [*lines, line.rstrip()] if line.strip() else lines


Line = tuple[float, list[tuple[float, str]]]  # the advance from the line above (ems), its (x, text) pieces
LEADING, PADDING = 1.3, 0.5  # ems: a line's advance, and the space a table's rows add between them


def _lines(page: Page, size: float) -> list[Line]:
    """The page's drawn lines at font `size`: a paragraph's line one piece; a table's row a
    cell at its column's x, a cell's lines ("\n" parts them) one under the other, the rows
    set further apart (a cell's padding); an empty line between blocks."""
    out: list[Line] = []
    for block in blocks(page):
        if isinstance(block, str):
            for para in re.split(r"\n\s*\n", block.strip()):
                out.extend((LEADING, [(0.0, line)]) for raw in para.split("\n") for line in _wrap(raw, size, WIDTH))
                out.append((LEADING, []))
            continue
        widths = [max(_em(line) for row in block if c < len(row) for line in row[c].split("\n")) * size
                  + COLUMN_GAP for c in range(max(len(row) for row in block))]
        starts = [sum(widths[:c]) for c in range(len(widths))]
        for row in block:
            parts = [cell.split("\n") for cell in row]
            for i in range(max(len(p) for p in parts)):
                pieces = [(starts[c], p[i]) for c, p in enumerate(parts) if i < len(p) and p[i].strip()]
                out.append((LEADING + (PADDING if i == 0 else 0.0), pieces))
        out.append((LEADING, []))
    return out


def _fit(page: Page, title: str | None) -> tuple[float, list[Line]]:
    """The largest font size up to 11 pt at which the page fits (a wide table or a long page
    is set smaller, never spilled onto a page of its own: the set cites pages)."""
    size = 11.0
    while True:
        lines = ([(0.0, [(0.0, title)]), (LEADING, [])] if title else []) + _lines(page, size)
        wide = max((x + _em(text) * size for _, line in lines for x, text in line), default=0.0)
        if (wide <= WIDTH and sum(lead for lead, _ in lines) * size <= TOP - BOTTOM) or size < 4:
            return size, lines
        size -= 0.5


def _cid_font(writer: PdfWriter, chars: str) -> tuple[DictionaryObject, dict[str, int]]:
    """A Type0 font (Identity-H: two bytes a character) whose ToUnicode map gives every
    character of `chars` a code of its own, and its width (`_glyph`)."""
    codes = {ch: i for i, ch in enumerate(sorted(set(chars) | {" "}), 1)}
    pairs = [f"<{code:04X}> <{ch.encode('utf-16-be').hex().upper()}>" for ch, code in codes.items()]
    sections = "".join(f"{len(chunk)} beginbfchar\n" + "\n".join(chunk) + "\nendbfchar\n"
                       for chunk in (pairs[i:i + 100] for i in range(0, len(pairs), 100)))  # 100 a section at most
    cmap = DecodedStreamObject()
    cmap.set_data(("/CIDInit /ProcSet findresource begin 12 dict begin begincmap\n"
                   "/CMapName /Appliance-UCS def 1 begincodespacerange <0000> <FFFF> endcodespacerange\n"
                   f"{sections}endcmap CMapName currentdict /CMap defineresource pop end end").encode())
    widths = ArrayObject(NumberObject(_glyph(ch)) for ch in codes)
    descendant = DictionaryObject({
        NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/CIDFontType2"),
        NameObject("/BaseFont"): NameObject("/Helvetica"), NameObject("/DW"): NumberObject(1000),
        NameObject("/W"): ArrayObject([NumberObject(1), widths]),
        NameObject("/CIDSystemInfo"): DictionaryObject({
            NameObject("/Registry"): TextStringObject("Adobe"), NameObject("/Ordering"): TextStringObject("Identity"),
            NameObject("/Supplement"): NumberObject(0)})})
    font = DictionaryObject({
        NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type0"),
        NameObject("/BaseFont"): NameObject("/Helvetica"), NameObject("/Encoding"): NameObject("/Identity-H"),
        NameObject("/DescendantFonts"): ArrayObject([writer._add_object(descendant)]),
        NameObject("/ToUnicode"): writer._add_object(cmap)})
    return font, codes


def laid_out_pdf(title: str, pages: list[Page], *, by_column: bool = False) -> bytes:
    """The PDF of `office_files`: each line, and each table cell, a text object of its own at
    its x,y (as word processors write them), so a table's cells stand in aligned columns.
    by_column: a table's cells drawn column by column, as some writers order them (pypdf's
    plain extraction then gives a cell a line, and the row is lost)."""
    writer = PdfWriter()
    font, codes = _cid_font(writer, title + json.dumps(pages, ensure_ascii=False))
    font_ref = writer._add_object(font)
    for number, page in enumerate(pages):
        size, lines = _fit(page, title if number == 0 else None)
        ys = [TOP - down * size for down in itertools.accumulate((lead for lead, _ in lines[1:]), initial=0.0)]
        ops = []
        for table, run in itertools.groupby(enumerate(lines), key=lambda item: len(item[1][1]) > 1):
            placed = [(x, row, text) for row, (_, line) in run for x, text in line]
            for x, row, text in sorted(placed) if table and by_column else placed:
                glyphs = "".join(f"{codes[c]:04X}" for c in text)
                ops.append(f"BT /F1 {size:g} Tf 1 0 0 1 {MARGIN + x:.2f} {ys[row]:.2f} Tm <{glyphs}> Tj ET")
        pdf_page = writer.add_blank_page(612, 792)
        pdf_page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font_ref})})
        pdf_page[NameObject("/Contents")] = writer._add_object(_stream("\n".join(ops).encode()))
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def office_docx(title: str, pages: list[Page]) -> bytes:
    """The DOCX of `office_files`: the title as a heading, paragraphs, tables with a grid, a
    page break between pages."""
    document = docx.Document()
    document.add_heading(title, level=1)
    for number, page in enumerate(pages):
        if number:
            document.add_page_break()
        for block in blocks(page):
            if isinstance(block, str):
                for para in re.split(r"\n\s*\n", block.strip()):
                    document.add_paragraph(para)
                continue
            grid = document.add_table(rows=len(block), cols=max(len(row) for row in block))
            grid.style = "Table Grid"
            for r, row in enumerate(block):
                for c, text in enumerate(row):
                    grid.cell(r, c).text = text
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()
