"""llama.cpp as a forward for GGUF models on a CPU (through `llama-cpp-python`): it reads a small model at the
machine's bandwidth, where torch's CPU kernels stop at about half of it. One `GgufModel` holds the weights and is
shared by every run; each run's `LlamaCppLM` owns a llama.cpp context of its own (its KV cache), so concurrent
users never share cache state. Rows carry their positions (`llama_batch`), rollback is `llama_memory_seq_rm`.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .cache import CachedModel

log = logging.getLogger(__name__)

N_CTX = 4096  # positions a run may hold (prompt + answer + one verification pass)
N_BATCH = 512  # rows per llama_decode: a longer prefill goes in chunks
_STATE: dict[str, Any] = {}  # the imported binding, or why it is not there (said once)
_LOCK = threading.Lock()
_ATTACHED: weakref.WeakKeyDictionary[Any, tuple[GgufModel, int]] = weakref.WeakKeyDictionary()


def binding() -> Any | None:
    """The `llama_cpp` module, initialised once; None (and one warning) when it is not installed or does not load."""
    with _LOCK:
        if "lib" not in _STATE:
            try:
                import llama_cpp

                llama_cpp.llama_backend_init()
                _STATE["quiet"] = llama_cpp.llama_log_callback(lambda level, text, data: None)
                llama_cpp.llama_log_set(_STATE["quiet"], ctypes.c_void_p())
                _STATE["lib"] = llama_cpp
            except Exception as e:  # noqa: BLE001 - missing or broken build: torch runs every model
                _STATE["lib"], _STATE["why"] = None, f"{type(e).__name__}: {e}"
                log.warning("llama.cpp is not available (%s); the torch forward runs every model", _STATE["why"])
        return _STATE["lib"]


def unavailable_reason() -> str:
    """Why `binding()` is None ("" when llama.cpp loads)."""
    return "" if binding() is not None else str(_STATE.get("why", "not installed"))


def threads() -> int:
    return max(1, torch.get_num_threads())


def _free_model(lib: Any, model: Any, pool: list[Any]) -> None:
    for ctx in pool:
        lib.llama_free(ctx)
    lib.llama_model_free(model)


class GgufModel:
    """A GGUF file loaded by llama.cpp once (weights only; contexts are per run). Raises ValueError naming the file
    when llama.cpp cannot read it."""

    def __init__(self, path: str | Path, label: str = "") -> None:
        lib = binding()
        if lib is None:
            raise RuntimeError(f"llama.cpp is not available: {unavailable_reason()}")
        self.path, self.label = Path(path), label or Path(path).name
        if not self.path.is_file():
            raise ValueError(f"GGUF file {self.path} does not exist")
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        self.model = lib.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.model:
            raise ValueError(f"llama.cpp cannot read the GGUF file {self.path.name}")
        self.lib = lib
        self.n_vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model)))
        self.n_embd = int(lib.llama_model_n_embd(self.model))
        self._pool: list[Any] = []  # contexts whose runs have ended, kept for the next run
        self._free = weakref.finalize(self, _free_model, lib, self.model, self._pool)

    def acquire(self) -> Any:
        """A context no other run holds, its cache emptied: one from the pool, else a new one (~0.1 s)."""
        with _LOCK:
            ctx = self._pool.pop() if self._pool else None
        if ctx is None:
            return self.context(False)
        self.lib.llama_memory_clear(self.lib.llama_get_memory(ctx), True)
        self.lib.llama_set_embeddings(ctx, False)
        return ctx

    def release(self, ctx: Any) -> None:
        """Give a run's context back to the pool (its run has ended: the LM that held it is gone)."""
        with _LOCK:
            self._pool.append(ctx)

    def context(self, embeddings: bool) -> Any:
        """A fresh llama.cpp context (its own KV cache) over these weights; `embeddings`: rows' normed states too."""
        lib = self.lib
        p = lib.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = N_CTX, N_BATCH, N_BATCH, 1
        p.n_threads = p.n_threads_batch = threads()
        p.embeddings = embeddings
        p.pooling_type = lib.LLAMA_POOLING_TYPE_NONE
        p.no_perf = True
        ctx = lib.llama_init_from_model(self.model, p)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not make a context for {self.path.name}")
        return ctx


def attach(model: Any, gguf: GgufModel | None, upto: int = 1 << 30) -> None:
    """Run `model` (a loaded torch module) on llama.cpp over `gguf` for passes of at most `upto` rows (longer ones
    stay on its torch forward, where those are faster), or always on torch with None."""
    if gguf is None:
        _ATTACHED.pop(model, None)
    else:
        _ATTACHED[model] = (gguf, upto)


