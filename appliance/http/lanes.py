"""Which lane a request runs in: people's (the default) or background work's, which the
engine runs in the capacity people leave free (engine/scheduler.py).

A request is background work when it says so, in any of the ways clients say it:
- OpenAI's `service_tier: "flex"` (the tier OpenAI itself runs slower and cheaper);
- vLLM's `priority`: an integer, lower is sooner, 0 the default; above 0 is background;
- an `X-Priority` header: `background`, `low`, `bulk` or `batch` (and `people`, `normal`,
  `high`, `interactive` or `default` for the people's lane);
- its key's lane in the keys file (`KEY LABEL QUOTA background`, http/keys.py);
- or its shape: the background tasks of chat front-ends, recognised by their prompt. Open
  WebUI's titles, tags, follow-up suggestions, search queries and emoji all send one user
  message that starts with `### Task:` and holds the chat in `<chat_history>` (its default
  templates, 0.5 to 0.12); the first user turn of a chat costs it three of them, about 895
  prompt tokens and 79 generated beside the chat's own 23 and 70.
Wrong types and unknown values of the fields and the header are 400s, as for any field.
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers

from appliance.engine.turn import Lane
from appliance.errors import BadRequest
from appliance.http.guard import Caller
from appliance.model.prompt import TASK_HISTORY, TASK_START

SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")
BACKGROUND_WORDS = frozenset({"background", "low", "bulk", "batch"})
PEOPLE_WORDS = frozenset({"people", "normal", "high", "interactive", "default"})


def lane_of(caller: Caller, headers: Headers, data: dict[str, Any]) -> Lane:
    """The operator's word (the key's lane) first, then the client's, then the shape's: a
    client that says `X-Priority: people` is believed over the shape of its prompt."""
    asked = _asked(headers, data)  # validated whatever else decides
    if asked or (caller.key is not None and caller.key.background):
        return Lane.BACKGROUND
    if headers.get("x-priority", "").strip().lower() in PEOPLE_WORDS:
        return Lane.PEOPLE
    return Lane.BACKGROUND if front_end_task(data) else Lane.PEOPLE


def _asked(headers: Headers, data: dict[str, Any]) -> bool:
    tier = data.get("service_tier")
    if tier is not None and tier not in SERVICE_TIERS:
        raise BadRequest(f"service_tier must be one of {', '.join(SERVICE_TIERS)}", param="service_tier")
    priority = data.get("priority")
    if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
        raise BadRequest("priority must be an integer (lower is sooner; above 0 is background work)", param="priority")
    word = headers.get("x-priority", "").strip().lower()
    if word and word not in BACKGROUND_WORDS | PEOPLE_WORDS:
        raise BadRequest("X-Priority must be one of " + ", ".join(sorted(BACKGROUND_WORDS | PEOPLE_WORDS)),
                         param="X-Priority")
    return tier == "flex" or (priority is not None and priority > 0) or word in BACKGROUND_WORDS


def front_end_task(data: dict[str, Any]) -> bool:
    """A chat front-end's background task, by its shape (the module's docstring)."""
    text: Any = data.get("prompt")  # Ollama's /api/generate, a completion
    messages = data.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        text = messages[-1].get("content")
        if isinstance(text, list):  # content parts: the first text part
            text = next((p.get("text") for p in text if isinstance(p, dict) and p.get("type") == "text"), None)
    return isinstance(text, str) and text.lstrip().startswith(TASK_START) and TASK_HISTORY in text
