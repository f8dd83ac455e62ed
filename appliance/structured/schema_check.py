"""Which JSON schemas the grammar converter can enforce: check_schema refuses any other with a 400.

llama-cpp-python's converter silently ignores some JSON-schema keywords (minimum, maximum,
multipleOf, uniqueItems, not, patternProperties...) and asserts on others, so a schema is
first checked here against the keywords the converter really enforces: anything else is a
400 naming the keyword and where it is, never a silent best effort.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from appliance.errors import BadRequest
from appliance.structured.pattern import scan_pattern

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


def _bad(where: str, what: str, param: str) -> BadRequest:
    return BadRequest(f"{param}: {what} at {where} cannot be enforced here; supported keywords: "
                      f"{', '.join(sorted(ENFORCED))} (plus annotations such as title and description)", param=param)


@dataclass
class _Seen:
    """What one check of a schema found: every subschema (by identity) and every $ref."""
    schemas: set[int] = field(default_factory=set)
    refs: list[tuple[str, str]] = field(default_factory=list)  # ($ref, where)
    allof_refs: list[tuple[str, str]] = field(default_factory=list)  # those that are allOf parts


def resolve(root: Any, ref: str) -> Any:
    """What a local $ref points at, read as the converter reads it; None if nothing."""
    target = root
    for sel in ref.split("#")[-1].split("/")[1:]:
        if not isinstance(target, dict) or sel not in target:
            return None
        target = target[sel]
    return target


def check_schema(schema: Any, param: str) -> None:
    """Raise a BadRequest naming the first keyword (and its place) we cannot enforce."""
    seen = _Seen()
    _check(schema, param, "#", 0, seen)
    for ref, where in seen.refs:  # the converter would fail on (or silently misread) anything else
        if id(resolve(schema, ref)) not in seen.schemas:
            raise BadRequest(f"{param}: the $ref {ref[:64]!r} at {where} names no schema in this one", param=param)
    for ref, where in seen.allof_refs:  # an allOf part only contributes its properties (and required, allOf)
        target = resolve(schema, ref)
        if "properties" not in target:
            raise BadRequest(f"{param}: the allOf part at {where} refers to {ref[:64]!r}, which has no 'properties' "
                             "(an allOf part only contributes its properties here)", param=param)
        _check_part(target, ref, param)


def _check(schema: Any, param: str, where: str, depth: int, seen: _Seen) -> None:
    _check_keywords(schema, param, where, depth)
    seen.schemas.add(id(schema))
    t = _check_type(schema, param, where)
    _check_siblings(schema, t, param, where)
    if "$ref" in schema:
        seen.refs.append((schema["$ref"], where))
    _check_values(schema, param, where)
    _check_subschemas(schema, param, where, lambda s, w: _check(s, param, w, depth + 1, seen))
    if "allOf" in schema:
        _check_allof(schema, t, param, where, seen)
    for key in ("const", "enum"):
        if key in schema and (problem := _odd_value(schema[key])):
            raise BadRequest(f"{param}: {key!r} at {where} holds {problem}, which cannot be enforced here", param=param)


def _check_keywords(schema: Any, param: str, where: str, depth: int) -> None:
    """A schema is an object of known keywords, nested no deeper than MAX_DEPTH."""
    if depth > MAX_DEPTH:
        raise BadRequest(f"{param}: the schema is nested more than {MAX_DEPTH} levels deep", param=param)
    if isinstance(schema, bool):  # the converter reads only objects (additionalProperties: true/false aside)
        raise _bad(where, f"the boolean schema `{json.dumps(schema)}`", param)
    if not isinstance(schema, dict):
        raise BadRequest(f"{param}: the schema at {where} must be an object", param=param)
    for key in schema:
        if key not in ENFORCED and key not in ANNOTATIONS:
            raise _bad(where, f"the keyword {key!r}", param)


def _check_type(schema: dict[str, Any], param: str, where: str) -> Any:
    """The schema's 'type' (a name, a list of names or None), checked."""
    t = schema.get("type")
    types = t if isinstance(t, list) else [t] if t is not None else []
    if not all(isinstance(x, str) and x in TYPES for x in types) or (isinstance(t, list) and not t):
        raise BadRequest(f"{param}: 'type' at {where} must be one of {', '.join(sorted(TYPES))} or a list of them",
                         param=param)
    return t


