"""Tests for appliance.structured.grammar: which schemas reach the converter, and what it may cost.

No model: the converter is llama-cpp-python's pure-Python one. A schema refused "before
conversion" is checked with the converter replaced by a test failure (pytest's outcomes are
BaseExceptions, so no `except Exception` swallows them).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any

import pytest
from helpers import gbnf
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.errors import BadRequest
from appliance.structured import grammar, schema_budget
from appliance.structured.grammar import MAX_GBNF_BYTES, schema_grammar, tool_call_grammar

PARAM = "response_format.json_schema.schema"


def S(**kw: Any) -> dict[str, Any]:
    return {"type": "string", **kw}


def refused(schema: Any, *named: str, param: str = PARAM) -> BadRequest:
    with pytest.raises(BadRequest) as e:
        schema_grammar(schema, param)
    assert e.value.status == 400 and e.value.param == param
    for text in named:
        assert text in e.value.message, e.value.message
    return e.value


# "Quickly", counted rather than timed (a busy machine stretches any time): Python function
# calls made, under 10**5, where the conversions refused below make millions. Measured: 14k
# calls (24 ms of CPU here) for the 58 KB schema, 36k for allOf $refs at any depth.
QUICK_CALLS = 10**5


def calls_made(work: Callable[[], object]) -> int:
    """Python function calls `work` makes (exceptions pass through once counted)."""
    n = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal n
        n += event == "call"

    sys.setprofile(count)
    try:
        work()
    finally:
        sys.setprofile(None)
    return n


@pytest.fixture
def no_converter(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: Any) -> str:
        pytest.fail("the schema reached the converter")
    monkeypatch.setattr(grammar, "_convert", boom)


# -- schemas the converter cannot read: 400s naming the place, never a 500 ----------------------
@pytest.mark.parametrize("schema, where", [
    (True, "#"),
    (False, "#"),
    ({"type": "object", "properties": {"a": True}}, "#/properties/a"),
    ({"type": "array", "items": True, "minItems": 2}, "#/items"),
    ({"anyOf": [True]}, "#/anyOf/0"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/t"}}, "$defs": {"t": True}}, "#/$defs/t"),
])
def test_boolean_subschemas_are_400s(schema: Any, where: str, no_converter: None) -> None:
    refused(schema, "boolean schema", where)


def test_additional_properties_may_still_be_true_or_false() -> None:
    for flag in (True, False):
        assert schema_grammar({"type": "object", "properties": {"a": S()}, "additionalProperties": flag})


@pytest.mark.parametrize("schema, named", [
    (S(pattern=5), "'pattern'"),
    (S(pattern=["^a$"]), "'pattern'"),
    (S(format=[]), "'format'"),
    (S(format={}), "'format'"),
    (S(format=None), "'format'"),
])
def test_pattern_and_format_must_be_strings(schema: dict[str, Any], named: str, no_converter: None) -> None:
    refused(schema, named, "must be a string")


@pytest.mark.parametrize("schema, ref", [
    ({"$ref": "#/$defs/a/type", "$defs": {"a": S()}}, "#/$defs/a/type"),  # a string
    ({"type": "object", "properties": {"x": {"$ref": "#/properties"}}}, "#/properties"),  # a map of schemas
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/b"}}, "$defs": {"a": S()}}, "#/$defs/b"),  # nothing
    ({"type": "object", "properties": {"x": {"$ref": "#/required"}}, "required": ["x"]}, "#/required"),  # a list
])
def test_a_ref_must_name_a_schema(schema: dict[str, Any], ref: str, no_converter: None) -> None:
    refused(schema, repr(ref), "names no schema")


def test_refs_to_schemas_convert() -> None:
    defs = {"node": {"type": "object", "properties": {"name": S(), "kids": {"type": "array",
                                                                            "items": {"$ref": "#/$defs/node"}}}}}
    g = schema_grammar({"type": "object", "properties": {"root": {"$ref": "#/$defs/node"}}, "$defs": defs})
    assert "kids" in g
    assert schema_grammar({"type": "object", "properties": {"a": {"$ref": "#/properties/b"}, "b": S(maxLength=3)}})


def test_an_allof_ref_must_bring_properties(no_converter: None) -> None:
    schema = {"type": "object", "properties": {"x": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$defs": {"a": S()}}
    refused(schema, "#/properties/x/allOf/0", "no 'properties'")


def test_any_other_converter_failure_is_a_400(monkeypatch: pytest.MonkeyPatch) -> None:
    refused(S(pattern="^a)$"), "cannot be turned into a grammar")  # AssertionError inside the converter
    refused(S(pattern="^{3}$"), "follows nothing")  # once an IndexError inside it, now refused before

    def broken(*_: Any) -> str:
        raise AttributeError("'int' object has no attribute 'get'")
    monkeypatch.setattr("appliance.model.schema_gbnf.json_schema_gbnf", broken)
    grammar._convert.cache_clear()
    refused(S(maxLength=7), "cannot be turned into a grammar", "AttributeError")
    grammar._convert.cache_clear()


# -- patterns whose grammar could never go on (llama.cpp would abort on the refused token) ------
@pytest.mark.parametrize("pattern, named", [
    ("^[z-a]$", "'z-a' is inverted"),
    ("^[a-cz-a]$", "'z-a' is inverted"),
    ("^x[\\x7a-\\x61]+$", "inverted"),
    ("^[a-\\]]$", "inverted"),  # ']' (93) is below 'a'
    ("^[]$", "'[]' is empty"),
    ("^[^]$", "'[^]' is empty"),
    ("^ab[]*c$", "is empty"),
    ("^[^\\x00-\\U0010FFFF]$", "no character is outside"),
    ("^[^\\x00-\\uffff\\U00010000-\\U0010FFFF]$", "no character is outside"),
])
def test_patterns_that_match_nothing_are_400s(pattern: str, named: str, no_converter: None) -> None:
    refused(S(pattern=pattern), "the pattern at #", named)


@pytest.mark.parametrize("pattern", [
    "^[a-z]$", "^[a-z0-9_-]+$", "^[-a]$", "^[a-]$", "^[\\]a]$", "^[\\-a]$", "^[\\x41-\\x5a]{2}$",
    "^[^a-z]$", "^[^\\x00-\\uffff]$", "^\\[z-a\\]$", "^a{2,5}$", "^a{,5}$", "^a{3}$", "^a{2,}$",
])
def test_ordinary_patterns_still_convert(pattern: str) -> None:
    assert schema_grammar(S(pattern=pattern))


@pytest.mark.parametrize("pattern, named", [
    ("^a]$", "']'"),
    ("^a}$", "'}'"),
    ("^[a]]$", "']'"),
    ("^(a|b)]x$", "']'"),
])
def test_a_stray_closing_bracket_is_a_400_not_a_converter_that_never_returns(pattern: str, named: str,
                                                                             no_converter: None) -> None:
    refused(S(pattern=pattern), named, "closes nothing")


def test_an_escape_the_grammar_cannot_read_inside_a_class_is_a_400(no_converter: None) -> None:
    refused(S(pattern="^[\\d]+$"), "'\\\\d'", "character class")
    refused(S(pattern="^[\\x4]$"), "'\\\\x'")  # \x takes two hex digits


def test_an_escaped_final_dollar_is_a_400(no_converter: None) -> None:
    refused(S(pattern="^a\\$"), "escaped")


# -- contradictory bounds: nothing could match, never a silent "keep the minimum" ---------------
@pytest.mark.parametrize("schema, named", [
    (S(minLength=5, maxLength=2), "'minLength'"),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 1}, "'minItems'"),
    (S(pattern="^a{5,2}$"), "'{5,2}'"),
    (S(pattern="^a{-1}$"), "'{-1}'"),
])
def test_contradictory_bounds_are_400s(schema: dict[str, Any], named: str, no_converter: None) -> None:
    refused(schema, named)


def test_minimum_and_maximum_are_refused_as_unenforced() -> None:
    refused({"type": "integer", "minimum": 5, "maximum": 1}, "'minimum'")


def test_equal_bounds_are_fine() -> None:
    assert schema_grammar(S(minLength=2, maxLength=2))
    assert schema_grammar({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 1})


# -- the grammar's size and the converter's time are bounded -----------------------------------
def ordinary(n: int = 20) -> dict[str, Any]:
    """An object of string, number, enum and array properties, as forms and extractions ask."""
    kinds = [S(maxLength=200), {"type": "number"}, {"enum": ["alpha", "beta", "gamma", "delta"]},
             {"type": "array", "items": S(maxLength=100), "maxItems": 20}]
    props = {f"field_{i}": kinds[i % 4] for i in range(n)}
    return {"type": "object", "properties": props, "required": list(props)}


def test_an_ordinary_schema_is_well_under_the_cap() -> None:
    g = schema_grammar(ordinary())
    assert len(g.encode()) * 4 < MAX_GBNF_BYTES  # 17 KiB
    assert schema_grammar({"type": "object", "properties": {f"p{i}": S(maxLength=900) for i in range(16)}})


def test_the_reports_58_kb_schema_is_refused_quickly_and_before_conversion(no_converter: None) -> None:
    props = {f"p{i}": S(maxLength=900) for i in range(1200)}  # 8.7 MB of GBNF, 1.7 s per choice to parse
    calls = calls_made(lambda: refused({"type": "object", "properties": props, "required": list(props)}, "too large"))
    assert calls < QUICK_CALLS


def test_a_grammar_over_the_cap_is_refused_and_not_cached() -> None:
    props = {f"p{i}": S(maxLength=1000) for i in range(20)}  # ~158 KiB of GBNF
    grammar._convert.cache_clear()
    refused({"type": "object", "properties": props, "required": list(props)}, "too large",
            f"{MAX_GBNF_BYTES // 1024} KiB")
    assert grammar._convert.cache_info().currsize == 0


@pytest.mark.parametrize("schema", [
    S(maxLength=10**9),  # gigabytes of nested optionals
    S(pattern="^a{0,1000000000}$"),
    {"type": "array", "items": {"type": "integer"}, "minItems": 10**12},
    {"type": "object", "properties": {f"f{i}": {"type": "integer"} for i in range(900)}},  # quadratic: ~2 s
])
def test_work_the_converter_cannot_finish_in_time_is_refused_before_it_starts(schema: dict[str, Any],
                                                                               no_converter: None) -> None:
    refused(schema, "too large")


def test_allof_refs_expanded_at_every_use_are_bounded(no_converter: None) -> None:
    # The converter re-expands an allOf $ref's properties at every use: 10**5 visits, ~1 s,
    # from a 2 KB schema (10**6 and 10 s one level deeper).
    defs: dict[str, Any] = {"L0": {"type": "object", "properties": {"x": S(maxLength=5)}}}
    for d in range(1, 6):
        defs[f"L{d}"] = {"type": "object", "properties": {"p": {"allOf": [{"$ref": f"#/$defs/L{d - 1}"}] * 10}}}
    calls = calls_made(lambda: refused({"type": "object", "properties": {"r": {"$ref": "#/$defs/L5"}}, "$defs": defs},
                                       "too large"))
    assert calls < QUICK_CALLS


def test_tool_call_grammar_names_tools_when_too_large() -> None:
    fn = {"name": "f", "parameters": {"type": "object", "properties": {"a": S(maxLength=10**7)}}}
    with pytest.raises(BadRequest) as e:
        tool_call_grammar([fn], False)
    assert e.value.param == "tools" and "too large" in e.value.message


@settings(derandomize=True, max_examples=400, deadline=None, database=None)
@given(st.text(alphabet="az-^\\]x[u4f1d{},()|*+?.\"", max_size=12))
def test_any_pattern_is_a_grammar_or_a_400(body: str) -> None:
    """Never a 500, and never a converter that does not return (a stray ']' once looped forever);
    a grammar it gives is one the recognizer reads, and it takes no raw quote or line break."""
    try:
        g = schema_grammar(S(pattern=f"^{body}$"))
    except BadRequest as e:
        assert e.status == 400 and e.param == PARAM
        return
    assert "root" in gbnf.parse(g)
    assert not gbnf.accepts(g, '"""') and not gbnf.accepts(g, '"\n"')


