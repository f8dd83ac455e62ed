"""POST /v1/documents/text: a file's bytes in (the body itself, not a form), its text and the
model's token count out. The body is bounded by the reader's size cap before and while it is
read; extraction runs in a worker process (documents/reader.py), all under the parse gate
(intake.gated, as every route's body is read).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from appliance.documents.document import Document, MiB
from appliance.documents.failures import failure
from appliance.http.intake import gated, read_capped
from appliance.http.state import App

MAX_NAME = 255  # characters of a file name: a name, not a path


def file_name(request: Request) -> str:
    """The upload's name: `X-File-Name` (percent-encoded, as a header holds only Latin-1) or
    `?name=`; only its last path part, cut to MAX_NAME characters."""
    raw = request.headers.get("x-file-name") or ""
    name = unquote(raw, errors="replace") if raw else request.query_params.get("name", "")
    return name.replace("\\", "/").rsplit("/", 1)[-1].strip()[:MAX_NAME]


def upload_reader(max_bytes: int) -> Callable[[Request], Awaitable[bytes]]:
    """The body as a file: not a multipart form, refused as file_too_large from its
    Content-Length or as soon as the stream passes the cap (intake.read_capped)."""
    too_large = f"the file is larger than {max_bytes / MiB:,.0f} MiB, the most a document may be here"

    async def read(request: Request) -> bytes:
        if request.headers.get("content-type", "").split(";")[0].strip().lower() == "multipart/form-data":
            # Starlette's form parser needs python-multipart, which the appliance does not carry.
            raise failure("unsupported_type", "send the file's bytes as the request body (with its "
                                              "Content-Type and an X-File-Name header), not as a multipart form")
        return await read_capped(request, max_bytes, lambda: failure("file_too_large", too_large))

    return read


def document_body(name: str, doc: Document, tokens: int) -> dict[str, Any]:
    return {"object": "document", "name": name, "kind": doc.kind, "text": doc.text, "pages": doc.pages,
            "chars": doc.chars, "tokens": tokens, "truncated": doc.truncated}


async def document_text(app: App, request: Request) -> Response:
    """The file's text, pages, characters and tokens; every refusal an OpenAI-style error
    with the code documents/failures.py lists."""
    name = file_name(request)
    async with gated(app, request, upload_reader(app.documents.limits.max_bytes)) as (_, data):
        doc = await app.documents.read(data, name, request.headers.get("content-type", ""))
        # As chat content is tokenized: text, never control tokens; off the event loop, as
        # 200,000 characters (36k tokens) take 50-140 ms on 2 shared cores.
        tokens = len(await app.engine.tokenize(doc.text, False))
    return JSONResponse(document_body(name, doc, tokens))
