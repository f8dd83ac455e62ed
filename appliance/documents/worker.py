"""The extraction worker: `python -m appliance.documents.worker`, a fresh process per document.
It limits itself (CPU, memory, no files), reads a JSON header line and the file's bytes from
stdin, and answers one JSON object on stdout: {"ok": true, "document": ...} or {"ok": false, "code", "message"}."""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import warnings
from typing import Any

from appliance.documents.document import DocumentLimits, MiB
from appliance.documents.extract import extract  # pypdf, python-docx and lxml load before the limits
from appliance.documents.kinds import Kind
from appliance.errors import ApplianceError

MAX_HEADER = 4096  # bytes of the JSON header line
NOFILE = 16  # stdin, stdout, stderr and a few spare: parsing opens no file


def apply_limits(limits: DocumentLimits) -> None:
    """Set before any byte of the document is read; hard limits too, so they cannot be raised."""
    # SIGXCPU at the soft limit, SIGKILL a second later; both count its start (~0.15 s).
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory, limits.memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # no file written (pipes are not files)
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU would otherwise dump core
    if limits.nice > 0:
        os.nice(limits.nice)


def answer(kind: Kind, data: bytes, limits: DocumentLimits) -> dict[str, Any]:
    """The reply to the parent: the document, or the coded reason it cannot be read."""
    try:
        return {"ok": True, "document": extract(kind, data, limits).to_json()}
    except ApplianceError as e:
        return {"ok": False, "code": e.code, "message": e.message}
    except MemoryError:
        return {"ok": False, "code": "extraction_out_of_memory",
                "message": f"reading the document needs more than {limits.memory // MiB} MiB of memory"}
    except Exception as e:  # a parser's own bug, a recursion limit: still a coded answer, never a crash
        return {"ok": False, "code": "extraction_failed",
                "message": f"the document could not be read: {type(e).__name__}: {e}"[:300]}


def main() -> int:
    # A broken PDF makes pypdf log a warning per bad object: thousands, to nobody.
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    header = json.loads(sys.stdin.buffer.readline(MAX_HEADER))
    limits = DocumentLimits.from_json(header["limits"])
    apply_limits(limits)
    data = sys.stdin.buffer.read(limits.max_bytes + 1)
    reply = answer(Kind(header["kind"]), data, limits)
    sys.stdout.buffer.write(json.dumps(reply, ensure_ascii=False).encode("utf-8"))
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