# -- what the grammar accepts: the converter's silent misreadings, rewritten away ---------------
def takes(schema: dict[str, Any], *docs: Any) -> bool:
    g = schema_grammar(schema)
    return all(gbnf.accepts(g, json.dumps(d)) for d in docs)


def test_the_recognizer_reads_llama_cpps_json_grammar() -> None:
    assert gbnf.accepts(grammar.JSON_OBJECT, '{"a": [1, "x", {"b": null}]}')
    assert not gbnf.accepts(grammar.JSON_OBJECT, "[1]")
    assert not gbnf.accepts(grammar.JSON_OBJECT, '{"a": 1')


@pytest.mark.parametrize("schema", [
    # a property whose rule is named like the def
    {"type": "object", "properties": {"x": S(maxLength=3), "y": {"$ref": "#/$defs/x"}}, "required": ["x", "y"],
     "$defs": {"x": {"type": "integer"}}},
    # the same last segment under $defs and definitions
    {"type": "object", "properties": {"x": {"$ref": "#/definitions/x"}, "y": {"$ref": "#/$defs/x"}},
     "required": ["x", "y"], "$defs": {"x": {"type": "integer"}}, "definitions": {"x": S(maxLength=3)}},
    # a def named like a primitive rule that is already in the grammar
    {"type": "object", "properties": {"x": S(maxLength=3), "y": {"$ref": "#/$defs/string"}},
     "required": ["x", "y"], "$defs": {"string": {"type": "integer"}}},
])
def test_a_ref_gets_its_own_schema_whatever_else_shares_its_name(schema: dict[str, Any]) -> None:
    assert takes(schema, {"x": "ab", "y": 5})
    assert not takes(schema, {"x": "ab", "y": "ab"})


