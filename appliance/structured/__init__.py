"""Structured output: JSON schemas and their patterns as grammars, and tool calls."""
