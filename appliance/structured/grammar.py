"""Structured output: JSON schemas and forced tool calls -> GBNF grammars for llama.cpp.

llama-cpp-python's converter silently ignores some JSON-schema keywords (minimum, maximum,
multipleOf, uniqueItems, not, patternProperties...) and asserts on others, so a schema is
first checked here against the keywords the converter really enforces: anything else is a
400 naming the keyword and where it is, never a silent best effort. Conversions are cached
by schema and run on the HTTP side's worker threads, never on the engine thread; both the
converter's work and the grammar it writes (which the engine thread parses) are bounded.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from appliance.errors import BadRequest
from appliance.structured.pattern import json_pattern, scan_pattern

MAX_SCHEMA_BYTES = 64 * 1024
# llama.cpp parses the grammar on the engine thread, once per choice (~0.1 ms per KiB here,
# nothing else runs meanwhile). Measured: an object of 20 string/number/enum/array properties
# is 17 KiB of GBNF, 8 strings of maxLength 900 are 57 KiB, 16 of them 114 KiB; the cap is
# several ordinary schemas, and at n = 8 costs the engine ~100 ms once.
MAX_GBNF_BYTES = 128 * 1024
# The converter's own time is bounded before it runs, since its output can only be measured
# after: one 64 KiB schema can ask it for gigabytes (maxLength 10**9) or for minutes (allOf
# $refs, which it expands afresh at every use, nested; an object's optional properties,
# whose rules it builds once per suffix), and it may run on the event loop. Measured here:
# 4.4 ns per byte of rule text, 6 us per schema visited, 4 us per pair of optional
# properties; these have some margin, and the bound is ~100 ms at most.
CONVERT_NS_PER_BYTE = 5
CONVERT_NS_PER_VISIT = 10_000
CONVERT_NS_PER_OPTIONAL_PAIR = 5_000
CONVERT_NS_PER_VALUE = 6_000  # per enum value or const, written as a literal at every use (measured 3-5 us)
MAX_CONVERT_NS = 100_000_000
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


def _too_large(param: str, why: str = f"its grammar is larger than {MAX_GBNF_BYTES // 1024} KiB") -> BadRequest:
    return BadRequest(f"{param}: the schema is too large: {why} (fewer properties, or smaller "
                      "maxLength/maxItems, would fit)", param=param)


@dataclass
class _Seen:
    """What one check of a schema found: every subschema (by identity) and every $ref."""
    schemas: set[int] = field(default_factory=set)
    refs: list[tuple[str, str]] = field(default_factory=list)  # ($ref, where)
    allof_refs: list[tuple[str, str]] = field(default_factory=list)  # those that are allOf parts


def _resolve(root: Any, ref: str) -> Any:
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
        if id(_resolve(schema, ref)) not in seen.schemas:
            raise BadRequest(f"{param}: the $ref {ref[:64]!r} at {where} names no schema in this one", param=param)
    for ref, where in seen.allof_refs:  # an allOf part only contributes its properties (and required, allOf)
        target = _resolve(schema, ref)
        if "properties" not in target:
            raise BadRequest(f"{param}: the allOf part at {where} refers to {ref[:64]!r}, which has no 'properties' "
                             "(an allOf part only contributes its properties here)", param=param)
        _check_part(target, ref, param)


def _check(schema: Any, param: str, where: str, depth: int, seen: _Seen) -> None:
    if depth > MAX_DEPTH:
        raise BadRequest(f"{param}: the schema is nested more than {MAX_DEPTH} levels deep", param=param)
    if isinstance(schema, bool):  # the converter reads only objects (additionalProperties: true/false aside)
        raise _bad(where, f"the boolean schema `{json.dumps(schema)}`", param)
    if not isinstance(schema, dict):
        raise BadRequest(f"{param}: the schema at {where} must be an object", param=param)
    seen.schemas.add(id(schema))
    for key in schema:
        if key not in ENFORCED and key not in ANNOTATIONS:
            raise _bad(where, f"the keyword {key!r}", param)
    sub = lambda s, w: _check(s, param, w, depth + 1, seen)  # noqa: E731
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
    if "$ref" in schema:
        if not (isinstance(schema["$ref"], str) and schema["$ref"].startswith("#/")):
            raise _bad(where, "a $ref that is not local ('#/...')", param)
        seen.refs.append((schema["$ref"], where))
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
        if t not in (None, "object"):
            raise _bad(where, f"allOf beside \"type\": {json.dumps(t)}", param)
        for i, s in enumerate(schema["allOf"]):
            if not isinstance(s, dict) or not ("properties" in s or "$ref" in s):
                raise _bad(f"{where}/allOf/{i}", "an allOf part that is not an object schema or a $ref", param)
            _check_part(s, f"{where}/allOf/{i}", param)
            if "$ref" in s:
                seen.allof_refs.append((s["$ref"], f"{where}/allOf/{i}"))
    for key in ("const", "enum"):
        if key in schema and (problem := _odd_value(schema[key])):
            raise BadRequest(f"{param}: {key!r} at {where} holds {problem}, which cannot be enforced here", param=param)


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


def _both(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """Two rewritten schemas for one property, as one; None where that takes more than this:
    the same schema, any value and something, or a bare type and values (a derived schema
    narrowing its base's `kind` to a const)."""
    if a == b or b == ANY_VALUE:
        return a
    if a == ANY_VALUE:
        return b
    for values, bare in ((a, b), (b, a)):
        listed = values.get("enum", [values["const"]] if "const" in values else None)
        if listed is not None and set(values) <= {"enum", "const", "type"} and set(bare) == {"type"} \
                and isinstance(bare["type"], str):
            kept = [v for v in listed if _of_type(v, bare["type"])]
            return {"enum": kept} if kept else None
    return None


def _check_required(required: list[str], properties: dict[str, Any], where: str, param: str) -> None:
    """The converter drops a required name that is not a listed property: nothing would require it."""
    missing = [name for name in required if name not in properties]
    if missing:
        raise BadRequest(f"{param}: 'required' in {where} names {missing[0][:64]!r}, which is not in its 'properties' "
                         "(only listed properties can be required here)", param=param)


def _of_type(value: Any, t: str) -> bool:
    if t == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())
    if t == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    kinds: dict[str, Any] = {"string": str, "boolean": bool, "null": type(None), "object": dict, "array": list}
    return isinstance(value, kinds[t])


