"""The bench's `llama_cpp` peer: llama.cpp's own decoding (`llama-cpp-python`, installed on demand with `INSTALL`) of
an F32 copy of the GGUF the target was loaded from (`ModelTriplet.gguf`), the weights our fp32 target runs."""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch

from ..models.bundled import cache_root

CMAKE_ARGS = (
    "-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF "
    "-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF"
)  # its libraries only
INSTALL = f'CMAKE_ARGS="{CMAKE_ARGS}" .venv/bin/python -m pip install -r requirements-llamacpp.txt'
N_CTX = 4096  # positions a peer run may hold (prompt + answer)
N_BATCH = 512  # rows per llama_decode (a longer prompt goes in several)
_STATE: dict[str, Any] = {}  # the imported binding, or why it is not there
_LOADED: dict[str, Any] = {}  # one llama.cpp model per file per process
_LOCK = threading.Lock()


def _import() -> Any:
    import llama_cpp

    return llama_cpp


def binding() -> Any | None:
    """The `llama_cpp` module, initialised once per process (its log silenced); None when it does not load."""
    with _LOCK:
        if "lib" not in _STATE:
            try:
                lib = _import()
                lib.llama_backend_init()
                _STATE["quiet"] = lib.llama_log_callback(lambda level, text, data: None)
                lib.llama_log_set(_STATE["quiet"], ctypes.c_void_p())
                _STATE["lib"] = lib
            except Exception as e:  # noqa: BLE001 - not installed, or a broken build: the peer is skipped
                _STATE["lib"], _STATE["why"] = None, f"{type(e).__name__}: {e}"
        return _STATE["lib"]


def missing() -> str:
    """Why the binding does not load, with the one command that installs it, in one line ("" when it loads)."""
    if binding() is not None:
        return ""
    return f"llama.cpp is not installed here ({str(_STATE.get('why', ''))[:80]}); install it with: {INSTALL}"


def _lib() -> Any:
    if (lib := binding()) is None:
        raise RuntimeError(missing())
    return lib


def f32_of(gguf: Path) -> Path:
    """`gguf`'s F32 copy in the project's cache, keyed by the file's path, size and time; made once, dequantised
    exactly by llama.cpp's quantizer, written aside, then moved."""
    st = gguf.stat()
    tag = hashlib.sha1(f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:12]
    dest = cache_root() / "gguf" / f"{gguf.stem}.{tag}.F32.gguf"
    if dest.is_file():
        return dest
    lib = _lib()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    params = lib.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = lib.LLAMA_FTYPE_ALL_F32, True, torch.get_num_threads()
    try:
        if lib.llama_model_quantize(str(gguf).encode(), str(tmp).encode(), ctypes.byref(params)) != 0:
            raise ValueError(f"llama.cpp could not dequantise {gguf.name}")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def load(path: Path) -> Any:
    """llama.cpp's model of `path`, loaded once per process (weights only); ValueError naming a file it cannot read."""
    lib = _lib()
    with _LOCK:
        if str(path) not in _LOADED:
            params = lib.llama_model_default_params()
            params.n_gpu_layers = 0
            model = lib.llama_model_load_from_file(str(path).encode(), params)
            if not model:
                raise ValueError(f"llama.cpp cannot read the GGUF file {path.name}")
            _LOADED[str(path)] = model
        return _LOADED[str(path)]


def decode(gguf: Path, prompt_ids: list[int], cfg: Any, eos_ids: tuple[int, ...]) -> tuple[list[int], float, str]:
    """llama.cpp's plain decoding of `gguf`'s F32 copy with its sampler chain (as `llama-completion`), in a fresh
    context: the new token ids, the wall time with the prefill (copy, load, context made before it), why it stopped."""
    lib, path = _lib(), f32_of(gguf)
    p = lib.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = N_CTX, N_BATCH, N_BATCH, 1
    p.n_threads = p.n_threads_batch = torch.get_num_threads()  # the threads our engine runs on
    p.embeddings, p.pooling_type, p.no_perf = False, lib.LLAMA_POOLING_TYPE_NONE, True
    ctx = lib.llama_init_from_model(load(path), p)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not make a context for {path.name}")
    smpl = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
    if cfg.greedy:
        lib.llama_sampler_chain_add(smpl, lib.llama_sampler_init_greedy())
    else:
        if cfg.top_k:
            lib.llama_sampler_chain_add(smpl, lib.llama_sampler_init_top_k(cfg.top_k))
        if cfg.top_p < 1.0:
            lib.llama_sampler_chain_add(smpl, lib.llama_sampler_init_top_p(cfg.top_p, 1))
        lib.llama_sampler_chain_add(smpl, lib.llama_sampler_init_temp(cfg.temperature))
        lib.llama_sampler_chain_add(smpl, lib.llama_sampler_init_dist(cfg.seed))
    new: list[int] = []
    try:
        t0 = time.perf_counter()
        for i in range(0, len(prompt_ids) - 1, N_BATCH):  # the prompt but its last token, N_BATCH rows at a time
            part = prompt_ids[i : min(i + N_BATCH, len(prompt_ids) - 1)]
            toks = (lib.llama_token * len(part))(*part)  # held while the batch points at it
            if lib.llama_decode(ctx, lib.llama_batch_get_one(toks, len(part))) != 0:
                raise RuntimeError("llama_decode failed on the prompt in the llama_cpp peer")
        t = prompt_ids[-1]
        for _ in range(cfg.max_new_tokens):
            last = (lib.llama_token * 1)(t)  # held while the batch points at it
            if lib.llama_decode(ctx, lib.llama_batch_get_one(last, 1)) != 0:
                raise RuntimeError("llama_decode failed in the llama_cpp peer")
            t = int(lib.llama_sampler_sample(smpl, ctx, -1))
            new.append(t)
            if t in eos_ids:
                break
        wall = time.perf_counter() - t0
    finally:
        lib.llama_sampler_free(smpl)
        lib.llama_free(ctx)
    return new, wall, "eos" if new and new[-1] in eos_ids else "max_new_tokens"
