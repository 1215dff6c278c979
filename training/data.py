"""Prompt set and on-policy data for distilling students of the offline SmolLM2 target.

The prompts are templates x topics (explanations, code, stories, lists, QA, ...). The
target answers them itself through its chat template (batched, left-padded, sampled with
an explicit torch.Generator); for every answer position we keep the target's final
*normed* hidden state h (fp16), from which its logits are exactly `lm_head(h)`, so the
teacher never has to run again during training. One shard file per batch: resumable.
"""
from __future__ import annotations

import hashlib
import random
from pathlib import Path

import torch
from tqdm import tqdm

TEMPLATES = [
    "Explain {t} in simple terms.",
    "Write a short story about {t}.",
    "Give me a list of five interesting facts about {t}.",
    "What are the pros and cons of {t}?",
    "Write a Python function related to {t}, with a docstring and an example.",
    "Write a short poem about {t}.",
    "How would you explain {t} to a ten-year-old?",
    "Summarize the history of {t} in a paragraph.",
    "What are common misconceptions about {t}?",
    "Write a step-by-step guide to getting started with {t}.",
    "Compare {t} with something similar and explain the differences.",
    "Write an email to a friend recommending {t}.",
    "What questions should a beginner ask about {t}? Answer three of them.",
    "Describe a typical day of someone who works with {t}.",
    "Write a dialogue between a teacher and a student about {t}.",
    "List the key terms someone should know about {t}, with one-line definitions.",
    "Why is {t} important? Give three reasons.",
    "Write a product description for a book about {t}.",
    "What would the world look like without {t}?",
    "Give a quiz of three multiple-choice questions about {t}, with answers.",
    "Write a tweet and a short blog introduction about {t}.",
    "What are the main challenges in {t} today?",
    "Tell me a joke about {t} and explain why it is funny.",
    "Write pseudocode or a small program that simulates {t}.",
]

TOPICS = [
    "photosynthesis", "black holes", "the French Revolution", "machine learning", "volcanoes",
    "the water cycle", "sorting algorithms", "climate change", "the human heart", "bees",
    "the Roman Empire", "electric cars", "chess", "coffee", "recursion", "the moon landing",
    "vaccines", "earthquakes", "jazz music", "the stock market", "renewable energy",
    "dinosaurs", "the internet", "gardening", "ancient Egypt", "sleep", "neural networks",
    "the solar system", "databases", "friendship", "soccer", "bread baking", "glaciers",
    "the printing press", "linked lists", "rainforests", "meditation", "cryptography",
    "the immune system", "robots", "origami", "hash tables", "the ocean", "volunteering",
    "public libraries", "the Olympic Games", "honey", "time management", "bicycles",
    "mountains", "the Great Wall of China", "electricity", "weather forecasting", "penguins",
    "video games", "recycling", "Shakespeare", "the periodic table", "trains", "mushrooms",
    "smartphones", "the Renaissance", "binary numbers", "deserts", "airplanes", "cats",
    "dogs", "space exploration", "learning a new language", "web browsers", "tea",
    "compound interest", "the Amazon river", "chocolate", "microscopes", "democracy",
    "musical instruments", "solar panels", "the Pythagorean theorem", "regular expressions",
    "spiders", "lighthouses", "camping", "the Industrial Revolution", "DNA", "fractions",
    "operating systems", "tornadoes", "museums", "pizza", "knitting", "satellites",
    "the Moon", "sharks", "first aid", "probability", "castles", "the Silk Road", "rivers",
    "unit testing", "birds migration", "paper money", "wind turbines", "yoga", "the Vikings",
    "plate tectonics", "git version control", "snow", "owls", "architecture", "vitamins",
]

# held-out topics: never used in training (evaluation prompts)
HELDOUT_TOPICS = [
    "octopuses", "the Eiffel Tower", "quantum computing", "marathon running", "ice cream",
    "the Mars rover", "sign language", "bridges", "coral reefs", "board games",
    "the telescope", "recursion in mathematics", "volcanic islands", "podcasts",
    "electric guitars", "the metric system",
]


def prompts(split: str = "train", seed: int = 0) -> list[str]:
    """All train prompts (templates x TOPICS) or held-out prompts (HELDOUT_TOPICS), shuffled."""
    topics = TOPICS if split == "train" else HELDOUT_TOPICS
    out = [tpl.format(t=t) for t in topics for tpl in TEMPLATES]
    if split != "train":  # a fixed, smaller held-out set: 3 templates per topic
        out = [p for p in out if int(hashlib.md5(p.encode()).hexdigest(), 16) % 8 < 3]
    random.Random(seed).shuffle(out)
    return out


def chat_ids(tokenizer, text: str) -> list[int]:
    out = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(i) for i in ids]


X_LAYER = 5  # also keep the target's hidden state entering this layer (frozen-bottom students)


class _NormHook:
    """Captures the output of a module (default: the target's final norm = its normed last
    hidden state)."""

    def __init__(self, module):
        self.outs: list[torch.Tensor] = []
        self.h = module.register_forward_hook(
            lambda m, i, o: self.outs.append((o[0] if isinstance(o, tuple) else o).detach()))

    def close(self):
        self.h.remove()


def _filter(logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 200) -> tuple:
    """Sampling distribution over the top_k logits after temperature and top-p: (probs, ids)."""
    z, idx = torch.topk(logits.float(), top_k, dim=-1)  # sorted, descending
    p = torch.softmax(z / temperature, -1)
    if top_p < 1.0:
        drop = p.cumsum(-1) - p > top_p
        p = p.masked_fill(drop, 0.0)
    return p, idx


