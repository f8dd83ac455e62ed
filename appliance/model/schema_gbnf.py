"""llama-cpp-python's JSON-schema-to-GBNF converter, behind one function (the structured package
checks and rewrites a schema first: appliance/structured/grammar.py)."""

from __future__ import annotations


def json_schema_gbnf(schema_json: str, prop_order: list[str]) -> str:
    """llama-cpp-python's JSON-schema-to-GBNF converter (pure Python, safe on any thread;
    grammar.py decides first which schemas it may see)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf  # imported when used: it loads libllama

    return str(json_schema_to_gbnf(schema_json, prop_order))
