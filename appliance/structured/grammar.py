"""Structured output: JSON schemas and forced tool calls -> GBNF grammars for llama.cpp.

A schema is checked (schema_check), bounded (schema_budget) and rewritten (schema_rewrite)
before llama-cpp-python's converter sees it. Conversions are cached by schema and run on the
HTTP side's worker threads, never on the engine thread; both the converter's work and the
grammar it writes (which the engine thread parses) are bounded.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from appliance.errors import BadRequest
from appliance.structured.schema_budget import MAX_GBNF_BYTES, Budget, too_large
from appliance.structured.schema_check import check_schema
from appliance.structured.schema_rewrite import Rewrite

MAX_SCHEMA_BYTES = 64 * 1024

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


_JSON_CHAR = r'[^"\\\x7F\x00-\x1F]'
_SAFE_RULES = {"char": rf'char ::= {_JSON_CHAR} | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])',
               "dot": f"dot ::= {_JSON_CHAR}"}


class _GrammarTooLarge(Exception):
    """The converter's grammar is over MAX_GBNF_BYTES (raised, so lru_cache keeps nothing)."""


@lru_cache(maxsize=256)
def _convert(schema_json: str, prop_order: tuple[str, ...]) -> str:
    from appliance.model.schema_gbnf import json_schema_gbnf  # the llama_cpp user; pure Python, any thread

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
        Budget(schema, param).visit(schema, 0, frozenset())
        whole = Rewrite(schema, param).whole()
        Budget(whole, param).visit(whole, 0, frozenset())  # merged allOf parts may hold many optional properties
        rewritten = json.dumps(whole, ensure_ascii=False)
    except RecursionError:
        raise BadRequest(f"{param}: the schema's $refs nest too deeply", param=param) from None
    try:
        return _convert(rewritten, prop_order)
    except _GrammarTooLarge:
        raise too_large(param) from None
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