def gguf_of(model: Any, rows: int = 1) -> GgufModel | None:
    """The llama.cpp copy `model` runs on for passes of `rows` rows, if one is attached for them."""
    try:
        got = _ATTACHED.get(model)
    except TypeError:  # not weak-referenceable: never attached
        return None
    return got[0] if got is not None and rows <= got[1] else None


def attached_upto(model: Any) -> int:
    """The longest pass `model` runs on llama.cpp (0: none)."""
    try:
        got = _ATTACHED.get(model)
    except TypeError:
        return 0
    return got[1] if got is not None else 0


class LlamaCppLM(CachedModel):
    """One run's state over a llama.cpp context: a chain of rows at their positions in sequence 0; logits are asked
    only for the rows the caller reads (all rows when a proposer reads this model's states)."""

    trees = False  # tree rows as llama.cpp sequences are not built: the shape choice says chains

    def __init__(self, model: Any, vocab_size: int, role: str, backend: str = "default") -> None:
        super().__init__(role)
        gguf = model if isinstance(model, GgufModel) else gguf_of(model, 0)
        if gguf is None:
            raise ValueError(f"{role}: no llama.cpp copy is attached to this model")
        self.gguf, self.lib, self.vocab_size = gguf, gguf.lib, min(vocab_size, gguf.n_vocab)
        self.ctx: Any = None
        self.batch = self.lib.llama_batch_init(N_BATCH, 0, 1)
        self._free_batch = weakref.finalize(self, self.lib.llama_batch_free, self.batch)
        self._embeddings = False  # what the context outputs besides logits (set when a reader asks)

    def _context(self) -> Any:
        """The run's context, made on first use with embeddings on when a reader asks for this model's states."""
        want = self.publish is not None
        if self.ctx is None:
            self.ctx = self.gguf.acquire()  # embeddings off: set below when a reader wants them
            self._release = weakref.finalize(self, self.gguf.release, self.ctx)
            self.mem = self.lib.llama_get_memory(self.ctx)
        if want != self._embeddings:
            self.lib.llama_set_embeddings(self.ctx, want)
            self._embeddings = want
        return self.ctx

    def _decode(self, tokens: list[int], pos: int, out_from: int) -> int:
        """One llama_decode of `tokens` at pos …; rows from `out_from` on are output. Returns the outputs' count."""
        b, n = self.batch, len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = t, pos + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = i >= out_from
        b.n_tokens = n
        rc = self.lib.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"{self.role}: llama_decode failed ({rc}) at position {pos} with {n} rows "
                               f"(a run holds at most {N_CTX} positions)")
        return n - out_from

    def _run(self, tokens: list[int], pos: int, keep: int) -> torch.Tensor:
        ctx = self._context()
        want = len(tokens) if self.publish is not None else keep  # the rows read: kept logits, or every state
        z = torch.empty(keep, self.vocab_size)  # [keep, V]
        feats = torch.empty(len(tokens), self.gguf.n_embd) if self.publish is not None else None  # [n, d]
        for s in range(0, len(tokens), N_BATCH):  # chunks of a long prefill
            chunk = tokens[s: s + N_BATCH]
            first = max(0, len(tokens) - want - s)
            n_out = self._decode(chunk, pos + s, min(first, len(chunk)))
            if n_out <= 0:
                continue
            logits = np.ctypeslib.as_array(self.lib.llama_get_logits(ctx), shape=(n_out, self.gguf.n_vocab))
            row0 = s + len(chunk) - n_out  # the first output row's index in `tokens`
            for j in range(n_out):
                r = row0 + j - (len(tokens) - keep)
                if r >= 0:
                    z[r] = torch.from_numpy(logits[j, : self.vocab_size])
            if feats is not None:
                emb = np.ctypeslib.as_array(self.lib.llama_get_embeddings(ctx), shape=(n_out, self.gguf.n_embd))
                feats[row0: row0 + n_out] = torch.from_numpy(emb)
        self.feats = feats
        return z

    def _crop(self, pos: int) -> None:
        if self.ctx is not None:
            self.lib.llama_memory_seq_rm(self.mem, 0, pos, -1)


def f32_copy(source: Path, dest: Path) -> Path:
    """`source` dequantised into an F32 GGUF at `dest` by llama.cpp's own quantizer (the exact dequantisation of
    its codes), written aside and renamed into place so no process reads half a file."""
    lib = binding()
    if lib is None:
        raise RuntimeError(f"llama.cpp is not available: {unavailable_reason()}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    params = lib.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = lib.LLAMA_FTYPE_ALL_F32, True, threads()
    try:
        if lib.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params)) != 0:
            raise ValueError(f"llama.cpp could not dequantise {source.name}")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest
