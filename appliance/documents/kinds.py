"""What kind of file this is, from its bytes' magic, checked against the name and content type
the client claims: a .docx name on PDF bytes is refused (type_mismatch), never parsed as the wrong thing."""

from __future__ import annotations

from enum import Enum
from pathlib import PurePosixPath

from appliance.documents.failures import failure
from appliance.errors import ApplianceError


class Kind(Enum):
    PDF = "pdf"
    DOCX = "docx"  # a ZIP archive: the worker checks it holds word/document.xml
    TEXT = "text"  # anything else without a known binary magic: the worker checks it is UTF-8

    @property
    def described(self) -> str:
        return {Kind.PDF: "a PDF document", Kind.DOCX: "a DOCX document", Kind.TEXT: "text"}[self]


# Magic numbers of formats people upload that we cannot read, so they get a message naming them
# (such files nearly always have a NUL byte in their first KiB; text has none).
BINARY_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    # Word also saves a password-protected .docx in this container.
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "a legacy Office file (.doc, .xls, .ppt) or a password-protected one"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!", "a RAR archive"),
    (b"\x7fELF", "a program (ELF)"),
    (b"MZ", "a Windows program"),
    (b"RIFF", "a RIFF media file"),
    (b"\xff\xfe", "UTF-16 text (save it as UTF-8)"),
    (b"\xfe\xff", "UTF-16 text (save it as UTF-8)"),
)
PDF_MAGIC_WITHIN = 1024  # PDF readers accept the %PDF- header anywhere in the first KiB...
LEADING_SPACE = b"\xef\xbb\xbf \t\r\n"  # ...but a text about PDFs may quote it: unclaimed, it must lead
ZIP_MAGIC = b"PK\x03\x04"

TEXT_SUFFIXES = frozenset(
    ".txt .text .md .markdown .rst .csv .tsv .json .jsonl .yaml .yml .toml .ini .cfg .conf .log .xml .html .htm"
    " .css .js .mjs .ts .tsx .jsx .py .rb .go .rs .java .kt .c .h .cc .cpp .hpp .cs .php .sh .bash .sql .r"
    " .tex .srt .vtt .env .properties .gradle .swift .scala .lua .pl .diff .patch".split()
)
UNSUPPORTED_SUFFIXES = frozenset(
    ".doc .xls .xlsx .ppt .pptx .odt .ods .odp .rtf .epub .pages .key .numbers .zip .gz .tgz .7z .rar"
    " .png .jpg .jpeg .gif .webp .bmp .tif .tiff .heic .mp3 .wav .ogg .mp4 .mov .avi .exe .dll .so".split()
)
DOCX_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
TEXT_TYPES = frozenset({"application/json", "application/xml", "application/javascript", "application/x-yaml",
                        "application/yaml", "application/x-sh", "application/sql", "application/x-ndjson"})
UNSUPPORTED_TYPE_PREFIXES = ("image/", "audio/", "video/", "application/zip", "application/msword",
                             "application/vnd.ms-", "application/vnd.oasis.opendocument.", "application/rtf",
                             "application/vnd.openxmlformats-officedocument.spreadsheetml",
                             "application/vnd.openxmlformats-officedocument.presentationml")
SUPPORTED = "PDF, DOCX and UTF-8 text files can be read"


def sniff(data: bytes) -> Kind:
    """The kind the bytes say they are; a known binary format that is none of ours is refused."""
    if data[:PDF_MAGIC_WITHIN].lstrip(LEADING_SPACE).startswith(b"%PDF-"):
        return Kind.PDF
    if data.startswith(ZIP_MAGIC):
        return Kind.DOCX
    binary = b"\x00" in data[:PDF_MAGIC_WITHIN]  # so a text that starts "MZ" or "GIF8" stays text
    for magic, what in BINARY_MAGIC:
        if binary and data.startswith(magic):
            raise failure("unsupported_type", f"the file is {what}: {SUPPORTED}")
    return Kind.TEXT


def claimed(filename: str, content_type: str) -> Kind | None:
    """The kind the client claims: by the name's suffix, else by the content type (a browser's
    type for a source file can be odd: .ts is video/mp2t). None when it claims nothing."""
    suffix = PurePosixPath(filename.replace("\\", "/")).suffix.lower()
    if suffix == ".pdf":
        return Kind.PDF
    if suffix == ".docx":
        return Kind.DOCX
    if suffix in TEXT_SUFFIXES:
        return Kind.TEXT
    if suffix in UNSUPPORTED_SUFFIXES:
        raise failure("unsupported_type", f"'{suffix}' files are not supported: {SUPPORTED}")
    mime = content_type.split(";", 1)[0].strip().lower()
    if mime == "application/pdf":
        return Kind.PDF
    if mime == DOCX_TYPE:
        return Kind.DOCX
    if mime.startswith("text/") or mime in TEXT_TYPES:
        return Kind.TEXT
    if mime.startswith(UNSUPPORTED_TYPE_PREFIXES):
        raise failure("unsupported_type", f"'{mime}' files are not supported: {SUPPORTED}")
    return None  # application/octet-stream, no type, an unknown suffix: the bytes decide


def decide(data: bytes, filename: str, content_type: str) -> Kind:
    """The kind to parse the bytes as: what they are, if that is what the client claims."""
    claim = claimed(filename, content_type)
    if claim is Kind.PDF and b"%PDF-" in data[:PDF_MAGIC_WITHIN]:
        return Kind.PDF
    name = f"'{filename}'" if filename else "the file"
    try:
        kind = sniff(data)
    except ApplianceError as refused:
        if claim is None:
            raise
        raise failure("type_mismatch", f"{name} is sent as {claim.described} but {refused.message}") from None
    if claim is not None and claim is not kind:
        raise failure("type_mismatch", f"{name} is sent as {claim.described} but its bytes are {kind.described}")
    return kind