def _check_siblings(schema: dict[str, Any], t: Any, param: str, where: str) -> None:
    """Keywords the converter reads while it ignores their siblings, or reads only with a type."""
    constraining = set(schema) - ANNOTATIONS - {"$defs", "definitions"}
    for alone in ("$ref", "anyOf"):  # the converter reads these and ignores their siblings
        if alone in schema and constraining - {alone}:
            raise _bad(where, f"{alone!r} beside {', '.join(sorted(constraining - {alone}))}", param)
    if isinstance(t, list) and constraining - {"type"}:
        raise _bad(where, "a list of types beside other keywords", param)
    if "$ref" in schema and not (isinstance(schema["$ref"], str) and schema["$ref"].startswith("#/")):
        raise _bad(where, "a $ref that is not local ('#/...')", param)
    for key in ("const", "enum"):  # the converter writes the values and ignores every sibling but the type
        if key in schema and constraining - {key, "type"}:
            raise _bad(where, f"{key!r} beside {', '.join(sorted(constraining - {key, 'type'}))}", param)
    for key, others in (("pattern", ("minLength", "maxLength", "format")), ("format", ("minLength", "maxLength")),
                        ("prefixItems", ("minItems", "maxItems"))):  # the first one wins, the rest are ignored
        if key in schema and (beside := [k for k in others if k in schema]):
            raise _bad(where, f"{key!r} beside {', '.join(beside)}", param)
    for key in _STRING_ONLY:
        if key in schema and t != "string":
            raise _bad(where, f"{key!r} without \"type\": \"string\"", param)


def _check_values(schema: dict[str, Any], param: str, where: str) -> None:
    """The keywords' own values: formats, patterns, bounds, required names, enum lists."""
    for key in ("format", "pattern"):
        if key in schema and not isinstance(schema[key], str):
            raise BadRequest(f"{param}: {key!r} at {where} must be a string", param=param)
    if "format" in schema and schema["format"] not in FORMATS:
        raise _bad(where, f"the format {schema['format'][:64]!r}", param)
    if "pattern" in schema and (problem := scan_pattern(schema["pattern"])[0]):
        raise BadRequest(f"{param}: the pattern at {where} cannot be enforced: {problem}", param=param)
    if ("minItems" in schema or "maxItems" in schema) and "items" not in schema:
        raise _bad(where, "minItems/maxItems without 'items'", param)
    for key in ("minItems", "maxItems", "minLength", "maxLength"):
        if key in schema and (not isinstance(schema[key], int) or isinstance(schema[key], bool) or schema[key] < 0):
            raise BadRequest(f"{param}: {key!r} at {where} must be a non-negative integer", param=param)
    for lo, hi in (("minItems", "maxItems"), ("minLength", "maxLength")):  # else the converter keeps only lo
        if lo in schema and hi in schema and schema[lo] > schema[hi]:
            raise BadRequest(f"{param}: {lo!r} at {where} is more than {hi!r}: nothing would match", param=param)
    if "required" in schema and not (isinstance(schema["required"], list)
                                     and all(isinstance(x, str) for x in schema["required"])):
        raise BadRequest(f"{param}: 'required' at {where} must be a list of property names", param=param)
    if "enum" in schema and not (isinstance(schema["enum"], list) and schema["enum"]):
        raise BadRequest(f"{param}: 'enum' at {where} must be a non-empty list", param=param)


def _check_subschemas(schema: dict[str, Any], param: str, where: str, sub: Callable[[Any, str], None]) -> None:
    """Every schema this one holds, checked by `sub` at its place."""
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


def _check_allof(schema: dict[str, Any], t: Any, param: str, where: str, seen: _Seen) -> None:
    """allOf merges object parts only: each an object schema or a $ref (checked once resolved)."""
    if t not in (None, "object"):
        raise _bad(where, f"allOf beside \"type\": {json.dumps(t)}", param)
    for i, s in enumerate(schema["allOf"]):
        if not isinstance(s, dict) or not ("properties" in s or "$ref" in s):
            raise _bad(f"{where}/allOf/{i}", "an allOf part that is not an object schema or a $ref", param)
        _check_part(s, f"{where}/allOf/{i}", param)
        if "$ref" in s:
            seen.allof_refs.append((s["$ref"], f"{where}/allOf/{i}"))


_PART_KEYS = {"type", "properties", "required", "additionalProperties", "allOf", "$ref"}


def _check_part(part: dict[str, Any], where: str, param: str) -> None:
    """An allOf part contributes its properties, required names and allOf: nothing else."""
    other = set(part) - ANNOTATIONS - {"$defs", "definitions"} - _PART_KEYS
    if other or part.get("type", "object") != "object":
        raise _bad(where, f"an allOf part with {', '.join(sorted(other)) or 'a type other than object'}", param)


def _odd_value(value: Any, depth: int = 0) -> str | None:
    """What in an enum or const value the converter would misread: NaN and infinities (not
    JSON), an object with a "$ref" (it resolves it as a reference)."""
    if depth > MAX_DEPTH:
        return f"values nested more than {MAX_DEPTH} levels deep"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN or an infinity"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, sub in items:
        if key == "$ref":
            return 'an object with a "$ref" key'
        if problem := _odd_value(sub, depth + 1):
            return problem
    return None


