"""Per-request sampling parameters, already validated by the API layer."""

from __future__ import annotations

from dataclasses import dataclass, field

# Below this a temperature samples as greedy, the limit it tends to: logits divided by a
# subnormal temperature overflow float32 to inf, and inf - inf in the softmax is NaN.
MIN_TEMPERATURE = 1e-6


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 512
    temperature: float = 0.7  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 40  # 0 = off; llama-server's default, and it keeps top_p's sort cheap
    min_p: float = 0.05
    repeat_penalty: float = 1.0  # 1 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64  # tokens the penalties look back over
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    grammar: str | None = None  # GBNF the answer must follow (structured output, forced tool calls)
    logprobs: int | None = None  # report the chosen token's log-probability and this many alternatives
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit; -inf bans it)
    # Tool calls (structured.tools.call_key) whose results end the conversation: an answer
    # that only repeats one is sampled again as an answer (engine/repeat.py).
    answered: tuple[tuple[str, str], ...] = ()
    # The prompt such an answer is sampled again from: the chat with the user's question put
    # again after the result (http/prompting.py). Empty: the same prompt.
    retry_prompt: tuple[int, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        """Anything that changes the logits before sampling (penalties, biases): such a turn
        takes its sampler chain over the whole vocabulary, not the plain argmax, and no drafts."""
        return (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or bool(self.logit_bias))