class _Budget:
    """The converter's time on a checked schema, estimated before it runs (MAX_CONVERT_NS).
    Each $ref is followed once: _Rewrite gives every one a name of its own, and the converter
    writes a named rule once. allOf parts are counted at every use, as _Rewrite merges them.
    `name` bounds the length of the rule names it gives a schema, which its repetitions repeat."""

    def __init__(self, root: dict[str, Any], param: str) -> None:
        self.root, self.param, self.left = root, param, MAX_CONVERT_NS
        self.done: set[str] = set()  # $refs visited: with a name of its own each (_Rewrite), one rule each

    def spend(self, ns: int) -> None:
        self.left -= ns
        if self.left < 0:
            raise _too_large(self.param, "turning it into a grammar would take too long here (many optional "
                                         "properties, $refs used in many places or large repetitions)")

    def visit(self, s: dict[str, Any], name: int, open_refs: frozenset[str]) -> None:
        repeats = max(s.get("minLength", 0), s.get("maxLength", 0)) + max(s.get("minItems", 0), s.get("maxItems", 0))
        repeats += scan_pattern(s["pattern"])[1] if "pattern" in s else 0
        props = s.get("properties", {})
        optional = len(set(props) - set(s.get("required", ()))) + (s.get("additionalProperties", False) is not False)
        values = len(s["enum"]) if isinstance(s.get("enum"), list) else 0
        self.spend(CONVERT_NS_PER_VISIT + repeats * (name + 24) * CONVERT_NS_PER_BYTE
                   + optional * (optional + 1) // 2 * CONVERT_NS_PER_OPTIONAL_PAIR
                   + (values + ("const" in s)) * CONVERT_NS_PER_VALUE)
        ref = s.get("$ref")
        if ref is not None:
            if ref not in self.done:  # (an open one, a recursive schema, is done too: the converter writes its name)
                self.done.add(ref)
                self.visit(_resolve(self.root, ref), len(ref), open_refs | {ref})
            return
        name += 24  # what the converter adds to a name per level ("-additional-value" at most)
        subs = [x for k in ("anyOf", "prefixItems") for x in s.get(k, ())]
        subs += [s[k] for k in ("items", "additionalProperties") if isinstance(s.get(k), dict)]
        for sub in subs:
            self.visit(sub, name, open_refs)
        for key, sub in props.items():
            self.visit(sub, name + len(key), open_refs)
        for part in s.get("allOf", ()):  # each part's properties, afresh at every use
            ref = part.get("$ref")
            if ref in open_refs:
                continue  # a schema that is allOf itself: merged once
            opened = open_refs | {ref} if ref else open_refs
            for key, sub in (_resolve(self.root, ref) if ref else part)["properties"].items():
                self.visit(sub, name + len(key), opened)


