"""OpenAI's response_format (chat's, and the Responses API's text.format in its terms): the
grammar an answer must follow, or None for free text.
"""

from __future__ import annotations

from typing import Any

from appliance.errors import BadRequest
from appliance.http.validate import json_text
from appliance.structured.grammar import JSON_OBJECT, schema_grammar


def parse_response_format(data: dict[str, Any]) -> str | None:
    """response_format -> the grammar the answer must follow, or None for free text."""
    rf = data.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise BadRequest("'response_format' must be an object with a 'type'", param="response_format")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        if rf.get("schema") is None:
            return JSON_OBJECT
        # llama-server's extension: a json_object with its schema, as json_schema's.
        if not isinstance(rf["schema"], (dict, bool)):
            raise BadRequest("'response_format.schema' must be a JSON schema object", param="response_format.schema")
        return schema_grammar(json_text(rf["schema"], "response_format.schema"), "response_format.schema")
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema", {}), (dict, bool)):
            raise BadRequest("'response_format.json_schema' must be an object with a 'schema'",
                             param="response_format.json_schema")
        return schema_grammar(json_text(js.get("schema", {}), "response_format.json_schema.schema"))
    raise BadRequest(f"'response_format.type' must be text, json_object or json_schema, got {kind[:32]!r}",
                     param="response_format.type")
