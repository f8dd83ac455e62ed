"""Text completion on the real bundled model (Qwen2.5-Coder, which has fill-in-the-middle
tokens) over a real socket, through the `openai` SDK: code filled in between a prefix and a
suffix parses; token prompts, echo and streaming; /infill, /tokenize and /detokenize."""

from __future__ import annotations

import ast

import pytest
from helpers.live import Live
from openai import OpenAI

pytestmark = pytest.mark.integration

# Where the cursor sits in a file: one line to fill, as an editor asks for it (stop at the
# line's end). Greedy, so the answer is the model's own first choice every time.
FILES = [
    ("def is_even(n):\n    return ", "\n\n\nprint(is_even(4))\n"),
    ("def add(a, b):\n    return ", "\n\n\nprint(add(1, 2))\n"),
]


def sdk(server: Live) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("prefix,suffix", FILES)
def test_fill_in_the_middle_gives_code_that_parses(server: Live, prefix: str, suffix: str) -> None:
    out = sdk(server).completions.create(model="any", prompt=prefix, suffix=suffix, temperature=0,
                                         max_tokens=24, stop=["\n"])
    middle = out.choices[0].text
    assert middle.strip(), out
    ast.parse(prefix + middle + suffix)  # raises SyntaxError if the middle does not fit
    assert out.choices[0].finish_reason == "stop" and out.usage is not None
    # The FIM prompt: prefix, suffix and the three FIM tokens.
    n = len(server.client.post("/tokenize", json={"content": prefix + suffix, "parse_special": False}).json()["tokens"])
    assert n + 3 - 2 <= out.usage.prompt_tokens <= n + 3 + 2  # tokens may merge across the cut


def test_token_prompt_with_echo_streamed(server: Live) -> None:
    prompt = "The capital of France is"
    tokens = server.client.post("/tokenize", json={"content": prompt}).json()["tokens"]
    assert server.client.post("/detokenize", json={"tokens": tokens}).json() == {"content": prompt}
    chunks = list(sdk(server).completions.create(model="any", prompt=tokens, echo=True, max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text.startswith(prompt) and len(text) > len(prompt)
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == len(tokens)
    assert chunks[-1].usage.completion_tokens <= 6


def test_infill_and_fim_tokens_in_llama_servers_shapes(server: Live) -> None:
    r = server.client.post("/infill", json={"input_prefix": "def square(x):\n    return ", "input_suffix": "\n",
                                           "n_predict": 12, "temperature": 0, "stop": ["\n"]})
    body = r.json()
    assert r.status_code == 200 and body["stop"] is True and "x" in body["content"], body
    assert body["timings"]["predicted_n"] == body["tokens_predicted"] >= 1
    # The model's FIM tokens are control tokens: parsed only when asked.
    special = server.client.post("/tokenize", json={"content": "<|fim_prefix|>"}).json()["tokens"]
    plain = server.client.post("/tokenize", json={"content": "<|fim_prefix|>", "parse_special": False}).json()
    assert len(special) == 1 and len(plain["tokens"]) > 1
    (model,) = server.client.get("/v1/models").json()["data"]
    assert model["max_model_len"] == model["meta"]["n_ctx"] == 1024 and model["meta"]["n_vocab"] > 100_000