def left_padded(model, prompt_ids: list[list[int]], pad: int) -> tuple:
    """A batch of prompts left-padded on the target's device: (L, device, ids [B, L], mask [B, L], positions)."""
    B, L = len(prompt_ids), max(len(p) for p in prompt_ids)
    dev = next(model.parameters()).device  # the batch runs where the target is (CPU or a GPU)
    ids = torch.full((B, L), pad, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    for b, p in enumerate(prompt_ids):
        ids[b, L - len(p):] = torch.tensor(p)
        mask[b, L - len(p):] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    return L, dev, ids, mask, (mask.cumsum(1) - 1).clamp_min(0)


@torch.inference_mode()
def generate_batch(model, prompt_ids: list[list[int]], max_new: int, eos: int, pad: int,
                   gen: torch.Generator, temperature: float = 0.8, top_p: float = 0.95) -> list[dict]:
    """Sample continuations for a batch (left padding, KV cache). Returns one record per
    prompt: ids (prompt + answer, eos included if produced), n_prompt, and h [n-n_prompt, D]
    fp16 = the target's normed hidden states at positions n_prompt-1 .. n-2 (each predicts
    the next answer token), and x [n-1, D] fp16 = the target's hidden state entering layer
    X_LAYER at positions 0 .. n-2."""
    from transformers import DynamicCache

    B = len(prompt_ids)
    L, dev, ids, mask, pos = left_padded(model, prompt_ids, pad)
    cache = DynamicCache(config=model.config)
    hook = _NormHook(model.model.norm)
    xhook = _NormHook(model.model.layers[X_LAYER - 1])
    try:
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        hs = [hook.outs.pop()[:, -1]]  # [B, D] at the last prompt position
        xs = [xhook.outs.pop()]  # [B, L, D] over the (left padded) prompt
        toks, done = [], torch.zeros(B, dtype=torch.bool, device=dev)
        last_pos = pos[:, -1]
        for step in range(max_new):
            probs, cand = _filter(out.logits[:, -1], temperature, top_p)
            pick = torch.multinomial(probs.float().cpu(), 1, generator=gen).to(dev)  # the CPU generator: seeded alike
            nxt = cand.gather(1, pick).squeeze(1)
            nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
            toks.append(nxt)
            done = done | (nxt == eos)
            if bool(done.all()) or step == max_new - 1:
                break
            mask = torch.cat([mask, torch.ones((B, 1), dtype=torch.long, device=dev)], 1)
            last_pos = last_pos + 1
            out = model(input_ids=nxt.unsqueeze(1), attention_mask=mask, position_ids=last_pos.unsqueeze(1),
                        past_key_values=cache, use_cache=True, logits_to_keep=1)
            hs.append(hook.outs.pop()[:, -1])
            xs.append(xhook.outs.pop())
    finally:
        hook.close()
        xhook.close()
    X = torch.cat(xs, 1).cpu()  # [B, L + fed, D]
    T = torch.stack(toks, 1).cpu()  # [B, steps]
    H = torch.stack(hs, 1).cpu()  # [B, steps]: H[:, j] is where T[:, j] was predicted
    recs = []
    for b, p in enumerate(prompt_ids):
        ans = T[b].tolist()
        n = len(ans)
        if eos in ans:
            n = ans.index(eos) + 1
        n = min(n, H.shape[1])
        x = X[b, L - len(p): L + n - 1]  # positions 0 .. len(ids) - 2
        recs.append({"ids": torch.tensor(p + ans[:n], dtype=torch.int32), "n_prompt": len(p),
                     "h": H[b, :n].to(torch.float16).clone(),
                     "x": x.to(torch.float16).clone(), "x_layer": X_LAYER})
    return recs


def shard_path(out_dir: Path, split: str, i: int) -> Path:
    return out_dir / split / f"shard_{i:05d}.pt"


def generate(model, tokenizer, out_dir: str | Path, split: str = "train", rounds: int = 1,
             batch: int = 48, max_new: int = 128, seed: int = 0, temperature: float = 0.8,
             top_p: float = 0.95, max_batches: int | None = None, stop_at: float | None = None) -> int:
    """Answer every prompt of `split` `rounds` times; one shard per batch, skipping shards
    already on disk. Returns the number of shards present afterwards."""
    import time

    out_dir = Path(out_dir)
    (out_dir / split).mkdir(parents=True, exist_ok=True)
    ps = prompts(split, seed)
    items = []
    for r in range(rounds):
        order = ps[:]
        random.Random(seed * 1000 + r).shuffle(order)
        items += order
    batches = [items[i:i + batch] for i in range(0, len(items), batch)]
    if max_batches is not None:
        batches = batches[:max_batches]
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    todo = [i for i in range(len(batches)) if not shard_path(out_dir, split, i).exists()]
    bar = tqdm(todo, desc=f"generate {split}", unit="batch")
    n_tok = 0
    for i in bar:
        if stop_at is not None and time.time() > stop_at:
            break
        gen = torch.Generator().manual_seed(seed * 1_000_003 + i * 7919 + (0 if split == "train" else 17))
        recs = generate_batch(model, [chat_ids(tokenizer, t) for t in batches[i]], max_new, eos, pad,
                              gen, temperature, top_p)
        for r, t in zip(recs, batches[i]):
            r["prompt"] = t
        n_tok += sum(int(r["h"].shape[0]) for r in recs)
        p = shard_path(out_dir, split, i)
        torch.save(recs, p.with_suffix(".tmp"))
        p.with_suffix(".tmp").replace(p)
        bar.set_postfix(tokens=n_tok)
    return sum(1 for i in range(len(batches)) if shard_path(out_dir, split, i).exists())


def load_records(out_dir: str | Path, split: str) -> list[dict]:
    recs = []
    for p in sorted((Path(out_dir) / split).glob("shard_*.pt")):
        recs += torch.load(p, weights_only=False)
    return recs
