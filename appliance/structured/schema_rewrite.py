"""A checked schema rewritten into one llama-cpp-python's converter reads right (Rewrite)."""

from __future__ import annotations

import re
from typing import Any

from appliance.errors import BadRequest
from appliance.structured.pattern import json_pattern
from appliance.structured.schema_budget import CONVERT_NS_PER_VISIT, MAX_CONVERT_NS, too_large
from appliance.structured.schema_check import ANNOTATIONS, resolve

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


class Rewrite:
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
            raise too_large(self.param, "its allOf parts merge into too many properties")

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
            target = resolve(self.root, part["$ref"]) if "$ref" in part else part
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
            top = resolve(self.root, top["$ref"])
        out = self.schema(top)
        defs: dict[str, Any] = {}
        done: set[str] = set()
        while len(done) < len(self.names):  # a def's own refs add defs
            for ref in [r for r in self.names if r not in done]:
                defs[self.names[ref]] = self.schema(resolve(self.root, ref))
                done.add(ref)
        return {**out, "$defs": defs} if defs else out


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