def test_a_recursive_ref_still_converts() -> None:
    tree = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}}}
    assert takes(tree, {"v": 1}, {"v": 1, "kids": [{"v": 2, "kids": []}]})
    assert not takes(tree, {"v": 1, "kids": [{"kids": []}]})


@pytest.mark.parametrize("empty", [{}, {"description": "anything"}])
def test_an_empty_schema_takes_any_value(empty: dict[str, Any]) -> None:
    obj = {"type": "object", "properties": {"a": empty}, "required": ["a"]}
    assert takes(obj, {"a": "text"}, {"a": 1.5}, {"a": [1, "x"]}, {"a": None}, {"a": {"k": True}})
    assert takes({"type": "array", "items": empty}, [], [1, "x", None, {"k": []}])
    assert takes({"type": "object", "additionalProperties": empty}, {}, {"b": 3, "c": "x", "d": [None]})


@pytest.mark.parametrize("extra", [True, {}, {"type": "integer"}])
def test_beside_listed_properties_extra_ones_are_left_out(extra: Any) -> None:
    # The converter's grammar for them accepts `{"a": "x""b": 1}` and a listed key again as an extra.
    for required in ([], ["a"]):
        schema = {"type": "object", "properties": {"a": S(), "c": S()}, "required": required,
                  "additionalProperties": extra}
        g = schema_grammar(schema)
        assert takes(schema, {"a": "x"}, {"a": "x", "c": "y"})
        assert not gbnf.accepts(g, '{"a": "x""b": 1}') and not takes(schema, {"a": 5}, {"a": "x", "b": 1})


