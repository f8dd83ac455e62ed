"""A DOCX's zip directory checked before anything is decompressed: a zip bomb is refused from
the sizes it declares. Reading stays bounded by them: zipfile stops a member at its declared
size (a member that holds more fails its CRC check), so a lying directory is a broken file."""

from __future__ import annotations

import io
import zipfile

from appliance.documents.document import DocumentLimits, MiB
from appliance.documents.failures import failure

DOCUMENT_PART = "word/document.xml"
MAX_ENTRIES = 10_000  # a long report with many images has a few hundred parts
# Word's XML compresses 3-30x; 20,000 identical paragraphs (2 MiB of XML) reach 256x, and
# deflate's ceiling is ~1,030x. A large member (above RATIO_FROM) that packs tighter than
# MAX_RATIO is a bomb, whatever the total.
MAX_RATIO = 100
RATIO_FROM = 8 * MiB


def check_docx(data: bytes, limits: DocumentLimits) -> None:
    """Refuse the archive unless its directory shows a DOCX and no bomb."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as e:
        raise failure("broken_docx", f"the DOCX file is not a readable ZIP archive ({e})") from None
    names = {m.filename for m in members}
    if DOCUMENT_PART not in names:
        what = "an Excel or PowerPoint file" if names & {"xl/workbook.xml", "ppt/presentation.xml"} else "a ZIP archive"
        raise failure("unsupported_type", f"the file is {what}, not a DOCX document (no {DOCUMENT_PART})")
    check_sizes(members, limits)


def check_sizes(members: list[zipfile.ZipInfo], limits: DocumentLimits) -> None:
    """Refuse a bomb from the declared sizes alone: too many members, too much in all, or a
    large member compressed beyond what any document's XML reaches."""
    if len(members) > MAX_ENTRIES:
        raise failure("zip_bomb", f"the DOCX archive has {len(members):,} members; at most {MAX_ENTRIES:,} are read")
    total = sum(m.file_size for m in members)
    if total > limits.max_unzipped:
        raise failure("zip_bomb", f"the DOCX archive would expand to {total / MiB:,.0f} MiB; "
                                  f"at most {limits.max_unzipped / MiB:,.0f} MiB are read")
    for m in members:
        if m.file_size > RATIO_FROM and m.file_size > MAX_RATIO * max(m.compress_size, 1):
            ratio = m.file_size / max(m.compress_size, 1)
            raise failure("zip_bomb", f"'{m.filename}' in the DOCX archive is compressed {ratio:,.0f} to 1 "
                                      f"({m.file_size / MiB:,.0f} MiB): a zip bomb")