# -- schemas rewritten into what the converter reads right --------------------------------------
# Three of the converter's readings are silent and wrong, so a checked schema is rewritten
# before it gets there. (1) It names a $ref's rule by the ref's last segment and reuses any
# rule already of that name: `#/$defs/x` beside a property `x`, or `#/definitions/x`, or a
# def called `string`, would take that other rule. Every ref is renamed to a fresh def.
# (2) It reads `{}` (any value) as an object, fails on `items: {}`, and reads
# `additionalProperties: true` beside properties as object values. (3) It makes every allOf
# property required, whatever the parts say, and ignores an allOf beside `properties`:
# allOf is merged here, required where some part requires it.
ANY_VALUE: dict[str, Any] = {"type": ["object", "array", "string", "number", "boolean", "null"]}
_RULE_CHARS = re.compile(r"[^a-zA-Z0-9-]+")


class _Rewrite:
    """A checked schema as the converter reads right. Its work is bounded like the
    converter's (it emits at most as many schemas as the budget allows visits): allOf parts
    are merged by reachability, each schema's own properties rewritten once."""

    def __init__(self, root: dict[str, Any], param: str) -> None:
        self.root, self.param = root, param
        self.left = MAX_CONVERT_NS // CONVERT_NS_PER_VISIT
        self.names: dict[str, str] = {}  # $ref -> its fresh def
        self.own: dict[int, dict[str, Any]] = {}  # id(schema) -> its own properties, rewritten
        self.taken = {"root", "dot", "item", "char", "space", "value", "object", "array", "string", "number",
                      "integer", "boolean", "null"}
        self._collect(root)

    def _collect(self, node: Any) -> None:  # every property's rule name, wherever it is
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "properties" and isinstance(value, dict):
                    self.taken.update(_RULE_CHARS.sub("-", name) for name in value)
                self._collect(value)
        elif isinstance(node, list):
            for value in node:
                self._collect(value)

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _too_large(self.param, "its allOf parts merge into too many properties")

    def ref(self, ref: str) -> str:
        if ref not in self.names:  # ends in a letter: never a name the converter numbered
            i = len(self.names)
            while f"def{i}x" in self.taken:
                i += 1
            self.taken.add(f"def{i}x")
            self.names[ref] = f"def{i}x"
        return "#/$defs/" + self.names[ref]

    def schema(self, s: dict[str, Any]) -> dict[str, Any]:
        self.spend()
        if not set(s) - ANNOTATIONS - {"$defs", "definitions"}:
            return dict(ANY_VALUE)
        out: dict[str, Any] = {}
        for key, value in s.items():
            if key in ("$defs", "definitions", "allOf") or key in ANNOTATIONS:
                continue
            if key == "items" and "prefixItems" in s:
                continue  # the converter would take items and drop the tuple; the tuple alone is stricter, and sound
            if key == "$ref":
                value = self.ref(value)
            elif key == "properties":
                value = self.properties(s)
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                value = self.schema(value)
            elif key == "additionalProperties" and value is True:
                value = dict(ANY_VALUE)
            elif key in ("prefixItems", "anyOf"):
                value = [self.schema(sub) for sub in value]
            elif key == "pattern":
                value = json_pattern(value, self.param)
            out[key] = value
        if "required" in s and "allOf" not in s:  # an allOf part's may name another part's properties
            _check_required(s["required"], s.get("properties", {}), "an object", self.param)
        if isinstance(s.get("type"), str) and ("enum" in s or "const" in s):  # the converter ignores the type
            values = [v for v in s.get("enum", [s.get("const")]) if _of_type(v, s["type"])]
            if not values:
                raise BadRequest(f"{self.param}: no value of 'enum'/'const' is of type {s['type']!r}: nothing would "
                                 "match", param=self.param)
            out.pop("const", None)
            out["enum"] = values
        out = self._merge(s, out) if "allOf" in s else out
        if "properties" in out and out.get("additionalProperties", False) is not False:
            # The converter's grammar for optional properties beside extra ones accepts what is not JSON
            # (no comma between them) and lets an extra key repeat a listed one: listed properties only.
            out.pop("additionalProperties")
        return out

    def properties(self, s: dict[str, Any]) -> dict[str, Any]:
        if id(s) not in self.own:
            self.own[id(s)] = {name: self.schema(sub) for name, sub in s.get("properties", {}).items()}
        return self.own[id(s)]

    def _merge(self, s: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
        """`s` and every schema its allOf parts reach, theirs included, as one object."""
        props, required = dict(out.get("properties", {})), list(out.get("required", []))
        seen, parts = {id(s)}, list(s["allOf"])
        limits = [(s, s.get("properties", {}))]  # the schemas whose additionalProperties may refuse others' properties
        while parts:
            part = parts.pop(0)
            target = _resolve(self.root, part["$ref"]) if "$ref" in part else part
            if id(target) in seen:
                continue  # reached twice, or a schema that is allOf itself: already merged
            seen.add(id(target))
            for name, sub in self.properties(target).items():
                self.spend()
                both = _both(props[name], sub) if name in props else sub
                if both is None:
                    raise BadRequest(f"{self.param}: the property {name[:64]!r} is defined differently by two allOf "
                                     "parts (only the same schema, any value, or a type and values of it can be "
                                     "combined here)", param=self.param)
                props[name] = both
            required += [name for name in target.get("required", []) if name not in required]
            limits.append((target, target.get("properties", {})))
            parts += target.get("allOf", [])
        for schema, listed in limits:
            extra = [name for name in props if name not in listed]
            if extra and schema.get("additionalProperties", True) is not True:
                raise BadRequest(f"{self.param}: an allOf adds the property {extra[0][:64]!r} to an object whose "
                                 "'additionalProperties' does not allow it, so nothing with it would match "
                                 "(list it there, or drop additionalProperties)", param=self.param)
        _check_required(required, props, "an allOf", self.param)
        out.update(type="object", properties=props, required=required)
        return out

    def whole(self) -> dict[str, Any]:
        top, seen = self.root, set()  # the converter never registers the refs beside a root $ref: inline it
        while set(top) - ANNOTATIONS - {"$defs", "definitions"} == {"$ref"}:
            if top["$ref"] in seen:
                raise BadRequest(f"{self.param}: the $ref {top['$ref'][:64]!r} refers to itself", param=self.param)
            seen.add(top["$ref"])
            top = _resolve(self.root, top["$ref"])
        out = self.schema(top)
        defs: dict[str, Any] = {}
        done: set[str] = set()
        while len(done) < len(self.names):  # a def's own refs add defs
            for ref in [r for r in self.names if r not in done]:
                defs[self.names[ref]] = self.schema(_resolve(self.root, ref))
                done.add(ref)
        return {**out, "$defs": defs} if defs else out


_JSON_CHAR = r'[^"\\\x7F\x00-\x1F]'
_SAFE_RULES = {"char": rf'char ::= {_JSON_CHAR} | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])',
               "dot": f"dot ::= {_JSON_CHAR}"}


class _GrammarTooLarge(Exception):
    """The converter's grammar is over MAX_GBNF_BYTES (raised, so lru_cache keeps nothing)."""


@lru_cache(maxsize=256)
def _convert(schema_json: str, prop_order: tuple[str, ...]) -> str:
    from appliance.model.llm import json_schema_gbnf  # the llama_cpp user; pure Python, any thread

    gbnf = json_schema_gbnf(schema_json, list(prop_order))
    # Its string characters and pattern dot take raw control characters (and the dot a raw
    # quote or backslash), which no JSON parser reads: JSON strings escape them.
    lines = [_SAFE_RULES.get(line.split(" ::= ")[0], line) if line.startswith(("char ::= ", "dot ::= ")) else line
             for line in gbnf.splitlines()]
    gbnf = "\n".join(lines) + "\n"
    if len(gbnf.encode()) > MAX_GBNF_BYTES:
        raise _GrammarTooLarge  # raised, so never cached
    return gbnf


def schema_grammar(schema: Any, param: str = "response_format.json_schema.schema",
                   prop_order: tuple[str, ...] = ()) -> str:
    """A checked schema's grammar (cached by the schema's JSON). Properties keep the
    schema's order: a model writes `name` before `tags` more naturally than the converter's
    alphabetical default would have it."""
    try:
        text = json.dumps(schema, ensure_ascii=False)
        size = len(text.encode())
    except RecursionError:
        raise BadRequest(f"{param}: the schema is nested too deeply", param=param) from None
    except UnicodeEncodeError:
        raise BadRequest(f"{param}: the schema is not valid Unicode text (it holds a lone surrogate)",
                         param=param) from None
    if size > MAX_SCHEMA_BYTES:
        raise BadRequest(f"{param}: the schema is larger than {MAX_SCHEMA_BYTES // 1024} KiB", param=param)
    check_schema(schema, param)
    try:
        _Budget(schema, param).visit(schema, 0, frozenset())
        whole = _Rewrite(schema, param).whole()
        _Budget(whole, param).visit(whole, 0, frozenset())  # merged allOf parts may hold many optional properties
        rewritten = json.dumps(whole, ensure_ascii=False)
    except RecursionError:
        raise BadRequest(f"{param}: the schema's $refs nest too deeply", param=param) from None
    try:
        return _convert(rewritten, prop_order)
    except _GrammarTooLarge:
        raise _too_large(param) from None
    except Exception as e:  # noqa: BLE001 - whatever else the converter trips on is the schema's, never a 500
        raise BadRequest(f"{param}: the schema cannot be turned into a grammar: {type(e).__name__} {str(e)[:200]}",
                         param=param) from None


def tool_call_grammar(functions: list[dict[str, Any]], parallel: bool) -> str:
    """Force the answer to be one (or, with parallel calls, several) of Qwen's
    `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks, the arguments
    following each function's parameter schema."""
    calls, defs = [], {}
    for i, f in enumerate(functions):
        # Each function's parameters become a def of the whole, their local $refs (pydantic's
        # nested models: "#/$defs/Item") re-rooted there.
        try:
            defs[f"f{i}"] = _rerooted(f.get("parameters") or {"type": "object"}, f"#/$defs/f{i}")
        except RecursionError:
            raise BadRequest(f"tools: the parameters of {f['name'][:64]!r} are nested too deeply", param="tools") from None
        calls.append({"type": "object", "properties": {"name": {"const": f["name"]},
                                                       "arguments": {"$ref": f"#/$defs/f{i}"}},
                      "required": ["name", "arguments"]})
    schema = {**(calls[0] if len(calls) == 1 else {"anyOf": calls}), "$defs": defs}
    call_rules = schema_grammar(schema, "tools", ("name", "arguments"))
    # The converter names its start rule `root`: call it `call` and wrap it in the tags.
    lines = [("call" + line[4:]) if line.startswith("root ::=") else line for line in call_rules.splitlines()]
    block = r'"<tool_call>\n" call "\n</tool_call>"'
    root = f"root ::= {block} (\"\\n\" {block})*" if parallel else f"root ::= {block}"
    return "\n".join([root, *lines])


def _rerooted(node: Any, root: str) -> Any:
    """A schema moved under `root`: its "#/..." $refs point where they did. (A "$ref" key in a
    value is refused by the check either way.)"""
    if isinstance(node, list):
        return [_rerooted(v, root) for v in node]
    if not isinstance(node, dict):
        return node
    return {k: (root + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#/") else _rerooted(v, root))
            for k, v in node.items()}