def test_a_map_takes_what_additional_properties_allows() -> None:
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert takes(schema, {}, {"b": 1, "c": 2})
    assert not takes(schema, {"b": "x"})


def test_allof_requires_what_some_part_requires_and_no_more() -> None:
    schema = {"allOf": [{"type": "object", "properties": {"a": S()}, "required": ["a"]},
                        {"$ref": "#/$defs/b"}], "$defs": {"b": {"type": "object", "properties": {"b": {"type": "integer"}}}}}
    assert takes(schema, {"a": "x"}, {"a": "x", "b": 1})
    assert not takes(schema, {"b": 1})
    assert not takes(schema, {"a": "x", "b": "y"})


def test_allof_beside_properties_adds_to_them() -> None:
    schema = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
              "allOf": [{"properties": {"name": S()}, "required": ["name"]}]}
    assert takes(schema, {"id": 1, "name": "n"})
    assert not takes(schema, {"id": 1})


def test_allof_parts_that_disagree_on_a_property_are_400s() -> None:
    refused({"allOf": [{"properties": {"a": S()}}, {"properties": {"a": {"type": "integer"}}}]},
            "'a'", "defined differently")
    assert takes({"allOf": [{"properties": {"a": S()}}, {"properties": {"a": S()}, "required": ["a"]}]}, {"a": "x"})


