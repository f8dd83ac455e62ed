"""Embeddings of texts with the bundled all-MiniLM-L6-v2 (appliance/model/embedding.py makes
its GGUF): `Embedder` is one llama.cpp context and the thread that calls it; `EmbedService`
shares one loaded model between two such threads, an interactive one (API requests, search
queries) and a background one (indexing documents), which the indexer paces while the chat
engine has work (library/indexer.py).

Measured on the 2-core x86-64 development box (AMD EPYC VM, llama-cpp-python 0.3.36, F16
weights, 1 thread a context): a 256-token text takes 97-111 ms, a 160-token passage 58 ms, a
short query 6 ms alone or 3-4 ms each when 16 share a llama_decode. The service adds 56 MiB
of RSS as it starts (the mmapped model and two contexts) and 124 MiB once both contexts
have encoded a full BATCH_TOKENS = 256 call (191 MiB at 512).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from appliance.library.errors import EmbedBusy, EmbedStopped
from appliance.model.embed_llm import EmbeddingContext, EmbeddingModel
from appliance.workers import Worker, settle

log = logging.getLogger(__name__)

MAX_TOKENS = 256  # the model was trained on at most 256 word pieces (sentence-transformers' max_seq_length)
# Tokens in one llama_decode. BERT attends both ways, so llama.cpp encodes a call's sequences
# in one micro-batch, attending over all of its tokens and masking other sequences' out:
# bigger calls cost more per text (a 256-token text: 97 ms alone, 104 ms two at a time, 109
# ms four at a time), and llama.cpp sizes an output buffer of n_vocab floats a token (122 KiB)
# though only the pooled vectors are read (256: 33 MiB, 512: 65 MiB, 1024: 130 MiB of RSS).
# 256 holds one full text, one or two 160-token passages or 16 queries (n_seq_max) a call,
# and keeps the two contexts at ~124 MiB of RSS beside 191 MiB at 512, with no speed lost
# that could be measured here: on a 1 GiB Pi, the 67 MiB matter.
BATCH_TOKENS = 256
MAX_SEQS = 16  # sequences in one call: short queries share a decode (3-4 ms each instead of 6)
MAX_PENDING_TEXTS = 256  # queued on one side before callers get EmbedBusy (~25 s of full texts)
MAX_TEXTS_PER_CALL = 128
MAX_TEXT_BYTES = 64 * 1024  # read whole, then cut to MAX_TOKENS: ~40x what 256 tokens take in English
# The background thread's niceness. Not 19: niced that far it gets ~1% of a core beside the
# chat engine's two threads, and the indexer's pacing (library/indexer.py), which measures
# the wall time of a batch, then pauses for nine times that, indexed 6 passages of a 100-page
# PDF in 108 s beside 8 chatting clients. Pacing, not niceness, leaves the chats their cores.
BACKGROUND_NICE = 0


class Embedder:
    """One llama.cpp context on the embedding model; every call from the one thread that owns it.
    Given a loaded `model`, it shares that model and leaves freeing it to its owner."""

    def __init__(self, path: Path | None = None, n_threads: int = 1, model: EmbeddingModel | None = None,
                 batch_tokens: int = BATCH_TOKENS, max_seqs: int = MAX_SEQS) -> None:
        if batch_tokens < MAX_TOKENS:  # a text is encoded whole in one call
            raise ValueError(f"batch_tokens must be at least {MAX_TOKENS}")
        self._own_model = model is None
        if model is None:
            if path is None:
                raise ValueError("Embedder needs a model path or a loaded model")
            model = EmbeddingModel(path)
        self._model = model
        try:
            self._ctx = EmbeddingContext(self._model, batch_tokens, max_seqs, n_threads)
        except Exception:
            if self._own_model:
                self._model.close()
            raise

    @property
    def dim(self) -> int:
        return self._model.dim

    def tokenize(self, text: str) -> list[int]:
        """[CLS] word pieces [SEP], cut to MAX_TOKENS keeping the final [SEP]."""
        tokens = self._model.tokenize(text)
        return tokens if len(tokens) <= MAX_TOKENS else tokens[:MAX_TOKENS - 1] + tokens[-1:]

    def count_tokens(self, text: str) -> int:
        """Word pieces with [CLS] and [SEP], before the cut to MAX_TOKENS."""
        return len(self._model.tokenize(text))

    def embed(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32 rows of unit length, in order; as few decodes as fit."""
        seqs = [self.tokenize(t) for t in texts]
        out = np.empty((len(seqs), self.dim), dtype=np.float32)
        for group in _groups([len(s) for s in seqs], self._ctx.n_tokens, self._ctx.n_seq_max):
            out[group] = self._ctx.encode([seqs[i] for i in group])
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)

    def close(self) -> None:
        self._ctx.close()
        if self._own_model:
            self._model.close()


def _groups(lengths: list[int], max_tokens: int, max_seqs: int) -> Iterator[list[int]]:
    """Indices of consecutive texts whose tokens fit one decode (order kept: nothing is gained
    by sorting, as batching long texts saves nothing but the 3 ms of a call)."""
    group: list[int] = []
    used = 0
    for i, n in enumerate(lengths):
        if group and (used + n > max_tokens or len(group) == max_seqs):
            yield group
            group, used = [], 0
        group.append(i)
        used += n
    if group:
        yield group


