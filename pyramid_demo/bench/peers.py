"""Reference measurements beside the engine: HF `generate()` and llama.cpp peers (wall time with the prefill),
single-model speeds and the target's teacher-forced log-probability of a produced text."""

from __future__ import annotations

import copy
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from transformers.utils import logging as hf_logging

from ..core.methods import DecodeConfig
from ..forward.lm import ModelTriplet
from . import llamacpp_peer

PEERS = ("hf_generate", "hf_assisted", "hf_prompt_lookup", "llama_cpp")
PEER_ROLES = {p: ("draft", "target") if p == "hf_assisted" else ("target",) for p in PEERS}  # the models each runs
DEFAULT_PEERS = "hf_generate,hf_assisted"
PLD_TOKENS, PLD_NGRAM = 10, 3  # prompt lookup's tokens proposed per round and longest n-gram matched: the field's


@dataclass
class PeerRun:
    token_ids: list[int]
    wall_s: float
    stopped: str
    target_forwards: int | None = None  # the target's forward calls in the run (prefill's included); None: not counted


def unsupported(triplet: ModelTriplet, peer: str) -> str | None:
    """Why `peer` cannot run on this family (one line), or None when it can."""
    if peer == "llama_cpp":
        if triplet.gguf is None or triplet.dtype != torch.float32:
            return "llama_cpp skipped: the target was not loaded from a GGUF at its reference precision (fp32)"
        if why := llamacpp_peer.missing():
            return f"llama_cpp skipped: {why}"
    kind = triplet.forward("draft").kind
    if peer == "hf_assisted" and kind in ("feature", "lookup"):
        what = "prompt lookup" if kind == "lookup" else "a draft that reads the target's states"
        return (
            f"{peer} skipped: Hugging Face assisted generation takes a draft model, not {what} "
            f"({triplet.names[0]}); the engine's SD runs it (hf_prompt_lookup is transformers' own prompt lookup)"
        )
    return None


def runnable(triplet: ModelTriplet, variants: list[Any]) -> tuple[list[Any], list[str]]:
    """The bench variants this family can run, and one line for each peer it cannot (`unsupported`)."""
    why = {v.method: unsupported(triplet, v.method) for v in variants if v.kind == "peer"}
    return [v for v in variants if not why.get(v.method)], [w for w in dict.fromkeys(why.values()) if w]


@torch.inference_mode()
def hf_generate(
    triplet: ModelTriplet,
    prompt_ids: list[int],
    cfg: DecodeConfig,
    peer: str,
    lookup: tuple[int, int] | None = None,
) -> PeerRun:
    """A peer on the target: plain `generate()`, assisted generation with the draft, or HF's prompt lookup (`lookup`:
    tokens proposed, longest n-gram matched); the target's forward calls are counted by a hook, not assumed."""
    if why := unsupported(triplet, peer):
        raise ValueError(why)
    target = triplet.target  # as the engine runs it: the same weights and dtype
    dev = next(target.parameters()).device
    x = torch.tensor([prompt_ids], dtype=torch.long, device=dev)
    gc = copy.deepcopy(target.generation_config)
    gc.update(
        max_new_tokens=cfg.max_new_tokens,
        min_new_tokens=0,
        eos_token_id=list(triplet.eos_ids) or None,
        pad_token_id=triplet.eos_ids[0] if triplet.eos_ids else (triplet.tokenizer.pad_token_id or 0),
        use_cache=True,
    )
    if cfg.greedy:
        gc.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        gc.update(
            do_sample=True,
            temperature=cfg.temperature,
            top_k=cfg.top_k or None,
            top_p=cfg.top_p if cfg.top_p < 1.0 else None,
        )
        torch.manual_seed(cfg.seed)
    if peer == "hf_prompt_lookup":
        tokens, ngram = lookup or (PLD_TOKENS, PLD_NGRAM)
        gc.update(prompt_lookup_num_tokens=tokens, max_matching_ngram_size=ngram)
    assistant = triplet.draft if peer == "hf_assisted" else None
    calls = [0]  # one per target forward: a verification round (the first over the prompt too)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # HF's own deprecation notes from inside assisted generation
    hook = target.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            out = target.generate(x, attention_mask=torch.ones_like(x), generation_config=gc, assistant_model=assistant)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            wall = time.perf_counter() - t0
    finally:
        hf_logging.set_verbosity(verbosity)
        hook.remove()
    new = [int(t) for t in out[0, len(prompt_ids) :]]
    eos = next((i for i, t in enumerate(new) if t in triplet.eos_ids), None)
    if eos is not None:
        new = new[: eos + 1]
    return PeerRun(new, wall, "eos" if eos is not None else "max_new_tokens", calls[0])


def llama_cpp_generate(triplet: ModelTriplet, prompt_ids: list[int], cfg: DecodeConfig) -> PeerRun:
    """llama.cpp decoding the target's GGUF as an F32 copy (wall time): the CPU anchor our AR is measured against."""
    assert triplet.gguf is not None
    new, wall, stopped = llamacpp_peer.decode(triplet.gguf, prompt_ids, cfg, triplet.eos_ids)
    return PeerRun(new, wall, stopped, len(new))  # plain decoding: one `llama_decode` per token


@torch.inference_mode()
def target_logprob(triplet: ModelTriplet, prompt_ids: list[int], out_ids: list[int]) -> float | None:
    """The target's mean log-probability of `out_ids` after the prompt, in one teacher-forced forward."""
    if not out_ids:
        return None
    target = triplet.target
    dev = next(target.parameters()).device
    x = torch.tensor([prompt_ids + out_ids], dtype=torch.long, device=dev)
    z = target(input_ids=x, use_cache=False, logits_to_keep=len(out_ids) + 1).logits[0]
    z = z[:-1, : triplet.vocab_size].float()  # position j predicts out_ids[j]
    lp = torch.log_softmax(z, -1).gather(-1, torch.tensor(out_ids, device=dev)[:, None])
    return float(lp.mean())


def one_token_speed(triplet: ModelTriplet, role: str, prompt_ids: list[int], n: int = 8) -> float:
    """Single-model speed in tokens/s: the median of `n` cached one-token greedy forwards after the prompt."""
    lm = triplet.open(role)
    seq = list(prompt_ids)
    if len(seq) > 1:
        lm.feed(seq[:-1], 1)
    times = []
    for _ in range(n):
        t0 = lm.time_s
        z = lm.feed(seq, 1)
        times.append(lm.time_s - t0)
        seq.append(int(z[0].argmax()))
    med = statistics.median(times)
    return 1.0 / med if med > 0 else float("inf")
