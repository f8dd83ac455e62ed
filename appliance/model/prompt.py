"""Chat messages -> prompt tokens: the GGUF's own Jinja chat template in a sandbox, and the
rule for conversations longer than the context (keep the system prompt and the newest turns).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from appliance.errors import BadRequest, ContextLengthExceeded

# tokenize(text, special): special=True parses control-token text such as "<|im_end|>"
# (only for what the template wrote); special=False keeps it plain text (message content).
Tokenize = Callable[[str, bool], list[int]]

# Older turns are dropped by characters before anything is rendered, so a huge history costs
# no templating or tokenizing. A token is rarely more than a few characters of text (about 4
# for English and code), so a conversation of limit x 12 characters is beyond the context:
# only text of very long repeated runs could lose a turn that would have fit.
MAX_CHARS_PER_TOKEN = 12

# Message i is rendered as the mark `<c>i<c>` and put back afterwards, so that message text
# is never part of the text whose control tokens are parsed. <c> is a private-use character
# that neither the template nor any client text it renders besides content (tool definitions,
# tool calls) holds, chosen anew for each render: no client text can pass for a mark.
_PRIVATE_USE = range(0xE000, 0xF900)

# Used only when a GGUF carries no template: every Qwen2.5 model speaks ChatML.
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two token lists share."""
    n = min(len(a), len(b))
    i = 0
    # Compare in blocks first: prompts share long prefixes, and slicing is C-fast.
    step = 256
    while i + step <= n and a[i:i + step] == b[i:i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _raise(message: str) -> None:
    raise TemplateError(message)


def _too_deep(tools: list[dict[str, Any]] | None) -> BadRequest:
    return BadRequest("the chat template recursed too deeply: are the tool definitions or calls nested too deeply?",
                      param="tools" if tools else "messages")


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    # Hugging Face's templates expect tojson without HTML escaping and with unicode kept.
    return json.dumps(value, ensure_ascii=False, indent=indent)


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        # Sandboxed and immutable: a GGUF's template is data from the internet, not code.
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        self._template = env.from_string(source or CHATML)
        self._specials = {"bos_token": bos_token, "eos_token": eos_token}
        self._own_chars = frozenset(source or CHATML) | frozenset(bos_token + eos_token)

    def render_parts(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                     tools: list[dict[str, Any]] | None = None) -> list[tuple[str, bool]]:
        """The rendered prompt as (text, written by the template) pieces: message contents are
        rendered as marks and put back as pieces of their own. (Tool definitions and calls are
        rendered as the template writes them: the API layer refuses any that contain
        control-token text.)"""
        c = self._mark_char(messages, tools)
        masked = [{**m, "content": f"{c}{i}{c}"} if m.get("content") else m for i, m in enumerate(messages)]
        text = self.render(masked, add_generation_prompt, tools)
        parts: list[tuple[str, bool]] = []
        pos = 0
        # Only marks hold c, so they alternate opening and closing: each match is one mark.
        for mark in re.finditer(f"{c}([0-9]+){c}", text):
            parts.append((text[pos:mark.start()], True))
            parts.append((str(messages[int(mark.group(1))]["content"]), False))
            pos = mark.end()
        parts.append((text[pos:], True))
        return [(t, special) for t, special in parts if t]

    def _mark_char(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        """A private-use character in neither the template's source nor any client text it
        renders besides content (a string's characters all appear in its JSON: ensure_ascii=False
        escapes none of these)."""
        rest = [{k: v for k, v in m.items() if k != "content"} for m in messages]
        try:
            used = self._own_chars | frozenset(json.dumps([tools, rest], ensure_ascii=False, default=str))
        except RecursionError:
            raise _too_deep(tools) from None
        c = next((chr(p) for p in _PRIVATE_USE if chr(p) not in used), None)
        if c is None:
            raise BadRequest("tool definitions and calls may not hold every private-use character (U+E000-U+F8FF)",
                             param="tools" if tools else "messages")
        return c

    def encode(self, messages: list[dict[str, Any]], tokenize: Tokenize,
               tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Render and tokenize: control tokens come only from the template, never from content.
        A final assistant message (without tool calls) is continued, as llama-server and Ollama
        do it: the turns before it with the generation prompt, then its text."""
        prefill = len(messages) > 1 and messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls")
        parts = self.render_parts(messages[:-1] if prefill else messages, tools=tools)
        if prefill and messages[-1].get("content"):
            parts.append((str(messages[-1]["content"]), False))
        tokens: list[int] = []
        for text, special in parts:
            tokens += tokenize(text, special)
        return tokens

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        extra = {"tools": tools} if tools else {}
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self._specials, **extra)
        except TemplateError as e:
            raise BadRequest(f"the model's chat template rejected these messages: {e}", param="messages") from None
        except RecursionError:  # tool JSON (tojson) nested near the parser's own limit, or a template's loop
            raise _too_deep(tools) from None


@dataclass(frozen=True, slots=True)
class Prompt:
    tokens: list[int]
    dropped_messages: int  # oldest turns left out so the conversation fits the context
    public_len: int = 0  # leading tokens any client may share: the template + a public system prompt
    # Leading tokens up to the end of its one system message, whole (0: none, or several),
    # or a front-end task's template (task_head): what becomes public once enough different
    # clients send exactly it (engine/kv/commons).
    system_len: int = 0
    # Tokens of tool definitions allowed beyond the per-conversation limit (build_prompt's
    # `tools_allowance`): the engine lets this turn hold that many more.
    allowance: int = 0
    # Its system block is the template's own or a preset, plus tools: nothing of a person's
    # own in it, so a trusted front-end's copy is the front-end's (engine/kv/commons).
    block_public: bool = False


# Characters no one types: rendering the system prompt followed by a user turn holding
# only one of these shows where the private part of a prompt starts, whatever the
# template adds (two unlike probes: a tokenizer may merge the start of the user text).
_PROBES = ("\u2063", "A")


def _system_part(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    n_sys = 0
    while n_sys < len(messages) and messages[n_sys]["role"] == "system":
        n_sys += 1
    return messages[:n_sys]


def public_prefix(system: list[dict[str, Any]], template: ChatTemplate, tokenize: Tokenize,
                  tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The tokens a prompt with these system messages (and tools) starts with, before anything
    that differs from one request to the next."""
    a, b = (template.encode(system + [{"role": "user", "content": p}], tokenize, tools) for p in _PROBES)
    return a[:common_prefix(a, b)]


def public_prefixes(presets: Iterable[str], template: ChatTemplate, tokenize: Tokenize) -> list[list[int]]:
    """What every client may share: the model's default system prompt (no system message)
    and each operator preset. Computed once at start-up."""
    systems: list[list[dict[str, Any]]] = [[]]
    systems += [[{"role": "system", "content": text}] for text in presets]
    return [public_prefix(s, template, tokenize) for s in systems]


# A chat front-end's background task: one user message that starts so and holds the chat in
# a <chat_history> element (Open WebUI's titles, tags, follow-ups; http/lanes.py).
TASK_START, TASK_HISTORY = "### Task:", "<chat_history>"


def task_head(messages: list[dict[str, Any]], template: ChatTemplate, tokenize: Tokenize) -> list[int]:
    """A front-end task prompt's tokens up to its chat history: its template, the same in
    every title (or tags) request, ~250 of the ~300 tokens Open WebUI sends for each. Like a
    system block, it becomes public once three different clients sent it whole
    (engine/kv/commons.py): a person who types such a text learns at most that two others
    typed exactly it. [] for any other prompt."""
    text = messages[0].get("content") if len(messages) == 1 and messages[0]["role"] == "user" else None
    if not isinstance(text, str) or not text.lstrip().startswith(TASK_START) or (i := text.find(TASK_HISTORY)) < 0:
        return []
    head = text[:i + len(TASK_HISTORY)]
    a, b = (template.encode([{"role": "user", "content": head + p}], tokenize) for p in _PROBES)
    return a[:common_prefix(a, b)]


def _shared(messages: list[dict[str, Any]], tokens: list[int], dropped: int, template: ChatTemplate,
            tokenize: Tokenize, presets: frozenset[str], tools: list[dict[str, Any]] | None = None,
            allowance: int = 0) -> Prompt:
    """The prompt with its public length (the template's start and a preset system prompt)
    and its system block's length (one system message with the tools, whole)."""
    system = _system_part(messages)
    if len(system) > 1:
        return Prompt(tokens, dropped, allowance=allowance)  # several system messages: nothing is shared
    plain = public_prefix(system, template, tokenize)
    public = common_prefix(tokens, plain)
    if tools:
        # The template writes the tools into the system block (Qwen's, after the system text):
        # the block with them is the client's until common (kv/commons.py), as a private
        # system prompt is; an office tool or front-end sends the same tools from every PC.
        block = public_prefix(system, template, tokenize, tools)
        whole = len(block) if common_prefix(tokens, block) == len(block) else 0
    else:
        whole = public if system and public == len(plain) else 0
    if system and system[0]["content"] not in presets:
        return Prompt(tokens, dropped, 0, whole, allowance)  # a private system prompt: shared only once common
    if not system and not tools and (head := task_head(messages, template, tokenize)):
        return Prompt(tokens, dropped, public, len(head) if common_prefix(tokens, head) == len(head) else 0, allowance)
    return Prompt(tokens, dropped, public, whole, allowance, block_public=bool(tools and whole))


def refuse_control_text(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                        control_texts: frozenset[str]) -> None:
    """Tool definitions and calls reach the template as JSON it writes verbatim, where
    control-token text would be parsed: refuse any that holds some (content is safe)."""
    calls = [m["tool_calls"] for m in messages if m.get("tool_calls")]
    if not (tools or calls) or not control_texts:
        return
    text = json.dumps([tools, calls], ensure_ascii=False)
    found = next((c for c in control_texts if c in text), None)
    if found is not None:
        raise BadRequest(f"tool definitions and tool calls may not contain the model's control token {found!r}",
                         param="tools" if tools and found in json.dumps(tools, ensure_ascii=False) else "messages")


def _chars(messages: list[dict[str, Any]]) -> int:
    return sum(len(m["content"]) + (len(json.dumps(m["tool_calls"])) if m.get("tool_calls") else 0) for m in messages)


def build_prompt(
    messages: list[dict[str, Any]],
    template: ChatTemplate,
    tokenize: Tokenize,
    limit: int,
    presets: frozenset[str] = frozenset(),
    tools: list[dict[str, Any]] | None = None,
    tools_allowance: int = 0,
) -> Prompt:
    """Render and tokenize; if longer than `limit` tokens, drop the oldest non-system
    messages (whole turns: the kept history starts with a user message) until it fits.
    Only a final message that cannot fit even alone with the system prompt is an error.
    Turns far beyond the context by characters are dropped before anything is rendered.
    Tool definitions may take up to `tools_allowance` tokens on top of `limit`: they are a
    program's, not the conversation's, and a front-end sends the same ones every turn."""

    def encode(msgs: list[dict[str, Any]]) -> list[int]:
        return template.encode(msgs, tokenize, tools)

    system, rest = _split_system(messages)
    tools_chars = _tools_chars(tools, limit + tools_allowance)
    allowance = min(tools_allowance, _tools_tokens(system, template, tokenize, tools)) if tools_allowance else 0
    limit += allowance
    k0 = _fewest_dropped_by_chars(system, rest, limit * MAX_CHARS_PER_TOKEN - _chars(system) - tools_chars)
    if k0 == 0:
        tokens = encode(messages)
        if len(tokens) <= limit:
            return _shared(messages, tokens, 0, template, tokenize, presets, tools, allowance)

    last_only = encode(system + rest[-1:])
    if len(last_only) > limit:
        if tools:
            # Name what is large: a front-end's built-in tools (Open WebUI attaches 36, 25.9 KB,
            # to every chat turn) are most of such a prompt, and the user cannot shorten them.
            without = len(template.encode(system + rest[-1:], tokenize, None))
            n_tools = len(last_only) - without
            if without <= limit - allowance:
                more = f" and {tools_allowance:,} more for tool definitions" if tools_allowance else ""
                raise ContextLengthExceeded(
                    f"the tool definitions do not fit: {len(tools)} tools are {n_tools:,} of this prompt's "
                    f"{len(last_only):,} tokens, and this server allows {limit - allowance:,} prompt tokens per "
                    f"conversation{more}; send fewer tools (a chat front-end's built-in tools can be turned off "
                    "in its settings)", param="tools")
        raise ContextLengthExceeded(
            f"the last message does not fit: with the system prompt it is {len(last_only)} tokens, "
            f"and this server allows {limit} prompt tokens per conversation")
    kept = _fewest_dropped_by_tokens(system, rest, k0, lambda msgs: len(encode(msgs)) <= limit)
    tokens = encode(kept)
    return _shared(kept, tokens, len(messages) - len(kept), template, tokenize, presets, tools, allowance)


def _tools_tokens(system: list[dict[str, Any]], template: ChatTemplate, tokenize: Tokenize,
                  tools: list[dict[str, Any]] | None) -> int:
    """The tokens the tool definitions add to the prompt (the template writes them into the
    system block): rendered with and without them, two probes each (~5 ms for Open WebUI's
    36 tools, 25.9 KB)."""
    if not tools:
        return 0
    return max(0, len(public_prefix(system, template, tokenize, tools)) - len(public_prefix(system, template, tokenize)))


def _split_system(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The leading system (and developer) messages, and the rest (never empty: the last message)."""
    n_sys = 0
    while n_sys < len(messages) - 1 and messages[n_sys]["role"] in ("system", "developer"):
        n_sys += 1
    return messages[:n_sys], messages[n_sys:]


def _tools_chars(tools: list[dict[str, Any]] | None, limit: int) -> int:
    """The tools' size in characters. Tools are rendered into every candidate prompt: ones that
    cannot fit by characters alone are refused before anything is rendered or tokenized."""
    tools_chars = len(json.dumps(tools or [], ensure_ascii=False))
    if tools_chars > limit * MAX_CHARS_PER_TOKEN:
        raise ContextLengthExceeded(
            f"the tool definitions alone ({tools_chars} characters) are longer than the {limit} prompt tokens "
            "this server allows per conversation", param="tools")
    return tools_chars


def _fewest_dropped_by_chars(system: list[dict[str, Any]], rest: list[dict[str, Any]], budget: int) -> int:
    """The fewest turns to drop by characters alone (the last message is always tokenized)."""
    k0, tail = len(rest) - 1, _chars(rest[-1:])
    while k0 > 0 and tail + _chars(rest[k0 - 1:k0]) <= budget:
        k0 -= 1
        tail += _chars(rest[k0:k0 + 1])
    return k0


def _keep_from(system: list[dict[str, Any]], rest: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """Drop rest[:k], then keep dropping until the history starts with a user turn."""
    while k < len(rest) - 1 and rest[k]["role"] != "user":
        k += 1
    return system + rest[k:]


def _fewest_dropped_by_tokens(system: list[dict[str, Any]], rest: list[dict[str, Any]], k0: int,
                              fits: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    """The messages kept with the fewest dropped (at least max(1, k0)) that fit; the token
    count shrinks as more are dropped, so binary search."""
    lo, hi = max(1, k0), len(rest) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(_keep_from(system, rest, mid)):
            hi = mid
        else:
            lo = mid + 1
    return _keep_from(system, rest, lo)
