"""The appliance's own routes: health, models, sessions, documents and the library, the
operator's (metrics, the step log, /admin), the page and its static files; errors in OpenAI's
shape."""

from __future__ import annotations

from pathlib import Path

from starlette.staticfiles import StaticFiles

from appliance.http.api.appliance import admin, documents, library, operator, trust
from appliance.http.routing import POST, Access, Api, Body, DeclaredMount, Endpoint, Rule
from appliance.http.wire import openai_error

API = Api("appliance", openai_error)
OPEN, ADMIN, UPLOAD = Access.OPEN, Access.ADMIN, Body.UPLOAD


def routes() -> list[Endpoint]:
    return [
        API.route("/health", operator.health, access=OPEN),
        *(API.route(v1 + path, handler) for path, handler in (("/models", operator.models),
                                                               ("/models/{model:path}", operator.model))
          for v1 in ("/v1", "")),  # OpenAI's, also without /v1 (see api/openai)
        API.route("/v1/system_prompts", operator.system_prompts),
        API.route("/v1/sessions/{sid}", operator.session, ["GET", "DELETE"]),
        # A file's text for a chat (the page's attachments) or a script.
        API.route("/v1/documents/text", documents.document_text, POST, body=UPLOAD),
        # The office library chats search (404 library_off when off).
        API.route("/v1/library", library.collection, ["GET", "POST"], body=UPLOAD),
        API.route("/v1/library/{doc}", library.one, ["GET", "PUT", "DELETE"], body=UPLOAD),
        API.route("/admin/library", library.office, ["GET", "POST"], access=ADMIN, body=UPLOAD),
        API.route("/admin/library/{doc}", library.office_one, ["GET", "PUT", "DELETE"], access=ADMIN, body=UPLOAD),
        # The operator's: metrics, the step log, the view with its JSON and the usage table.
        API.route("/metrics", operator.prometheus, access=ADMIN),
        API.route("/debug/steps", operator.steps, access=ADMIN),
        API.route("/admin", admin.page, access=ADMIN),
        API.route("/admin/status", admin.status, access=ADMIN),
        API.route("/admin/usage.csv", admin.usage_csv, access=ADMIN),
        # The box's own CA (tls/): trusted once by each person's device.
        API.route("/trust/ca.crt", trust.ca, access=OPEN),
        API.route("/trust", trust.info, access=OPEN),
        API.route("/admin/trust", trust.admin, access=ADMIN),
        API.route("/", operator.index, access=OPEN),
    ]


def static(directory: Path) -> DeclaredMount:
    """The page's files, under /static so that no catch-all shadows the API's 405s and 404s."""
    return DeclaredMount("/static", StaticFiles(directory=directory), name="web", rule=Rule(API, OPEN))
