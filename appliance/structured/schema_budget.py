"""The bounds on turning a schema into a grammar: the converter's time, estimated before it
runs (Budget), and the size of the grammar it writes (MAX_GBNF_BYTES)."""

from __future__ import annotations

from typing import Any

from appliance.errors import BadRequest
from appliance.structured.pattern import scan_pattern
from appliance.structured.schema_check import resolve

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


def too_large(param: str, why: str = f"its grammar is larger than {MAX_GBNF_BYTES // 1024} KiB") -> BadRequest:
    return BadRequest(f"{param}: the schema is too large: {why} (fewer properties, or smaller "
                      "maxLength/maxItems, would fit)", param=param)


class Budget:
    """The converter's time on a checked schema, estimated before it runs (MAX_CONVERT_NS).
    Each $ref is followed once: Rewrite gives every one a name of its own, and the converter
    writes a named rule once. allOf parts are counted at every use, as Rewrite merges them.
    `name` bounds the length of the rule names it gives a schema, which its repetitions repeat."""

    def __init__(self, root: dict[str, Any], param: str) -> None:
        self.root, self.param, self.left = root, param, MAX_CONVERT_NS
        self.done: set[str] = set()  # $refs visited: with a name of its own each (Rewrite), one rule each

    def spend(self, ns: int) -> None:
        self.left -= ns
        if self.left < 0:
            raise too_large(self.param, "turning it into a grammar would take too long here (many optional "
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
                self.visit(resolve(self.root, ref), len(ref), open_refs | {ref})
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
            for key, sub in (resolve(self.root, ref) if ref else part)["properties"].items():
                self.visit(sub, name + len(key), opened)
