"""The small model interface the engine drives: feed new tokens through a KV cache, crop it.

Weights are shared between runs and users; the cache is not: every run builds fresh
`CachedLM`s over the loaded models, so concurrent users never share cache state.
"""
from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import DynamicCache

from .backend import BACKENDS, backend_flags, common_prefix_len, new_tokens  # noqa: F401 (re-exported)


class LM(Protocol):
    """What the engine needs from a model: cached forward over new tokens, and rollback."""

    role: str
    ids: list[int]  # tokens whose keys/values are in the cache, in order
    n_forward: int
    time_s: float
    fed: list[int]  # new tokens fed by each forward since the counters were reset (cost profile)

    def logits(self, seq: list[int], keep: int) -> torch.Tensor: ...  # [keep, V] fp32, CPU
    def rollback(self, seq: list[int]) -> None: ...


@dataclass
class ModelTriplet:
    """Three loaded causal LMs that share one tokenizer, ready for the engine."""

    draft: torch.nn.Module
    qualifier: torch.nn.Module
    target: torch.nn.Module
    tokenizer: Any  # the target's tokenizer (all three agree on ids)
    vocab_size: int  # shared tokenizer length: every model's logits are sliced to it
    eos_ids: tuple[int, ...]
    names: tuple[str, str, str]  # draft, qualifier, target references
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32
    preset: str = "custom"
    attention: str = "sdpa"  # "rowwise": passes compute each position as a one-token step (core.attention)
    note: str = ""  # shown to users, e.g. "draft and qualifier are the target itself"
    backend: str = "default"  # CPU matmul backend for every forward: one of BACKENDS
    choice_note: str = ""  # how dtype and backend were chosen (probe / cached / flag), shown to users
    exact: bool | None = None  # a k-token pass equals k one-token steps bitwise here (None: not checked)
    exact_note: str = ""  # what that means for the lossless methods, from the probe's record (core.exactness)
    path: str = "hf"  # the forward every run uses: "hf" (CachedLM) or "lean" (core.lean, where it applies)

    def model(self, role: str) -> torch.nn.Module:
        return {"draft": self.draft, "qualifier": self.qualifier, "target": self.target}[role]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class CachedLM:
    """One model's per-run decoding state over a Hugging Face causal LM."""

    def __init__(self, model: torch.nn.Module, vocab_size: int, role: str, backend: str = "default"):
        self.model, self.vocab_size, self.role, self.backend = model, vocab_size, role, backend
        # inputs go to the token embedding's device (a model spread over devices by accelerate
        # moves activations itself; logits come back to the CPU in `logits`)
        emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        self.device = emb.weight.device if emb is not None else next(model.parameters()).device
        if self.device.type == "meta":  # an offloaded embedding: its hook moves inputs where they run
            self.device = torch.device("cpu")
        self.cache = DynamicCache(config=model.config)
        # transformers 5 renamed `past_key_values` to `cache`; accept either generation
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.ids: list[int] = []
        self.n_forward = 0
        self.time_s = 0.0
        self.fed: list[int] = []  # new tokens of each forward since the counters were reset

    @torch.inference_mode()
    def logits(self, seq: list[int], keep: int) -> torch.Tensor:
        """Logits for the last `keep` positions of `seq`, feeding only what the cache lacks."""
        new = new_tokens(self.ids, seq, keep, self.role)
        t0 = time.perf_counter()
        x = torch.tensor([new], dtype=torch.long, device=self.device)  # [1, n]
        with backend_flags(self.backend):
            out = self.model(input_ids=x, use_cache=True, logits_to_keep=keep, **{self.cache_kw: self.cache})
        z = out.logits[0, -keep:, : self.vocab_size].float().cpu()  # [keep, V]
        _sync(self.device)
        self.time_s += time.perf_counter() - t0
        self.n_forward += 1
        self.fed.append(len(new))
        self.ids.extend(new)
        return z

    def rollback(self, seq: list[int]) -> None:
        """Crop the cache to the longest prefix it shares with the committed `seq`.

        The last committed token is always left out, so the next forward has a token to feed.
        """
        keep = min(common_prefix_len(self.ids, seq), len(seq) - 1)
        drop = len(self.ids) - keep
        if drop:
            self.cache.crop(-drop)
            del self.ids[keep:]

    def reset_counters(self) -> None:
        """Start counting forward passes and time afresh (prefill is reported apart)."""
        self.n_forward, self.time_s, self.fed = 0, 0.0, []

    @property
    def cache_len(self) -> int:
        return self.cache.get_seq_length()


PATHS = ("hf", "lean")


def open_lm(model: torch.nn.Module, vocab_size: int, role: str, backend: str = "default",
            path: str = "hf") -> LM:
    """A fresh per-run LM over a loaded model: the lean forward where `path` asks for it and the model's
    architecture is covered (`lean.supports_lean`), else HF's forward (`CachedLM`)."""
    if path not in PATHS:
        raise ValueError(f"unknown forward path {path!r}; choose one of {', '.join(PATHS)}")
    if path == "lean":
        from .lean import LeanLM, supports_lean

        if supports_lean(model):
            return LeanLM(model, vocab_size, role, backend)
    return CachedLM(model, vocab_size, role, backend)


def encode_prompt(tokenizer: Any, text: str, chat: bool = True) -> list[int]:
    """Token ids for a user prompt: through the chat template when the tokenizer has one."""
    if chat and getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return [int(i) for i in ids]
    return [int(i) for i in tokenizer(text, add_special_tokens=True)["input_ids"]]