def test_refs_and_allofs_that_contain_themselves_are_400s() -> None:
    refused({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}, "refers to itself")



def test_an_allof_that_contains_itself_is_its_own_properties() -> None:
    schema = {"$ref": "#/$defs/a", "$defs": {
        "a": {"properties": {"x": S()}, "required": ["x"], "allOf": [{"$ref": "#/$defs/b"}]},
        "b": {"properties": {"y": {"type": "integer"}}, "required": ["y"], "allOf": [{"$ref": "#/$defs/a"}]}}}
    assert takes(schema, {"x": "s", "y": 1})
    assert not takes(schema, {"x": "s"})


def test_allof_parts_reached_many_ways_are_merged_once() -> None:
    n = 40  # each part names the next twice: 2**40 ways to reach the last
    defs = {f"d{i}": {"properties": {f"p{i}": S()}, "required": [f"p{i}"],
                      "allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(n)}
    defs[f"d{n}"] = {"properties": {"last": {"type": "integer"}}}
    g = schema_grammar({"$ref": "#/$defs/d0", "$defs": defs})
    doc = {f"p{i}": "x" for i in range(n)}
    assert gbnf.accepts(g, json.dumps(doc)) and gbnf.accepts(g, json.dumps({**doc, "last": 3}))
    assert not gbnf.accepts(g, json.dumps({k: v for k, v in doc.items() if k != "p39"}))


def test_allof_chains_that_merge_into_too_many_properties_are_refused(no_converter: None) -> None:
    n = 300  # every def reaches all the later ones: n**2 / 2 merged properties
    defs = {f"c{i}": {"properties": {f"p{i}": S()}, "allOf": [{"$ref": f"#/$defs/c{i + 1}"}]} for i in range(n)}
    defs[f"c{n}"] = {"properties": {"end": S()}}
    schema = {"type": "object", "properties": {f"x{i}": {"$ref": f"#/$defs/c{i}"} for i in range(n)},
              "required": [f"x{i}" for i in range(n)], "$defs": defs}
    schema_budget.Budget(schema, PARAM).visit(schema, 0, frozenset())  # what the converter alone would do is in bounds
    refused(schema, "too large", "too many properties")


def test_optional_properties_that_allof_merges_into_one_object_are_bounded(no_converter: None) -> None:
    n = 250  # each part has one optional property; merged, the converter would build 250 * 251 / 2 rules
    defs = {f"c{i}": {"properties": {f"p{i}": S()}, "allOf": [{"$ref": f"#/$defs/c{i + 1}"}]} for i in range(n)}
    defs[f"c{n}"] = {"properties": {"end": S()}}
    schema = {"allOf": [{"$ref": "#/$defs/c0"}], "$defs": defs}
    schema_budget.Budget(schema, PARAM).visit(schema, 0, frozenset())  # unmerged, it looks small
    refused(schema, "too large", "take too long")


def test_strings_never_hold_raw_control_characters() -> None:
    obj = {"type": "object", "properties": {"a": S(), "b": S(pattern="^.x$")}, "required": ["a", "b"]}
    assert takes(obj, {"a": "line\nbreak \"quoted\" \\", "b": "ax"})  # escaped, as JSON writes them
    g = schema_grammar(obj)
    assert not gbnf.accepts(g, '{"a": "raw\nline", "b": "ax"}')
    for dot in ('"', "\\", "\t"):  # a pattern's dot takes no character a JSON string must escape
        assert not gbnf.accepts(g, '{"a": "x", "b": "' + dot + 'x"}')


def test_a_tuple_stays_a_tuple_beside_items() -> None:
    for items in ({}, S()):
        schema = {"type": "array", "prefixItems": [{"type": "integer"}], "items": items}
        assert takes(schema, [1]) and not takes(schema, ["a"])


def test_allof_cannot_add_what_an_additional_properties_refuses() -> None:
    refused({"type": "object", "properties": {"b": S()}, "allOf": [{"properties": {"a": {"type": "integer"}}}],
             "additionalProperties": False}, "'a'", "does not allow")
    refused({"allOf": [{"properties": {"a": S()}, "additionalProperties": {"type": "integer"}},
                       {"properties": {"b": S()}}]}, "'b'", "does not allow")


@pytest.mark.parametrize("schema, named", [
    ({"type": "integer", "enum": [1], "maximum": 3}, "'maximum'"),  # refused as unenforced, first
    ({"enum": ["a", "b"], "pattern": "^a$", "type": "string"}, "'enum' beside pattern"),
    ({"const": "abc", "type": "string", "maxLength": 1}, "'const' beside maxLength"),
    (S(pattern="^a+$", maxLength=2), "'pattern' beside maxLength"),
    (S(format="date", maxLength=3), "'format' beside maxLength"),
    ({"type": "array", "prefixItems": [S()], "minItems": 2, "items": S()}, "'prefixItems' beside minItems"),
])
def test_keywords_the_converter_would_let_one_another_override_are_400s(schema: dict[str, Any], named: str,
                                                                      no_converter: None) -> None:
    refused(schema, named)


def test_enum_and_const_keep_only_values_of_the_type() -> None:
    assert takes({"type": "integer", "enum": [1, "a", 2.0, True]}, 1, 2.0)
    assert not takes({"type": "integer", "enum": [1, "a", True]}, "a")
    assert not takes({"type": "integer", "enum": [1, "a", True]}, True)
    refused({"type": "string", "const": 5}, "nothing would match")


def test_required_names_must_be_listed_properties(no_converter: None) -> None:  # refused before conversion
    refused({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "'b'", "not in its 'properties'")
    refused({"type": "object", "required": ["b"], "additionalProperties": True}, "'b'")


def test_required_names_across_allof_parts_may_come_from_another_part() -> None:
    schema = {"allOf": [{"properties": {"a": S()}}, {"properties": {"b": S()}, "required": ["a", "b"]}]}
    assert takes(schema, {"a": "x", "b": "y"}) and not takes(schema, {"b": "y"})


def test_pattern_escapes_become_classes() -> None:
    phone = S(pattern=r"^\d{3}-\d{4}$")
    assert takes(phone, "555-1234") and not takes(phone, "55a-1234")
    assert takes(S(pattern=r"^\w+\.txt$"), "notes_1.txt") and not takes(S(pattern=r"^\w+\.txt$"), "notesXtxt")
    assert takes(S(pattern=r"^\D\x41$"), "xA") and not takes(S(pattern=r"^\D\x41$"), "1A")


@pytest.mark.parametrize("pattern", [r"^[^,]+$", r"^[ -~]+$", r"^\S+$", r"^.+$"])
def test_pattern_classes_take_no_character_json_must_escape(pattern: str) -> None:
    g = schema_grammar(S(pattern=pattern))
    assert gbnf.accepts(g, json.dumps("ab~c"))
    for raw in ('"', "\\", "\n"):  # the raw character inside the document's string
        assert not gbnf.accepts(g, '"a' + raw + 'b"')


@pytest.mark.parametrize("pattern, named", [
    (r'^[\\"]$', "escaped"), (r'^a"b$', "escaped"), (r"^a\\b$", "escaped"), (r"^\x22$", "escaped"),
    (r"^a\nb$", "cannot be enforced"), (r"^\bx$", "cannot be enforced"), (r"^(a)\1$", "cannot be enforced"),
    (r"^|+$", "follows nothing"), (r"^(?:ab)$", "(?...)"),
])
def test_patterns_needing_escaped_characters_or_unsupported_syntax_are_400s(pattern: str, named: str) -> None:
    refused(S(pattern=pattern), named)


def test_enum_values_repeated_at_every_use_are_bounded(no_converter: None) -> None:
    # 48 KB: a 3,000-value enum that allOf copies into 600 properties (seconds of converter work).
    defs = {"P": {"properties": {"x": {"enum": list(range(3000))}}, "required": ["x"]}}
    props = {f"p{i}": {"allOf": [{"$ref": "#/$defs/P"}]} for i in range(600)}
    refused({"type": "object", "properties": props, "required": list(props), "$defs": defs}, "too large")


def test_a_ref_used_in_many_places_is_counted_once() -> None:
    # Six levels of defs, each used by eight properties of the next: 8**6 uses, six rules.
    defs: dict[str, Any] = {"d0": {"type": "object", "properties": {"v": S()}, "required": ["v"]}}
    for d in range(1, 7):
        props = {f"k{k}": {"$ref": f"#/$defs/d{d - 1}"} for k in range(8)}
        defs[f"d{d}"] = {"type": "object", "properties": props, "required": list(props)}
    g = schema_grammar({"$ref": "#/$defs/d6", "$defs": defs})
    assert sorted(line.split(" ::= ")[0] for line in g.splitlines() if re.match(r"def\d+x ::= ", line)) == [
        f"def{i}x" for i in range(6)]  # d5 .. d0, one rule each, named in the order they are met
    d1 = {f"k{k}": {"v": "x"} for k in range(8)}
    assert gbnf.accepts(g, json.dumps(d1), start="def4x")
    assert not gbnf.accepts(g, json.dumps({**d1, "k7": {}}), start="def4x")


@pytest.mark.parametrize("schema, named", [
    ({"type": "string", "allOf": [{"properties": {"a": S()}}]}, 'allOf beside "type": "string"'),
    ({"allOf": [{"properties": {"a": S()}, "items": S()}]}, "an allOf part with items"),
    ({"allOf": [{"$ref": "#/$defs/p"}], "$defs": {"p": {"properties": {"a": S()}, "prefixItems": [S()]}}},
     "an allOf part with prefixItems"),
    ({"allOf": [{"properties": {"a": S()}, "enum": [{"a": "x"}]}]}, "'enum' beside properties"),
    ({"const": float("nan")}, "NaN"),
    ({"enum": [1, float("inf")]}, "NaN or an infinity"),
    ({"const": {"$ref": "#/$defs/x"}}, '"$ref" key'),
    ({"enum": [[{"k": {"$ref": "y"}}]]}, '"$ref" key'),
])
def test_what_the_converter_would_drop_or_misread_in_values_and_parts_is_a_400(schema: dict[str, Any],
                                                                             named: str) -> None:
    refused(schema, named)


def test_tool_parameters_keep_their_own_defs() -> None:
    # What pydantic (and the openai SDK's pydantic_function_tool) writes for a nested model.
    params = {"type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}}, "required": ["item"],
              "$defs": {"Item": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}
    g = tool_call_grammar([{"name": "add", "parameters": params}, {"name": "noop", "parameters": {}}], parallel=False)
    call = '<tool_call>\n{"name": "add", "arguments": %s}\n</tool_call>'
    assert gbnf.accepts(g, call % json.dumps({"item": {"n": 1}}))
    assert not gbnf.accepts(g, call % json.dumps({"item": {"n": "x"}}))
    assert gbnf.accepts(g, '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>')


def test_schemas_nested_past_what_python_can_walk_are_400s() -> None:
    deep: Any = {}
    for _ in range(5000):
        deep = {"a": deep}
    refused({"const": deep}, "nested too deeply")
    with pytest.raises(BadRequest, match="nested too deeply"):
        tool_call_grammar([{"name": "f", "parameters": {"type": "object", "default": deep}}], parallel=False)


def test_a_derived_schema_may_narrow_its_bases_property_to_values() -> None:
    base = {"type": "object", "properties": {"kind": S(), "name": S(), "any": {}}, "required": ["kind", "name"]}
    dog = {"allOf": [{"$ref": "#/$defs/base"}, {"properties": {"kind": {"const": "dog"}, "any": {"type": "integer"}}}],
           "$defs": {"base": base}}
    assert takes(dog, {"kind": "dog", "name": "Rex"}, {"kind": "dog", "name": "Rex", "any": 3})
    assert not takes(dog, {"kind": "cat", "name": "Tom"})
    assert not takes(dog, {"kind": "dog", "name": "Rex", "any": "x"})
    refused({"allOf": [{"properties": {"k": {"type": "integer"}}}, {"properties": {"k": {"const": "dog"}}}]},
            "'k'", "defined differently")
