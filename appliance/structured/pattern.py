"""JSON-schema patterns, read as llama-cpp-python's converter and llama.cpp read them.

`scan_pattern` finds what the converter would refuse, loop on or turn into a grammar that
matches nothing, and how many repetitions the quantifiers build (its cost). `json_pattern`
makes a checked pattern JSON-safe: the grammar matches the document's text, where a quote,
a backslash and control characters are escaped, so a pattern's characters may only be ones
JSON writes as themselves.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from functools import lru_cache

from appliance.errors import BadRequest

# -- patterns, read as the converter reads them -----------------------------------------------
# Between ^ and $ a backslash escapes the next character, '{' opens a counted repetition, and
# '[' a character class that is copied verbatim into the grammar, where llama.cpp reads it:
# these are the escapes its grammar parser knows there, and the hex digits each one takes.
_CLASS_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_LAST_CHAR = 0x10FFFF


def _class_char(p: str, i: int) -> tuple[int, int] | None:
    """The character at p[i] in a class as llama.cpp reads it, and where the next one starts;
    None for an escape it refuses."""
    if p[i] != "\\":
        return ord(p[i]), i + 1
    e = p[i + 1:i + 2]
    if e in _CLASS_ESCAPES:
        return ord(_CLASS_ESCAPES[e]), i + 2
    n = _HEX_ESCAPES.get(e, 0)
    digits = p[i + 2:i + 2 + n]
    if n and len(digits) == n and all(c in string.hexdigits for c in digits):
        return int(digits, 16), i + 2 + n
    return None


def _covers_all(ranges: list[tuple[int, int]]) -> bool:
    reach = -1
    for lo, hi in sorted(ranges):
        if lo > reach + 1:
            return False
        reach = max(reach, hi)
    return reach >= _LAST_CHAR


def _class(p: str, i: int) -> tuple[int, str | None]:
    """Read the class whose '[' is p[i]: where it ends, and why no character could ever match
    it (a grammar that can never go on: llama.cpp would have to take a refused token)."""
    j = i + 1 + p.startswith("^", i + 1)
    ranges: list[tuple[int, int]] = []
    while j < len(p) and p[j] != "]":
        start, c = j, _class_char(p, j)
        if c is None:
            return len(p), f"the grammar cannot read the escape {p[j:j + 2]!r} in a character class"
        lo, j = c
        hi = lo
        if p.startswith("-", j) and p[j + 1:j + 2] not in ("", "]"):  # a range, as llama.cpp reads one
            c = _class_char(p, j + 1)
            if c is None:
                return len(p), f"the grammar cannot read the escape {p[j + 1:j + 3]!r} in a character class"
            hi, j = c
            if hi < lo:
                return len(p), f"the range {p[start:j]!r} is inverted"
        ranges.append((lo, hi))
    if j >= len(p):
        return len(p), None  # no closing ']': the converter says so
    if not ranges:
        return len(p), f"the character class {p[i:j + 1]!r} is empty"
    if p.startswith("^", i + 1) and _covers_all(ranges):
        return len(p), f"no character is outside the class {p[i:j + 1]!r}"
    return j + 1, None


def _quantifier(p: str, i: int) -> tuple[int, int, str | None]:
    """Read the {m}, {m,} or {m,n} at p[i] as the converter does: where it ends, how many
    repetitions it builds, and why nothing could match it."""
    end = p.find("}", i)
    if end < 0:
        return len(p), 0, None  # the converter's own error
    nums = [s.strip() for s in p[i + 1:end].split(",")]
    try:
        if len(nums) > 2:
            raise ValueError
        lo = int(nums[0]) if nums[0] or len(nums) == 1 else 0
        hi = lo if len(nums) == 1 else int(nums[1]) if nums[1] else None
    except ValueError:
        return end + 1, 0, None  # the converter refuses it, saying why
    if lo < 0 or (hi is not None and hi < lo):
        return end + 1, 0, f"the quantifier {p[i:end + 1][:32]!r} allows no count"
    return end + 1, lo if hi is None else hi, None


@lru_cache(maxsize=256)
def scan_pattern(pattern: str) -> tuple[str | None, int]:
    """(why the pattern cannot be enforced or None, how many repetitions its quantifiers build)."""
    if not (pattern.startswith("^") and pattern.endswith("$")):
        return None, 0  # the converter refuses it, saying why
    p, i, repeats = pattern[1:-1], 0, 0
    while i < len(p):
        if p[i] == "?" and i > 0 and p[i - 1] == "(":
            return "groups of the form (?...) (non-capturing, lookaround) are not supported", 0
        if p[i] in "*+?{" and (i == 0 or p[i - 1] in "|("):  # the converter writes `|+`, no grammar at all
            return f"the quantifier {p[i]!r} at {i + 1} follows nothing it could repeat", 0
        if p[i] == "\\":
            if i + 1 == len(p):
                return "its final '$' is escaped (it must end the pattern)", 0
            i += 2
        elif p[i] == "[":
            i, problem = _class(p, i)
            if problem:
                return problem, 0
        elif p[i] == "{":
            i, n, problem = _quantifier(p, i)
            if problem:
                return problem, 0
            repeats += n
        elif p[i] in "]}":  # the converter would loop forever on it (nothing handles it, nothing skips it)
            return f"an unescaped {p[i]!r} that closes nothing (write '\\{p[i]}')", 0
        else:
            i += 1
    return None, repeats


# A pattern applies to the string a JSON parser reads back, but the grammar matches the
# document's text, where a quote, a backslash and every control character are escaped: a
# pattern's character may only be one that JSON writes as itself. Classes lose the others,
# escapes outside classes become classes (the converter would copy `\d` or `\.` into a
# literal, which llama.cpp refuses), and what could only match an escaped character is a 400.
_NOT_JSON = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)]
_CLASS_OF = {"d": "[0-9]", "w": "[a-zA-Z0-9_]", "s": "[ ]",
             "D": r'[^0-9"\\\x00-\x1F\x7F]', "W": r'[^a-zA-Z0-9_"\\\x00-\x1F\x7F]', "S": r'[^ "\\\x00-\x1F\x7F]'}


def _hex(c: int) -> str:
    return f"\\x{c:02X}" if c < 0x100 else f"\\u{c:04X}" if c < 0x10000 else f"\\U{c:08X}"


def _safe(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for lo, hi in sorted(ranges):
        for bad_lo, bad_hi in _NOT_JSON:
            if lo <= bad_hi and hi >= bad_lo:  # split around the forbidden run
                if lo < bad_lo:
                    out.append((lo, bad_lo - 1))
                lo = bad_hi + 1
            if lo > hi:
                break
        if lo <= hi:
            out.append((lo, hi))
    return out


def json_pattern(pattern: str, param: str) -> str:
    """A checked pattern (see scan_pattern) with every character JSON-safe. One the
    converter will refuse anyway (an unclosed class, say) is left for it to refuse."""
    try:
        return _json_safe(pattern, param)
    except (AssertionError, IndexError, ValueError):
        return pattern


def _json_safe(pattern: str, param: str) -> str:
    def refuse(what: str) -> BadRequest:
        return BadRequest(f"{param}: the pattern {pattern[:64]!r} can match {what}, which a JSON string holds only "
                          "escaped: it cannot be enforced here", param=param)

    p, i, out = pattern[1:-1], 0, ["^"]
    while i < len(p):
        c = p[i]
        if c == "\\":
            text, i = _safe_escape(p, i, param, refuse)
            out.append(text)
        elif c == "[":
            text, i = _safe_class(p, i, refuse)
            out.append(text)
        elif c == '"' or ord(c) < 0x20 or c == "\x7f":
            raise refuse(repr(c))
        else:
            out.append(c)
            i += 1
    return "".join(out) + "$"


def _safe_escape(p: str, i: int, param: str, refuse: Callable[[str], BadRequest]) -> tuple[str, int]:
    """The escape at p[i] as a JSON-safe class, and where the pattern goes on."""
    e = p[i + 1]
    n = _HEX_ESCAPES.get(e, 0)
    if e in _CLASS_OF:
        text = _CLASS_OF[e]
    elif n and all(h in string.hexdigits for h in p[i + 2:i + 2 + n]) and len(p[i + 2:i + 2 + n]) == n:
        code = int(p[i + 2:i + 2 + n], 16)
        if not _safe([(code, code)]):
            raise refuse(f"the character {_hex(code)}")
        text = f"[{_hex(code)}]"
        i += n
    elif e.isalnum():  # \n \t \b \B \1 ...: control characters, boundaries, backreferences
        raise BadRequest(f"{param}: the escape {p[i:i + 2]!r} in the pattern cannot be enforced here "
                         r"(\d, \w, \s, \D, \W, \S, \xHH, \uHHHH and escaped punctuation can)", param=param)
    elif not _safe([(ord(e), ord(e))]):
        raise refuse(f"{e!r}")
    else:
        text = f"[{_hex(ord(e))}]"
    return text, i + 2


def _safe_class(p: str, i: int, refuse: Callable[[str], BadRequest]) -> tuple[str, int]:
    """The class at p[i] with only JSON-safe characters, and where the pattern goes on."""
    end, _ = _class(p, i)
    negated = p.startswith("^", i + 1)
    j, ranges = i + 1 + negated, []
    while j < end - 1:
        read = _class_char(p, j)
        assert read is not None  # _class read it already
        lo, j = read
        hi = lo
        if p.startswith("-", j) and p[j + 1:j + 2] not in ("", "]"):
            read = _class_char(p, j + 1)
            assert read is not None
            hi, j = read
        ranges.append((lo, hi))
    if negated:
        ranges += _NOT_JSON
    elif not (ranges := _safe(ranges)):
        raise refuse(f"only the class {p[i:end][:32]!r}")
    return "[" + "^" * negated + "".join(_hex(lo) + (f"-{_hex(hi)}" if hi > lo else "") for lo, hi in ranges) + "]", end