def check_texts(texts: list[str]) -> None:
    """ValueError (HTTP 400) for what no call may carry."""
    if not isinstance(texts, list) or len(texts) > MAX_TEXTS_PER_CALL:
        raise ValueError(f"give a list of at most {MAX_TEXTS_PER_CALL} texts")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ValueError(f"text {i} is not a string")
        try:
            n = len(t.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(f"text {i} is not valid Unicode (a lone surrogate)") from None
        if n > MAX_TEXT_BYTES:
            raise ValueError(f"text {i} is {n} bytes, more than {MAX_TEXT_BYTES}")


Done = Callable[[np.ndarray | None, BaseException | None], object]


@dataclass(slots=True)
class _Job:
    texts: list[str]
    done: Done  # called once, in the worker thread, with the rows or the error


class _Worker(Worker[_Job]):
    """A thread owning one Embedder on the shared model; jobs in order from its queue, at most
    MAX_PENDING_TEXTS texts waiting. Stopping cancels what waits (EmbedStopped)."""

    DRAIN = False

    def __init__(self, name: str, model: EmbeddingModel, threads: int, nice: int | None) -> None:
        super().__init__(name, max_queue=MAX_PENDING_TEXTS, stopped=lambda: EmbedStopped("the embedding service is not running"),
                         busy=lambda n: EmbedBusy(f"{n} texts are waiting for the embedding model: try again shortly"))
        self.model, self.threads = model, threads
        self.nice = nice  # set on the thread itself (Linux nice values are per thread)
        self._embedder: Embedder | None = None

    @property
    def pending(self) -> int:
        """Texts queued and not yet done."""
        return self.health().depth

    def put(self, job: _Job) -> None:
        self.submit(job, len(job.texts))

    def begin(self) -> None:
        if self.nice is not None:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except OSError as e:  # not Linux-like: the thread runs at normal priority
                log.warning("cannot nice the %s thread: %s", self.name, e)
        self._embedder = Embedder(model=self.model, n_threads=self.threads)

    def end(self) -> None:
        if self._embedder is not None:
            self._embedder.close()

    def cancel(self, job: _Job) -> None:
        _call(job, None, EmbedStopped("the embedding service stopped"))

    def handle(self, job: _Job) -> None:
        assert self._embedder is not None
        rows: np.ndarray | None = None
        error: BaseException | None = None
        try:
            rows = self._embedder.embed(job.texts)
        except Exception as e:  # this call's failure only: the thread goes on with the next
            log.exception("embedding %d texts failed", len(job.texts))
            error = e
        _call(job, rows, error)


def _call(job: _Job, rows: np.ndarray | None, error: BaseException | None) -> None:
    try:
        job.done(rows, error)
    except Exception:
        log.exception("an embedding caller's callback failed")


class EmbedService:
    """The embedding model loaded once, and two threads each owning a context on it:
    `embed` from the asyncio side, `embed_sync` from other threads (the indexer)."""

    model_id = "all-minilm-l6-v2"  # what /v1/embeddings and /api/embed answer as their model
    max_tokens = MAX_TOKENS

    def __init__(self, path: Path, n_threads: int = 1, background_threads: int = 1) -> None:
        self.path = path
        self.n_threads, self.background_threads = n_threads, background_threads
        self._model: EmbeddingModel | None = None
        self._interactive: _Worker | None = None
        self._background: _Worker | None = None

    def start(self) -> None:
        """Load the model and start both threads (each makes its own context)."""
        self._model = EmbeddingModel(self.path)
        self._interactive = _Worker("embed-interactive", self._model, self.n_threads, None)
        self._background = _Worker("embed-background", self._model, self.background_threads, BACKGROUND_NICE)
        try:
            self._interactive.start()
            self._background.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Fail what is still queued (EmbedStopped), join both threads, free the model."""
        for worker in (self._interactive, self._background):
            if worker is not None:
                worker.stop()
        self._interactive = self._background = None
        if self._model is not None:
            self._model.close()
            self._model = None

    def workers(self) -> list[_Worker]:
        """Both threads while the service runs, for /admin/status."""
        return [w for w in (self._interactive, self._background) if w is not None]

    @property
    def dim(self) -> int:
        return self._loaded().dim

    def count_tokens(self, text: str) -> int:
        """Word pieces with [CLS] and [SEP] (before the cut to MAX_TOKENS); any thread (the
        vocabulary is read-only)."""
        return len(self._loaded().tokenize(text))

    def unknown_share(self, text: str) -> float:
        """The share of the text's word pieces the model does not know ([UNK]): all-MiniLM's
        vocabulary lacks most Chinese characters (58-88% of a Chinese question's pieces, on
        the evaluation set), and a vector of [UNK]s ranks passages at random."""
        model = self._loaded()
        pieces = model.tokenize(text)[1:-1]
        return sum(1 for t in pieces if t == model.unk) / len(pieces) if pieces else 0.0

    def _loaded(self) -> EmbeddingModel:
        if self._model is None:
            raise EmbedStopped("the embedding service is not running")
        return self._model

    def _worker(self, background: bool) -> _Worker:
        worker = self._background if background else self._interactive
        if worker is None:
            raise EmbedStopped("the embedding service is not running")
        return worker

    async def embed(self, texts: list[str], background: bool = False) -> np.ndarray:
        """(len(texts), dim) unit rows. ValueError: a bad call (400); EmbedBusy: too much
        queued (503); EmbedStopped: shutting down."""
        check_texts(texts)
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[np.ndarray] = loop.create_future()
        self._worker(background).put(_Job(list(texts), lambda rows, err: settle(loop, fut, rows, err)))
        return await fut

    def embed_sync(self, texts: list[str], background: bool = True) -> np.ndarray:
        """embed() for a thread that may block (the indexer); never from the event loop."""
        check_texts(texts)
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        done = threading.Event()
        box: list[np.ndarray | BaseException | None] = [None]

        def finish(rows: np.ndarray | None, error: BaseException | None) -> None:
            box[0] = error if error is not None else rows
            done.set()

        self._worker(background).put(_Job(list(texts), finish))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        assert box[0] is not None
        return box[0]
