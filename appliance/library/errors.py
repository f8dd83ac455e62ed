"""What the embedding service refuses, in a module of its own: the HTTP side names these
without importing the service (which loads llama.cpp)."""


class EmbedBusy(Exception):
    """Too many texts already queued: try again later (HTTP 503)."""


class EmbedStopped(Exception):
    """The service stopped before (or while) this call was done."""
