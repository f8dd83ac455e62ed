"""The store's one error type: an ApplianceError, so the HTTP side renders it as it renders any
other (a 503 with the owner's words and code; a 409 for a conflict) and no route maps it."""

from __future__ import annotations

from appliance.errors import Unavailable


class StoreError(Unavailable):
    """The store cannot do this now; str() is one line for the journal, the admin page and the
    client alike (which store, which file or server, what failed)."""

    def __init__(self, message: str, *, code: str = "store_unavailable") -> None:
        super().__init__(message, code=code)


class StoreConflict(StoreError):
    """Two changes at once that cannot both be (two people added under one name): a 409. The
    store is fine, so nothing is logged; `detail` keeps the engine's words."""

    status = 409
    type = "invalid_request_error"

    def __init__(self, detail: str) -> None:
        super().__init__("that changed meanwhile (two changes at once): try again", code="conflict")
        self.detail = detail
