"""Run a method on a loaded triplet: validate, prefill, stream `RunResult` snapshots."""
from __future__ import annotations

from typing import Iterator

import torch

from .config import DecodeConfig
from .engine import decode, prefill, roles_for
from .lm import ModelTriplet, encode_prompt, open_lm
from .stats import compute_stats
from .trace import RunResult, Step

MAX_PROMPT_CHARS = 20_000


def context_limit(triplet: ModelTriplet) -> int:
    """The smallest context window of the three models."""
    sizes = [getattr(triplet.model(r).config, "max_position_embeddings", None) or 10**9
             for r in ("draft", "qualifier", "target")]
    return int(min(sizes))


def prepare_prompt(triplet: ModelTriplet, prompt: str | list[int], cfg: DecodeConfig, chat: bool = True) -> list[int]:
    """Token ids for the prompt, or a ValueError that says what is wrong with it."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("the prompt is empty: type a question or instruction")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ValueError(f"the prompt is {len(prompt):,} characters; the limit is {MAX_PROMPT_CHARS:,}")
        ids = encode_prompt(triplet.tokenizer, prompt, chat=chat)
    else:
        ids = [int(i) for i in prompt]
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    block = max(cfg.gamma, cfg.l_q) + 1
    limit = context_limit(triplet)
    if len(ids) + cfg.max_new_tokens + block > limit:
        raise ValueError(
            f"the prompt is {len(ids)} tokens; with max_new_tokens={cfg.max_new_tokens} and drafts of up to "
            f"{block} tokens it exceeds the models' context of {limit} tokens — shorten the prompt or "
            f"lower max new tokens")
    return ids


def _prompt_text(triplet: ModelTriplet, prompt: str | list[int], ids: list[int], text: str | None) -> str:
    if text is not None:
        return text
    return prompt if isinstance(prompt, str) else triplet.tokenizer.decode(ids)


def _snapshot(triplet: ModelTriplet, cfg: DecodeConfig, prompt: str, ids: list[int], steps: list[Step],
              texts: list[str], prefill_s: float, stopped: str) -> RunResult:
    token_ids = [t for s in steps for t in s.new_tokens]
    return RunResult(
        method=cfg.method, config=cfg.to_dict(), models=list(triplet.names), prompt=prompt,
        prompt_ids=ids, token_ids=token_ids, token_texts=list(texts),
        origins=[o for s in steps for o in s.origins],
        text=triplet.tokenizer.decode(token_ids, skip_special_tokens=True),
        stats=compute_stats(cfg.method, steps, prefill_s, stopped), steps=list(steps),
    )


def _passes(triplet: ModelTriplet, ids: list[int], cfg: DecodeConfig, full_records: bool = True) -> Iterator[tuple]:
    """Prefill, then decode; after each target pass yield (steps, token texts, prefill_s, stopped).

    Each call builds its own caches and generator, so concurrent runs never share state.
    """
    gen = None if cfg.greedy else torch.Generator().manual_seed(cfg.seed)
    backend = getattr(triplet, "backend", "default")  # the probed (or asked) CPU backend, for every forward
    path = getattr(triplet, "path", "hf")  # HF's forward or the lean one (core.lean)
    lms = {r: open_lm(triplet.model(r), triplet.vocab_size, r, backend, path) for r in roles_for(cfg.method)}
    prefill_s = prefill(lms, ids)
    for lm in lms.values():  # prefill forwards are reported separately
        lm.reset_counters()
    steps: list[Step] = []
    texts: list[str] = []
    n_new = 0
    for step in decode(lms, ids, cfg, triplet.eos_ids, gen, full_records):
        steps.append(step)
        texts.extend(triplet.tokenizer.decode([t]) for t in step.new_tokens)
        n_new += len(step.new_tokens)
        eos = step.new_tokens[-1] in triplet.eos_ids
        yield steps, texts, prefill_s, "eos" if eos else "max_new_tokens" if n_new >= cfg.max_new_tokens else ""


def stream(triplet: ModelTriplet, prompt: str | list[int], cfg: DecodeConfig, chat: bool = True,
           text: str | None = None) -> Iterator[RunResult]:
    """Yield a snapshot after every target pass; the last one has stats.stopped set.

    `prompt` is text, or ids from `prepare_prompt` so that several runs encode it once; `text` is then
    the prompt as the user wrote it, for the record (default: the ids decoded)."""
    ids = prepare_prompt(triplet, prompt, cfg, chat)
    text = _prompt_text(triplet, prompt, ids, text)
    for steps, texts, prefill_s, stopped in _passes(triplet, ids, cfg):
        yield _snapshot(triplet, cfg, text, ids, steps, texts, prefill_s, stopped)


def generate(triplet: ModelTriplet, prompt: str | list[int], cfg: DecodeConfig, chat: bool = True,
             text: str | None = None, full_records: bool = True) -> RunResult:
    """Run to the end and return the final record (one snapshot, not one per pass); arguments as `stream`.
    `full_records=False` (bench) keeps each token's status but no display values (top-5, divergences, p/q)."""
    ids = prepare_prompt(triplet, prompt, cfg, chat)
    text = _prompt_text(triplet, prompt, ids, text)
    state = None
    for state in _passes(triplet, ids, cfg, full_records):
        pass
    assert state is not None
    return _snapshot(triplet, cfg, text, ids, *state)
