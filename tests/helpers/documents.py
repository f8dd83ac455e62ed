"""Builders of the documents the document tests read: PDFs with hand-written text streams
(and a ToUnicode map for any characters), DOCX files, zip bombs, lying zip directories."""

from __future__ import annotations

import io
import struct
import zipfile

import docx
from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject, StreamObject

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
