"""Structured output: JSON schemas and forced tool calls -> GBNF grammars for llama.cpp.

llama-cpp-python's converter silently ignores some JSON-schema keywords (minimum, maximum,
multipleOf, uniqueItems, not, patternProperties...) and asserts on others, so a schema is
first checked here against the keywords the converter really enforces: anything else is a
400 naming the keyword and where it is, never a silent best effort. Conversions are cached
by schema and run on the HTTP side's worker threads, never on the engine thread.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from .errors import BadRequest

MAX_SCHEMA_BYTES = 64 * 1024
MAX_DEPTH = 32
TYPES = {"string", "number", "integer", "boolean", "null", "object", "array"}
FORMATS = {"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"}
# Keywords that only describe: ignoring them changes nothing about which documents are valid.
ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
               "readOnly", "writeOnly"}
# What the converter enforces, and with which other keywords.
ENFORCED = {"type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
            "maxItems", "enum", "const", "anyOf", "allOf", "$ref", "$defs", "definitions", "pattern",
            "minLength", "maxLength", "format"}
_STRING_ONLY = ("pattern", "minLength", "maxLength", "format")

# Any JSON object (response_format json_object): llama.cpp's own json.gbnf.
JSON_OBJECT = r'''
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
'''


def _bad(where: str, what: str, param: str) -> BadRequest:
    return BadRequest(f"{param}: {what} at {where} cannot be enforced here; supported keywords: "
                      f"{', '.join(sorted(ENFORCED))} (plus annotations such as title and description)", param=param)


def check_schema(schema: Any, param: str, where: str = "#", depth: int = 0) -> None:
    """Raise a BadRequest naming the first keyword (and its place) we cannot enforce."""
    if depth > MAX_DEPTH:
        raise BadRequest(f"{param}: the schema is nested more than {MAX_DEPTH} levels deep", param=param)
    if isinstance(schema, bool):
        if schema:
            return  # `true`: anything
        raise _bad(where, "the schema `false`", param)
    if not isinstance(schema, dict):
        raise BadRequest(f"{param}: the schema at {where} must be an object", param=param)
    for key in schema:
        if key not in ENFORCED and key not in ANNOTATIONS:
            raise _bad(where, f"the keyword {key!r}", param)
    sub = lambda s, w: check_schema(s, param, w, depth + 1)  # noqa: E731
    t = schema.get("type")
    types = t if isinstance(t, list) else [t] if t is not None else []
    if not all(isinstance(x, str) and x in TYPES for x in types) or (isinstance(t, list) and not t):
        raise BadRequest(f"{param}: 'type' at {where} must be one of {', '.join(sorted(TYPES))} or a list of them",
                         param=param)
    constraining = set(schema) - ANNOTATIONS - {"$defs", "definitions"}
    for alone in ("$ref", "anyOf"):  # the converter reads these and ignores their siblings
        if alone in schema and constraining - {alone}:
            raise _bad(where, f"{alone!r} beside {', '.join(sorted(constraining - {alone}))}", param)
    if isinstance(t, list) and constraining - {"type"}:
        raise _bad(where, "a list of types beside other keywords", param)
    if "$ref" in schema and not (isinstance(schema["$ref"], str) and schema["$ref"].startswith("#/")):
        raise _bad(where, "a $ref that is not local ('#/...')", param)
    for key in _STRING_ONLY:
        if key in schema and t != "string":
            raise _bad(where, f"{key!r} without \"type\": \"string\"", param)
    if "format" in schema and schema["format"] not in FORMATS:
        raise _bad(where, f"the format {schema['format']!r}", param)
    if ("minItems" in schema or "maxItems" in schema) and "items" not in schema:
        raise _bad(where, "minItems/maxItems without 'items'", param)
    for key in ("minItems", "maxItems", "minLength", "maxLength"):
        if key in schema and (not isinstance(schema[key], int) or isinstance(schema[key], bool) or schema[key] < 0):
            raise BadRequest(f"{param}: {key!r} at {where} must be a non-negative integer", param=param)
    if "required" in schema and not (isinstance(schema["required"], list)
                                     and all(isinstance(x, str) for x in schema["required"])):
        raise BadRequest(f"{param}: 'required' at {where} must be a list of property names", param=param)
    if "enum" in schema and not (isinstance(schema["enum"], list) and schema["enum"]):
        raise BadRequest(f"{param}: 'enum' at {where} must be a non-empty list", param=param)
    for key in ("properties", "$defs", "definitions"):
        if key in schema:
            if not isinstance(schema[key], dict):
                raise BadRequest(f"{param}: {key!r} at {where} must be an object", param=param)
            for name, s in schema[key].items():
                sub(s, f"{where}/{key}/{name}")
    if "items" in schema:
        sub(schema["items"], f"{where}/items")
    if not isinstance(schema.get("additionalProperties", True), bool):  # true/false: allowed or not
        sub(schema["additionalProperties"], f"{where}/additionalProperties")
    for key in ("prefixItems", "anyOf", "allOf"):
        if key in schema:
            if not isinstance(schema[key], list) or not schema[key]:
                raise BadRequest(f"{param}: {key!r} at {where} must be a non-empty list", param=param)
            for i, s in enumerate(schema[key]):
                sub(s, f"{where}/{key}/{i}")
    if "allOf" in schema:
        for i, s in enumerate(schema["allOf"]):
            if not isinstance(s, dict) or not ("properties" in s or "$ref" in s):
                raise _bad(f"{where}/allOf/{i}", "an allOf part that is not an object schema or a $ref", param)


@lru_cache(maxsize=256)
def _convert(schema_json: str, prop_order: tuple[str, ...]) -> str:
    from .llm import json_schema_gbnf  # the llama_cpp user; pure Python, any thread

    return json_schema_gbnf(schema_json, list(prop_order))


def schema_grammar(schema: Any, param: str = "response_format.json_schema.schema",
                   prop_order: tuple[str, ...] = ()) -> str:
    """A checked schema's grammar (cached by the schema's JSON). Properties keep the
    schema's order: a model writes `name` before `tags` more naturally than the converter's
    alphabetical default would have it."""
    text = json.dumps(schema, ensure_ascii=False)
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise BadRequest(f"{param}: the schema is not valid Unicode text (it holds a lone surrogate)",
                         param=param) from None
    if size > MAX_SCHEMA_BYTES:
        raise BadRequest(f"{param}: the schema is larger than {MAX_SCHEMA_BYTES // 1024} KiB", param=param)
    check_schema(schema, param)
    try:
        return _convert(text, prop_order)
    except (AssertionError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise BadRequest(f"{param}: the schema cannot be turned into a grammar: {str(e)[:200]}", param=param) from None


def tool_call_grammar(functions: list[dict[str, Any]], parallel: bool) -> str:
    """Force the answer to be one (or, with parallel calls, several) of Qwen's
    `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks, the arguments
    following each function's parameter schema."""
    calls = []
    for f in functions:
        params = f.get("parameters") or {"type": "object"}
        calls.append({"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": params},
                      "required": ["name", "arguments"]})
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    call_rules = schema_grammar(schema, "tools", ("name", "arguments"))
    # The converter names its start rule `root`: call it `call` and wrap it in the tags.
    lines = [("call" + line[4:]) if line.startswith("root ::=") else line for line in call_rules.splitlines()]
    block = r'"<tool_call>\n" call "\n</tool_call>"'
    root = f"root ::= {block} (\"\\n\" {block})*" if parallel else f"root ::= {block}"
    return "\n".join([root, *lines])
