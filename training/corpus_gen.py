"""On-policy answers for the corpus at the machine's limit: the target's own samples, `rows` at a time.

The prompt mix is `features.feature_prompts(mix=...)` (templates × training topics, plus other shapes; prompts
built on earlier answers read this run's finished ones). Rows are refilled as they finish (`lean_batch`), so
every step decodes `rows` live tokens. Finished sequences are written `shard_seqs` at a time as corpus shards
(ids only, `corpus.write_shard`), each with its manifest entry: stopping loses at most the unfinished rows, and
SIGTERM writes what is finished first. Speed is reported per wall second and per CPU second of this process
(on a shared machine the second is what the code costs; a `kill -STOP` pause counts in neither budget's CPU).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from . import corpus, features
from . import data as dd
from .lean_batch import BatchedLean

SOURCE = "on-policy"


def next_seed(folder: Path, base: int) -> int:
    """A seed no shard of this source used yet (≥ base): a restart continues with fresh samples."""
    used = set()
    for p in corpus.shards(folder):
        meta = corpus.read_shard(p)[2]
        if meta.get("source") == SOURCE:
            used.add(int(meta["seed"]))
    s = base
    while s in used:
        s += 1
    return s


def _kind(item: Any, templates: set[str]) -> str:
    if isinstance(item, str):
        return "template" if item in templates else "single-turn"
    if isinstance(item, dict):
        return "followup" if "followup" in item else "passage"
    return "system" if item[0]["role"] == "system" else "multi-turn"


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@torch.inference_mode()
def grow(
    model: Any,
    tokenizer: Any,
    folder: Path,
    seed: int,
    stop_at: float | None = None,
    rows: int = 64,
    max_new: int = 128,
    mix: float = 1.0,
    temperature: float = 0.8,
    top_p: float = 0.95,
    shard_seqs: int = 256,
    max_shards: int | None = None,
    capacity: int = 640,
    shard_minutes: float = 20.0,
    target: dict | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Generate until `stop_at` (wall clock), `max_shards` shards or SIGTERM; returns totals and speed. A shard is
    written at `shard_seqs` answers, or after `shard_minutes` of wall time with at least 16 (a checkpoint on a
    busy machine)."""
    templates = {t.format(t=x) for x in dd.TOPICS for t in dd.TEMPLATES + features.EXTRA_TEMPLATES}
    eos = tokenizer.eos_token_id
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    lm = BatchedLean(model, rows, capacity)
    a, b = (features.prompt_ids(tokenizer, [{"role": "user", "content": c}]) for c in ("a", "b"))
    shared = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if shared >= 4:  # the chat template's default system turn: computed once, copied into every row using it
        lm.set_prefix(a[:shared])
    gen = torch.Generator().manual_seed(seed)
    rr = random.Random(seed * 31 + 7)
    stop = {"now": False}

    def on_term(*_: Any) -> None:
        stop["now"] = True

    old = signal.signal(signal.SIGTERM, on_term)

    items: list = []
    cycle = 0

    def next_prompt(earlier: list[dict]) -> tuple[list[int], Any, str]:
        nonlocal items, cycle
        while True:
            if not items:  # a new pass over the prompt set, shuffled anew
                items = features.feature_prompts("train", seed * 101 + cycle, mix)
                cycle += 1
            item = items.pop()
            msgs = features.resolve(item, earlier, tokenizer, rr, max_tokens=capacity - max_new - 64)
            ids = features.prompt_ids(tokenizer, msgs)
            if len(ids) + max_new <= capacity:
                return ids, msgs, _kind(item, templates)

    done: list[dict] = []  # finished, not yet written
    recent: list[dict] = []  # the last finished answers (for prompts built on earlier answers)
    live: list[dict] = [{} for _ in range(rows)]
    written = {"shards": 0, "sequences": 0, "answer_tokens": 0}
    t0, c0 = time.time(), time.process_time()
    t_shard, c_shard, tok_shard = t0, c0, 0
    load0 = os.getloadavg()

    def refill(slots: list[int]) -> torch.Tensor:
        ps = []
        for b in slots:
            ids, msgs, kind = next_prompt(recent)
            live[b] = {
                "prompt_ids": ids,
                "ans": [],
                "kind": kind,
                "prompt": msgs[0]["content"] if len(msgs) == 1 and msgs[0]["role"] == "user" else msgs,
            }
            ps.append(ids)
        return lm.prefill(slots, ps)  # [len(slots), V]

    def flush() -> None:
        nonlocal done, t_shard, c_shard, tok_shard
        if not done:
            return
        now, cnow = time.time(), time.process_time()
        kinds: dict[str, int] = {}
        for r in done:
            kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
        n_ans = sum(len(r["ans"]) for r in done)
        meta = {
            "source": SOURCE,
            "seed": seed,
            "shard_index": written["shards"],
            "sampling": {"temperature": temperature, "top_p": top_p, "top_k": 200, "max_new_tokens": max_new},
            "prompts": {"mix": mix, "kinds": kinds, "generator": "training.features.feature_prompts"},
            "target": target or {},
            "dtype": dtype,
            "rows": rows,
            "machine": corpus.machine(),
            "speed": {
                "answer_tok_per_wall_s": round(n_ans / max(now - t_shard, 1e-9), 1),
                "answer_tok_per_cpu_s": round(n_ans / max(cnow - c_shard, 1e-9), 1),
                "loadavg_1m": round(os.getloadavg()[0], 2),
                "torch_threads": torch.get_num_threads(),
            },
            "code": _commit(),
        }
        name = f"onpolicy_s{seed:04d}_{written['shards']:04d}"
        entry = corpus.write_shard(
            folder, name, [r["prompt_ids"] + r["ans"] for r in done], [len(r["prompt_ids"]) for r in done], meta
        )
        written["shards"] += 1
        written["sequences"] += entry["sequences"]
        written["answer_tokens"] += entry["answer_tokens"]
        log(
            f"shard {name}: {entry['sequences']} answers, {entry['answer_tokens']:,} answer tokens, "
            f"{meta['speed']['answer_tok_per_wall_s']} tok/s wall, {meta['speed']['answer_tok_per_cpu_s']} tok/s CPU"
        )
        done, t_shard, c_shard, tok_shard = [], now, cnow, 0

    steps = 0
    try:
        logits = refill(list(range(rows)))
        while True:
            probs, cand = dd._filter(logits, temperature, top_p)  # [B, 200] each
            nxt = cand.gather(1, torch.multinomial(probs, 1, generator=gen)).squeeze(1)  # [B]
            finished = []
            for b in range(rows):
                t = int(nxt[b])
                live[b]["ans"].append(t)
                if t == eos or len(live[b]["ans"]) >= max_new:
                    finished.append(b)
            for b in finished:
                rec = live[b]
                done.append(rec)
                recent.append(
                    {"ids": rec["prompt_ids"] + rec["ans"], "n_prompt": len(rec["prompt_ids"]), "prompt": rec["prompt"]}
                )
                del recent[:-64]
            steps += 1
            if len(done) >= shard_seqs or (len(done) >= 16 and time.time() - t_shard > 60 * shard_minutes):
                flush()
            if steps % 200 == 0:
                log(
                    f"step {steps}: {len(done)} answers waiting, {written['shards']} shards written, "
                    f"{time.process_time() - c0:.0f} CPU-s, load {os.getloadavg()[0]:.1f}"
                )
            if (
                stop["now"]
                or (stop_at is not None and time.time() > stop_at)
                or (max_shards is not None and written["shards"] >= max_shards)
            ):
                break
            logits = lm.step(nxt)  # [B, V]: every row advances (a finished row's step is overwritten below)
            if finished:
                logits[finished] = refill(finished)
    finally:
        if stop["now"] or (stop_at is not None and time.time() > stop_at):
            flush()  # what is finished is kept
        signal.signal(signal.SIGTERM, old)
    out = {
        **written,
        "wall_s": round(time.time() - t0, 1),
        "cpu_s": round(time.process_time() - c0, 1),
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
    }
    log(json.dumps(out))
    return out
