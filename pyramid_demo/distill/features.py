"""On-policy data for a proposer that reads the target (EAGLE-style): the target's own answers and its
final *normed* hidden state f_t at every position, prompt included.

Why every position: the head attends over the whole sequence at decode time (its own cache covers the
prompt), so it must train over the prompt's states too. The states come out of the generation itself
(prefill gives the prompt's, each decode step its token's), so no second teacher pass is needed.
One shard per batch, written atomically: resumable, and readable while generation goes on.

Prompt variety: the students' templates plus `EXTRA_TEMPLATES` (training topics only; the held-out
set stays the students' own, so every proposer is measured on the same answers).
"""
from __future__ import annotations

import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from . import data as dd

EXTRA_TEMPLATES = [
    "Answer briefly: what is {t}?",
    "Write three tips about {t} for a busy person.",
    "Describe {t} as if you were a tour guide.",
    "What is the most surprising thing about {t}?",
    "Write a limerick about {t}.",
    "Give an analogy that explains {t}.",
    "Write a haiku about {t}, then explain it.",
    "What should a student remember about {t} for an exam?",
    "Write a news headline and a one-paragraph article about {t}.",
    "Explain {t} in exactly three sentences.",
    "List the steps of a small project about {t}.",
    "Write a JavaScript snippet related to {t} and explain each line.",
    "What are five questions people often ask about {t}? Answer each in one sentence.",
    "Argue for and against {t} in two short paragraphs.",
    "Write a recipe-style guide, with ingredients and steps, for learning {t}.",
    "Imagine {t} in the year 2100. Describe it.",
    "Translate the idea of {t} into a simple story for children.",
    "Write a letter from the perspective of {t}.",
    "Create a table in markdown with three facts about {t}.",
    "What is the difference between a beginner and an expert in {t}?",
]


def feature_prompts(split: str, seed: int) -> list[str]:
    """Training prompts: every template (the students' and the extras) × the training topics, shuffled;
    held-out: the students' held-out prompts, unchanged."""
    if split != "train":
        return dd.prompts(split, seed)
    out = [tpl.format(t=t) for t in dd.TOPICS for tpl in dd.TEMPLATES + EXTRA_TEMPLATES]
    random.Random(seed).shuffle(out)
    return out


@torch.inference_mode()
def answer_batch(model, prompt_ids: list[list[int]], max_new: int, eos: int, pad: int,
                 gen: torch.Generator, temperature: float = 0.8, top_p: float = 0.95) -> list[dict]:
    """Sample answers for a batch (left padding, KV cache). One record per prompt: ids [n] int32
    (prompt + answer, EOS included if produced), n_prompt, and f [n-1, D] fp16, the target's normed final
    state at positions 0..n-2 (f[t] gives the target's logits for token t+1: `lm_head(f[t])`)."""
    from transformers import DynamicCache

    B = len(prompt_ids)
    L, dev, ids, mask, pos = dd.left_padded(model, prompt_ids, pad)
    cache = DynamicCache(config=model.config)
    hook = dd._NormHook(model.model.norm)
    try:
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        fs = [hook.outs.pop()]  # [B, L, D]: the (left padded) prompt
        toks, done, last = [], torch.zeros(B, dtype=torch.bool, device=dev), pos[:, -1]
        for step in range(max_new):
            probs, cand = dd._filter(out.logits[:, -1], temperature, top_p)
            pick = torch.multinomial(probs.float().cpu(), 1, generator=gen).to(dev)
            nxt = torch.where(done, torch.full_like(done, pad, dtype=torch.long), cand.gather(1, pick).squeeze(1))
            toks.append(nxt)
            done = done | (nxt == eos)
            if bool(done.all()) or step == max_new - 1:
                break
            mask = torch.cat([mask, torch.ones((B, 1), dtype=torch.long, device=dev)], 1)
            last = last + 1
            out = model(input_ids=nxt.unsqueeze(1), attention_mask=mask, position_ids=last.unsqueeze(1),
                        past_key_values=cache, use_cache=True, logits_to_keep=1)
            fs.append(hook.outs.pop())  # [B, 1, D]
    finally:
        hook.close()
    F_ = torch.cat(fs, 1).cpu()  # [B, L + fed, D]
    T = torch.stack(toks, 1).cpu()  # [B, steps]
    recs = []
    for b, p in enumerate(prompt_ids):
        ans = T[b].tolist()
        n = ans.index(eos) + 1 if eos in ans else len(ans)
        f = F_[b, L - len(p): L + n - 1]  # positions 0 .. len(p) + n - 2
        recs.append({"ids": torch.tensor(p + ans[:n], dtype=torch.int32), "n_prompt": len(p),
                     "f": f.to(torch.float16).clone()})
    return recs


def shard_path(out_dir: Path, split: str, i: int) -> Path:
    return out_dir / split / f"shard_{i:05d}.pt"


def generate(model, tokenizer, out_dir: str | Path, split: str = "train", rounds: int = 1, batch: int = 64,
             max_new: int = 128, seed: int = 0, max_batches: int | None = None,
             stop_at: float | None = None) -> int:
    """Answer every prompt of `split` `rounds` times, one shard per batch, skipping shards on disk.
    Returns the number of answer tokens written by this call."""
    out_dir = Path(out_dir)
    (out_dir / split).mkdir(parents=True, exist_ok=True)
    ps = feature_prompts(split, seed)
    items = []
    for r in range(rounds):
        order = ps[:]
        random.Random(seed * 1000 + r).shuffle(order)
        items += order
    batches = [items[i:i + batch] for i in range(0, len(items), batch)][:max_batches]
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    n_tok, t0 = 0, time.time()
    bar = tqdm([i for i in range(len(batches)) if not shard_path(out_dir, split, i).exists()],
               desc=f"features {split}", unit="batch")
    for i in bar:
        if stop_at is not None and time.time() > stop_at:
            break
        gen = torch.Generator().manual_seed(seed * 1_000_003 + i * 7919 + (0 if split == "train" else 17))
        recs = answer_batch(model, [dd.chat_ids(tokenizer, t) for t in batches[i]], max_new, eos, pad, gen)
        for r, t in zip(recs, batches[i]):
            r["prompt"] = t
        n_tok += sum(len(r["ids"]) - r["n_prompt"] for r in recs)
        p = shard_path(out_dir, split, i)
        torch.save(recs, p.with_suffix(".tmp"))
        p.with_suffix(".tmp").replace(p)
        bar.set_postfix(tokens=n_tok, tok_s=round(n_tok / max(time.time() - t0, 1e-9)))
    return n_tok


def load(out_dir: str | Path, split: str, limit: int | None = None) -> list[dict]:
    """Every record of `split` (shards in order), at most `limit` shards."""
    recs: list[dict] = []
    for p in sorted((Path(out_dir) / split).glob("shard_*.pt"))[:limit]:
        recs += torch.load(p, weights_only=False)
    return recs
