"""The tokenizer's front for the HTTP side: chat messages through the template to a prompt,
text to tokens and back, a grammar checked against llama.cpp's parser, the FIM and
end-of-generation tokens. Built whole once the model has loaded (the engine loads the
tokenizer); thread-safe vocabulary access only, never the engine thread's state. The slow
parts run off the event loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from appliance.engine.model_api import Tokenizer
from appliance.errors import BadRequest
from appliance.model.prompt import ChatTemplate, Prompt, Tokenize, build_prompt, refuse_control_text


def prompt_limit(ctx_limit: int, max_tokens: int) -> int:
    """Prompt tokens allowed so that some room is left for the answer."""
    return ctx_limit - min(max_tokens, ctx_limit // 4)


@dataclass(slots=True)
class Text:
    template: ChatTemplate
    tokenize_fn: Tokenize  # no BOS added per piece: a template that wants one writes it
    tokenizer: Tokenizer
    ctx_limit: int
    presets: frozenset[str]  # operator system prompts, public to every client
    tools_allowance: int = 0  # tokens of tool definitions allowed beyond the prompt limit
    _eog: tuple[int, ...] | None = field(default=None)  # end-of-generation tokens, found on first use

    async def prepare(self, messages: list[dict[str, Any]], max_tokens: int,
                      tools: list[dict[str, Any]] | None = None) -> Prompt:
        def build() -> Prompt:
            refuse_control_text(messages, tools, self.tokenizer.control_texts)
            return build_prompt(messages, self.template, self.tokenize_fn, prompt_limit(self.ctx_limit, max_tokens),
                                self.presets, tools, self.tools_allowance)

        # Templating and tokenizing a long paste takes milliseconds: off the event loop.
        return await asyncio.to_thread(build)

    async def tokenize(self, text: str, special: bool = False) -> list[int]:
        """Text -> tokens, off the event loop; special=True parses control-token text (only
        for raw prompts a client writes whole, e.g. /v1/completions, never chat content)."""
        return await asyncio.to_thread(self.tokenize_fn, text, special)

    async def check_grammar(self, grammar: str) -> None:
        """A 400 now for a grammar llama.cpp refuses (a repetition past its limit, such as a
        schema's maxLength 2000), rather than a failed start in the engine thread. Off the
        event loop: parsing takes milliseconds per 10 KiB of grammar."""
        if not await asyncio.to_thread(self.tokenizer.grammar_parses, grammar):
            raise BadRequest("llama.cpp's grammar engine refuses the required format (most often a maxLength, "
                             "maxItems or repetition count above about 1,000)", code="grammar_refused")

    def detokenize(self, tokens: list[int]) -> str:
        return self.tokenizer.detokenize(tokens)

    async def eog_tokens(self) -> tuple[int, ...]:
        """The model's end-of-generation tokens (ignore_eos bans them): the whole vocabulary
        read once, off the event loop (~0.1 s for 152k tokens), then kept."""
        if self._eog is None:
            tok = self.tokenizer
            self._eog = await asyncio.to_thread(lambda: tuple(t for t in range(tok.n_vocab) if tok.is_eog(t)))
        return self._eog
