"""People mode's routes: signing in, a person's chats and keys, the operator's list of people
(in open mode each answers 404 people_mode_off, but /auth/me, which says the mode). Whether
the caller is a signed-in person is the handlers' to say (common.signed_in), after the mode."""

from __future__ import annotations

from appliance.http.api.people import admin, auth, chats, export, keys
from appliance.http.routing import POST, Access, Api, Endpoint
from appliance.http.wire import openai_error

API = Api("people", openai_error)
OPEN, SIGNIN, ADMIN = Access.OPEN, Access.SIGNIN, Access.ADMIN


def routes() -> list[Endpoint]:
    return [
        API.route("/auth/me", auth.me, access=OPEN),
        API.route("/auth/signin", auth.signin, POST, access=SIGNIN),
        API.route("/auth/signout", auth.signout, POST, access=OPEN),
        API.route("/auth/signout-everywhere", auth.signout, POST, access=OPEN),
        API.route("/auth/password", auth.password, POST, access=OPEN),
        API.route("/auth/invite", auth.invite, POST, access=SIGNIN),
        API.route("/auth/invite/accept", auth.invite, POST, access=SIGNIN),
        API.route("/v1/chats", chats.collection, ["GET", "POST"]),
        API.route("/v1/chats/{cid}", chats.one, ["GET", "PUT", "PATCH", "DELETE"]),
        API.route("/v1/chats/{cid}/share", chats.share, ["POST", "DELETE"]),
        API.route("/v1/shared", chats.shared, POST, access=Access.SHARED),
        API.route("/v1/me/keys", keys.collection, ["GET", "POST"]),
        API.route("/v1/me/keys/{kid}", keys.one, ["DELETE"]),
        API.route("/v1/me/export", export.export, ["GET"]),  # a session only: the handler says so
        API.route("/admin/people", admin.collection, ["GET", "POST"], access=ADMIN),
        API.route("/admin/people/{pid}", admin.one, ["PATCH", "DELETE"], access=ADMIN),
        API.route("/admin/people/{pid}/invite", admin.invite, POST, access=ADMIN),
    ]
