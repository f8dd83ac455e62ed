"""A small GBNF recognizer for tests: does a grammar, as llama.cpp would read it, accept a text?

It reads what our grammars contain (one rule per line; literals, character classes, `.`,
rule names, groups, `|`, `?`, `*`, `+`, `{m}`, `{m,}`, `{m,n}`) and matches by computing every
position where each piece can end, so it needs no backtracking and no left-recursion (our
grammars have none). Slow and simple, on purpose: it checks the grammar, not the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
_HEX = {"x": 2, "u": 4, "U": 8}


@dataclass(frozen=True)
class Node:
    kind: str  # "lit", "class", "ref", "seq", "alt", "rep"
    args: tuple = ()


class Parser:
    def __init__(self, text: str) -> None:
        self.text, self.i = text, 0

    def char(self) -> str:
        c = self.text[self.i]
        if c != "\\":
            self.i += 1
            return c
        e = self.text[self.i + 1]
        if e in _HEX:
            n = _HEX[e]
            self.i += 2 + n
            return chr(int(self.text[self.i - n:self.i], 16))
        self.i += 2
        return _ESCAPES[e]

    def skip(self) -> None:
        while self.i < len(self.text) and self.text[self.i] in " \t":
            self.i += 1

    def alt(self) -> Node:
        options = [self.seq()]
        while self.i < len(self.text) and self.text[self.i] == "|":
            self.i += 1
            options.append(self.seq())
        return options[0] if len(options) == 1 else Node("alt", tuple(options))

    def seq(self) -> Node:
        items = []
        while True:
            self.skip()
            if self.i >= len(self.text) or self.text[self.i] in "|)":
                return Node("seq", tuple(items))
            items.append(self.postfix(self.atom()))

    def atom(self) -> Node:
        c = self.text[self.i]
        if c == '"':
            self.i += 1
            out = []
            while self.text[self.i] != '"':
                out.append(self.char())
            self.i += 1
            return Node("lit", ("".join(out),))
        if c == "[":
            self.i += 1
            negated = self.text[self.i] == "^"
            self.i += negated
            ranges = []
            while self.text[self.i] != "]":
                lo = hi = self.char()
                if self.text[self.i] == "-" and self.text[self.i + 1] != "]":
                    self.i += 1
                    hi = self.char()
                ranges.append((lo, hi))
            self.i += 1
            return Node("class", (negated, tuple(ranges)))
        if c == ".":
            self.i += 1
            return Node("class", (True, ()))
        if c == "(":
            self.i += 1
            inner = self.alt()
            assert self.text[self.i] == ")", self.text[self.i:]
            self.i += 1
            return inner
        start = self.i
        while self.i < len(self.text) and (self.text[self.i].isalnum() or self.text[self.i] == "-"):
            self.i += 1
        assert self.i > start, f"cannot read {self.text[start:start + 20]!r}"
        return Node("ref", (self.text[start:self.i],))

    def postfix(self, node: Node) -> Node:
        while self.i < len(self.text) and self.text[self.i] in "?*+{":
            c = self.text[self.i]
            if c == "{":
                end = self.text.index("}", self.i)
                nums = self.text[self.i + 1:end].split(",")
                self.i = end + 1
                lo = int(nums[0] or 0)
                hi = lo if len(nums) == 1 else int(nums[1]) if nums[1].strip() else None
            else:
                self.i += 1
                lo, hi = {"?": (0, 1), "*": (0, None), "+": (1, None)}[c]
            node = Node("rep", (node, lo, hi))
        return node


def parse(grammar: str) -> dict[str, Node]:
    rules = {}
    for line in grammar.splitlines():
        if "::=" in line:
            name, body = line.split("::=", 1)
            p = Parser(body.strip())
            rules[name.strip()] = p.alt()
            assert p.i == len(p.text), f"unread: {p.text[p.i:]!r}"
    return rules


def accepts(grammar: str, text: str, start: str = "root") -> bool:
    rules = parse(grammar)

    @cache
    def ends(node: Node, pos: int) -> frozenset[int]:
        kind, args = node.kind, node.args
        if kind == "lit":
            return frozenset({pos + len(args[0])}) if text.startswith(args[0], pos) else frozenset()
        if kind == "class":
            if pos >= len(text):
                return frozenset()
            inside = any(lo <= text[pos] <= hi for lo, hi in args[1])
            return frozenset({pos + 1}) if inside != args[0] else frozenset()
        if kind == "ref":
            return ends(rules[args[0]], pos)
        if kind == "alt":
            return frozenset().union(*(ends(a, pos) for a in args))
        if kind == "seq":
            here = frozenset({pos})
            for item in args:
                here = frozenset().union(*(ends(item, p) for p in here))
            return here
        inner, lo, hi = args  # "rep"
        here, out, n = frozenset({pos}), set(), 0
        while here and (hi is None or n <= hi):
            if n >= lo:
                out |= here
            if hi is not None and n == hi:
                break
            nxt = frozenset().union(*(ends(inner, p) for p in here)) - (out if n >= lo else set())
            here, n = nxt, n + 1
        return frozenset(out)

    return len(text) in ends(rules[start], 0)
