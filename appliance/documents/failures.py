"""Every way a document can be refused: its code, HTTP status and OpenAI-style error.
The worker reports a code and a message; the server rebuilds the error from this one table.

413: file_too_large, too_many_pages. 415: unsupported_type, type_mismatch, invalid_text.
400: empty_file. 422 (readable request, unusable content): encrypted_pdf, broken_pdf,
pdf_too_complex (past one of pypdf's structure limits), broken_docx, zip_bomb, no_text_found
(a scan without a text layer), extraction_timeout, extraction_out_of_memory, extraction_failed.
"""

from __future__ import annotations

from appliance.errors import (
    ApplianceError,
    BadRequest,
    PayloadTooLarge,
    UnprocessableEntity,
    UnsupportedMediaType,
)

CODES: dict[str, type[ApplianceError]] = {
    "file_too_large": PayloadTooLarge,
    "too_many_pages": PayloadTooLarge,
    "unsupported_type": UnsupportedMediaType,
    "type_mismatch": UnsupportedMediaType,
    "invalid_text": UnsupportedMediaType,
    "empty_file": BadRequest,
    "encrypted_pdf": UnprocessableEntity,
    "broken_pdf": UnprocessableEntity,
    "pdf_too_complex": UnprocessableEntity,
    "broken_docx": UnprocessableEntity,
    "zip_bomb": UnprocessableEntity,
    "no_text_found": UnprocessableEntity,
    "extraction_timeout": UnprocessableEntity,
    "extraction_out_of_memory": UnprocessableEntity,
    "extraction_failed": UnprocessableEntity,
}

PARAM = "file"  # the error's `param`: the upload


def failure(code: str, message: str) -> ApplianceError:
    """The error for `code`; an unknown code (a worker gone wrong) is extraction_failed."""
    if code not in CODES:
        code = "extraction_failed"
    return CODES[code](message, param=PARAM, code=code)
