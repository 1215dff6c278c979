"""On-policy data for a proposer that reads the target (EAGLE-style): the target's own answers and its
final *normed* hidden state f_t at every position, prompt included.

Why every position: the head attends over the whole sequence at decode time (its own cache covers the
prompt), so it must train over the prompt's states too. The states come out of the generation itself
(prefill gives the prompt's, each decode step its token's), so no second teacher pass is needed.
One shard per batch, written atomically: resumable, and readable while generation goes on.

Prompt variety: `training.data`'s templates plus `EXTRA_TEMPLATES` × the training topics, and (`mix`) as many
prompts of other shapes (`varied_prompts`): system prompts, short and long prompts, topic-free tasks (arithmetic,
word lists, code to read or fix, reviews to classify), constraints on the answer's form and length, canned
multi-turn chats, and prompts built on the target's own earlier answers (a follow-up turn after one of them, or
one of them as a passage to summarise, rewrite, ...). Training topics only: the held-out set stays
`data.prompts("heldout")`, so every proposer is measured on the same answers.
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


def feature_prompts(split: str, seed: int, mix: float = 0.0) -> list:
    """Training prompts: every template (`data.TEMPLATES` and the extras) × the training topics, plus `mix` times
    as many `varied_prompts`, shuffled; held-out: `data.prompts("heldout")`, unchanged. An item is a
    string (one user turn), a list of chat messages, or a dict that `resolve` completes with an earlier answer."""
    if split != "train":
        return dd.prompts(split, seed)
    out: list = [tpl.format(t=t) for t in dd.TOPICS for tpl in dd.TEMPLATES + EXTRA_TEMPLATES]
    out += varied_prompts(int(mix * len(out)), seed)
    random.Random(seed).shuffle(out)
    return out


SYSTEMS = [
    "You are a concise assistant. Answer in as few words as possible.",
    "You are a friendly teacher.",
    "You are an expert software engineer.",
    "Always answer with a bulleted list.",
    "You are a helpful assistant that explains things step by step.",
    "You are a witty assistant.",
    "Answer like a careful scientist, and say when you are unsure.",
    "You write for a children's magazine.",
]
SHORT = [
    "hi",
    "Hello!",
    "thanks",
    "What can you do?",
    "{t}",
    "{t}?",
    "Tell me something interesting.",
    "Define {t}.",
    "One word for {t}?",
    "Yes or no: is {t} useful?",
    "why {t}",
    "{t} facts pls",
    "Who are you?",
    "Give me a random fact.",
    "Good morning! Any advice for today?",
]
FORMS = [
    "Explain {t} in under 20 words.",
    "Write a 200-word essay about {t}.",
    'Answer in JSON with the keys "name" and "summary": what is {t}?',
    "Describe {t} in one sentence.",
    "Give exactly two bullet points about {t}.",
    "Write a numbered list of seven things related to {t}.",
    "Explain {t}. Use at most three short paragraphs and end with a question.",
    "Write a long, detailed explanation of {t} with headings.",
    "Compare {t}, {u} and {v} in a markdown table.",
    "Write a short story that involves both {t} and {u}.",
    "What do {t} and {u} have in common?",
    "I am preparing a talk on {t} for my colleagues, who know a lot about {u} but nothing about {t}. "
    "Suggest an outline of five parts, and for each part one sentence that links it to {u}.",
]
FOLLOWUPS = [
    "Can you make that shorter?",
    "Can you give an example?",
    "Explain that again for a child.",
    "Thanks! What else should I know?",
    "Now write it as a list.",
    "Why?",
    "Are you sure?",
    "Can you summarise that in one sentence?",
    "Give me three more.",
    "What is the most important part?",
    "Now do the same for {t}.",
    "Translate that into simple English.",
    "Continue.",
]
PASSAGE = [
    "Summarize the following text in one sentence:\n\n{p}",
    "Rewrite this text in a formal tone:\n\n{p}",
    "Extract the key points from this text:\n\n{p}",
    "Give this text a title:\n\n{p}",
    "Find any mistakes in this text and correct them:\n\n{p}",
    "{p}\n\nWrite three questions about the text above.",
    "Here are my notes:\n{p}\n\nTurn them into a short email to my team.",
    "Continue this text:\n\n{p}",
]
CANNED = [
    ("I want to learn about {t}.", "Great choice! What would you like to know about {t}?"),
    ("Can you help me with {t}?", "Of course. What do you need help with?"),
    ("I have a question about {t}.", "Sure, go ahead and ask."),
]
ASKS = [
    "Where should I start?",
    "What are the basics?",
    "What is a common mistake?",
    "How long does it take?",
    "Give me a quick overview.",
    "What is the history behind it?",
    "Any good resources?",
]
WORDS = [
    "apple",
    "river",
    "quantum",
    "blue",
    "seven",
    "window",
    "tiger",
    "cloud",
    "pencil",
    "ocean",
    "music",
    "silver",
    "garden",
    "rocket",
    "bread",
    "winter",
    "candle",
    "forest",
    "mirror",
    "dragon",
]
CODE = [
    "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs) + 1",
    "def is_even(n):\n    return n % 2 == 1",
    "for i in range({n}):\n    print(i * i)",
    "def reverse(s):\n    return s[::-1]\n\nprint(reverse('{w}'))",
    "x = [{a}, {b}, {n}]\nprint(sorted(x)[-1])",
    "def fact(n):\n    if n == 0:\n        return 0\n    return n * fact(n - 1)",
]
CODE_ASKS = [
    "What does this code do?",
    "Fix the bug in this Python code.",
    "What does this code print?",
    "Rewrite this code in JavaScript.",
    "Add comments to this code.",
    "How could this code be improved?",
]


def _tasks(r: random.Random) -> str:
    """A topic-free task: arithmetic, a word problem, words to sort or count, a review to classify, code."""
    a, b, n, k = r.randint(2, 99), r.randint(2, 99), r.randint(3, 40), r.randint(1, 9)
    w = r.sample(WORDS, r.randint(3, 7))
    kind = r.randrange(8)
    if kind == 0:
        return r.choice(
            [
                f"What is {a} + {b}?",
                f"What is {a} times {k}?",
                f"Is {a} a prime number?",
                f"Solve for x: {k}x + {a} = {a + k * b}.",
                f"What is {k * 10}% of {a * 10}?",
                f"Convert {n} kilometers to miles.",
            ]
        )
    if kind == 1:
        return r.choice(
            [
                f"A shop sells pencils for {a} cents each. How much do {n} pencils cost?",
                f"I have {n + k} apples and give away {k}. How many are left? Explain.",
                f"A train travels at {a} km/h for {k} hours. How far does it go?",
            ]
        )
    if kind == 2:
        return (
            r.choice(
                [
                    "Sort these words alphabetically: ",
                    "Which word is the odd one out: ",
                    "Write a sentence that uses all of these words: ",
                ]
            )
            + ", ".join(w)
            + "."
        )
    if kind == 3:
        return f"Count the vowels in the word '{w[0]}', and explain how you counted."
    if kind == 4:
        adj = r.choice(["wonderful", "terrible", "boring", "surprisingly good", "too expensive", "just fine"])
        thing = r.choice(dd.TOPICS)
        feel = r.choice(["loved", "hated", "did not mind"])
        return f'Is this review positive or negative? "The book about {thing} was {adj}, and I {feel} it."'
    code = r.choice(CODE).format(n=n, w=w[0], a=a, b=b)
    return f"{r.choice(CODE_ASKS)}\n\n```python\n{code}\n```"


def varied_prompts(n: int, seed: int) -> list:
    """`n` prompts of other shapes than template × topic (see the module docstring), seeded."""
    r = random.Random(seed * 7 + 3)
    out: list = []
    while len(out) < n:
        t, u, v = r.sample(dd.TOPICS, 3)
        kind = r.randrange(8)
        if kind == 0:
            item: object = r.choice(SHORT).format(t=t)
        elif kind == 1:
            item = r.choice(FORMS).format(t=t, u=u, v=v)
        elif kind == 2:
            item = _tasks(r)
        elif kind == 3:
            q, a = r.choice(CANNED)
            item = [
                {"role": "user", "content": q.format(t=t)},
                {"role": "assistant", "content": a.format(t=t)},
                {"role": "user", "content": r.choice(ASKS)},
            ]
        elif kind == 4:
            item = {"followup": r.choice(FOLLOWUPS).format(t=t)}
        elif kind == 5:
            item = {"passage": r.choice(PASSAGE)}
        else:  # an ordinary prompt (a template, or a task) under a system prompt
            body = r.choice(dd.TEMPLATES + EXTRA_TEMPLATES).format(t=t) if kind == 6 else _tasks(r)
            item = [{"role": "system", "content": r.choice(SYSTEMS)}, {"role": "user", "content": body}]
        out.append(item)
    return out


def _messages(item) -> list[dict]:
    return [{"role": "user", "content": item}] if isinstance(item, str) else list(item)


def resolve(item, earlier: list[dict], tokenizer, r: random.Random, max_tokens: int = 640) -> list[dict]:
    """The chat messages of a prompt item. A follow-up continues one of the target's `earlier` answers (its
    prompt, then its answer as the assistant's turn); a passage task quotes one. With no earlier answer (the
    first batch), or one too long, a follow-up becomes its own user turn and a passage task a short one."""
    if not isinstance(item, dict):
        return _messages(item)
    for rec in r.sample(earlier, min(4, len(earlier))):
        ans = tokenizer.decode(rec["ids"][rec["n_prompt"] :], skip_special_tokens=True).strip()
        if not ans or len(rec["ids"]) > max_tokens:
            continue
        if "followup" in item:
            return _messages(rec["prompt"]) + [
                {"role": "assistant", "content": ans},
                {"role": "user", "content": item["followup"]},
            ]
        return [{"role": "user", "content": item["passage"].format(p=ans)}]
    return _messages(item.get("followup") or item["passage"].format(p="The meeting is moved to Friday."))


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return [int(i) for i in (out["input_ids"] if hasattr(out, "keys") else out)]


@torch.inference_mode()
def answer_batch(
    model,
    prompt_ids: list[list[int]],
    max_new: int,
    eos: int,
    pad: int,
    gen: torch.Generator,
    temperature: float = 0.8,
    top_p: float = 0.95,
) -> list[dict]:
    """Sample answers for a batch (left padding, KV cache). One record per prompt: ids [n] int32
    (prompt + answer, EOS included if produced), n_prompt, and f [n-1, D] fp16, the target's normed final
    state at positions 0..n-2 (f[t] gives the target's logits for token t+1: `lm_head(f[t])`)."""
    from transformers import DynamicCache

    B = len(prompt_ids)
    L, dev, ids, mask, pos = dd.left_padded(model, prompt_ids, pad)
    cache = DynamicCache(config=model.config)
    hook = dd._NormHook(model.model.norm)
    try:
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
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
            out = model(
                input_ids=nxt.unsqueeze(1),
                attention_mask=mask,
                position_ids=last.unsqueeze(1),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            fs.append(hook.outs.pop())  # [B, 1, D]
    finally:
        hook.close()
    F_ = torch.cat(fs, 1).cpu()  # [B, L + fed, D]
    T = torch.stack(toks, 1).cpu()  # [B, steps]
    recs = []
    for b, p in enumerate(prompt_ids):
        ans = T[b].tolist()
        n = ans.index(eos) + 1 if eos in ans else len(ans)
        f = F_[b, L - len(p) : L + n - 1]  # positions 0 .. len(p) + n - 2
        recs.append(
            {"ids": torch.tensor(p + ans[:n], dtype=torch.int32), "n_prompt": len(p), "f": f.to(torch.float16).clone()}
        )
    return recs


def shard_path(out_dir: Path, split: str, i: int) -> Path:
    return out_dir / split / f"shard_{i:05d}.pt"


def generate(
    model,
    tokenizer,
    out_dir: str | Path,
    split: str = "train",
    rounds: int = 1,
    batch: int = 64,
    max_new: int = 128,
    seed: int = 0,
    max_batches: int | None = None,
    stop_at: float | None = None,
    mix: float = 0.0,
) -> int:
    """Answer every prompt of `split` `rounds` times, one shard per batch, skipping shards on disk.
    Returns the number of answer tokens written by this call. Prompts built on earlier answers read the
    previous shard's (so a resumed run builds the same prompts)."""
    out_dir = Path(out_dir)
    (out_dir / split).mkdir(parents=True, exist_ok=True)
    ps = feature_prompts(split, seed, mix)
    items = []
    for r in range(rounds):
        order = ps[:]
        random.Random(seed * 1000 + r).shuffle(order)
        items += order
    batches = [items[i : i + batch] for i in range(0, len(items), batch)][:max_batches]
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    n_tok, t0 = 0, time.time()
    bar = tqdm(
        [i for i in range(len(batches)) if not shard_path(out_dir, split, i).exists()],
        desc=f"features {split}",
        unit="batch",
    )
    for i in bar:
        if stop_at is not None and time.time() > stop_at:
            break
        gen = torch.Generator().manual_seed(seed * 1_000_003 + i * 7919 + (0 if split == "train" else 17))
        prev = shard_path(out_dir, split, i - 1)
        wants = any(isinstance(t, dict) for t in batches[i])
        earlier = torch.load(prev, weights_only=False) if wants and i and prev.exists() else []
        rr = random.Random(seed * 31 + i)
        msgs = [resolve(t, earlier, tokenizer, rr) for t in batches[i]]
        recs = answer_batch(model, [prompt_ids(tokenizer, m) for m in msgs], max_new, eos, pad, gen)
        for r, m in zip(recs, msgs):
            r["prompt"] = m[0]["content"] if len(m) == 1 and m[0]["role"] == "user" else m
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
