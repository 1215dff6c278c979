"""Distillation losses and held-out metrics (used by `distill`): full-vocabulary KL and the
FSD-code js between teacher and student, batching of cached on-policy records, teacher-forced
top-1 match, and the per-token timing that checks a student's cost against the target's."""
from __future__ import annotations

import time

import torch

from pyramid_demo.core.rules import divergence


def _div(zt: torch.Tensor, zs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position KL(p_t || p_s) and the FSD-code js, both from `core.rules.divergence` (the
    engine's one implementation; its kl is KL(q‖p), so the student is passed as the verifier)."""
    lt, ls = torch.log_softmax(zt.float(), -1), torch.log_softmax(zs.float(), -1)
    pt, ps = lt.exp(), ls.exp()
    kl = divergence(ps, pt, "kl", ls, lt)  # KL(p_t‖p_s)
    js = divergence(pt, ps, "js", lt, ls)
    return kl, js


def batches(recs: list[dict], batch: int, gen: torch.Generator) -> list[list[int]]:
    """Shuffled batches of records of similar length (less padding)."""
    order = torch.randperm(len(recs), generator=gen).tolist()
    chunks = [order[i:i + batch * 8] for i in range(0, len(order), batch * 8)]
    out = []
    for c in chunks:
        c.sort(key=lambda i: len(recs[i]["ids"]))
        out += [c[i:i + batch] for i in range(0, len(c), batch)]
    perm = torch.randperm(len(out), generator=gen).tolist()
    return [out[i] for i in perm]


def collate(recs: list[dict], idx: list[int], pad: int, with_x: bool = False):
    """input ids [B, L] (right padded), attention mask, answer mask, teacher h [N, D]
    (with_x: also the cached target states entering layer X_LAYER, [B, L, D])."""
    seqs = [recs[i] for i in idx]
    L = max(len(r["ids"]) - 1 for r in seqs)
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    att = torch.zeros((len(seqs), L), dtype=torch.long)
    ans = torch.zeros((len(seqs), L), dtype=torch.bool)
    for b, r in enumerate(seqs):
        n = len(r["ids"]) - 1
        ids[b, :n] = r["ids"][:n].long()
        att[b, :n] = 1
        ans[b, r["n_prompt"] - 1:n] = True
    h = torch.cat([r["h"][: len(r["ids"]) - r["n_prompt"]] for r in seqs]).float()
    if not with_x:
        return ids, att, ans, h
    x = torch.zeros((len(seqs), L, seqs[0]["x"].shape[1]))
    for b, r in enumerate(seqs):
        x[b, : len(r["ids"]) - 1] = r["x"][: len(r["ids"]) - 1].float()
    return ids, att, ans, h, x


def _top(student, x: torch.Tensor, first: int) -> torch.Tensor:
    """Run the student's layers first.. on cached states x [B, L, D] (right padded, so the
    plain causal mask is exact for real positions) and its final norm."""
    pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
    pe = student.model.rotary_emb(x, position_ids=pos)
    for layer in student.model.layers[first:]:
        x = layer(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
        x = x[0] if isinstance(x, tuple) else x
    return student.model.norm(x)


def _hidden(model, ids, att) -> torch.Tensor:
    """Final normed hidden states [B, L, D] of a (student or target) Llama."""
    return model.model(input_ids=ids, attention_mask=att, use_cache=False).last_hidden_state


def loss_and_backward(student, head, ids, att, ans, h_t, kind: str, kl_frac: float = 1.0,
                      mse: float = 0.0, gen: torch.Generator | None = None, chunk: int = 384,
                      x: torch.Tensor | None = None) -> dict:
    """Distillation loss on the answer positions; backward done here (chunked over the head).

    kind "kl": KL(target || student) over the full vocabulary; "kl+js": plus the FSD-code js;
    "mse": relative squared error of the final normed hidden state only (no LM head).
    kl_frac < 1 computes the (49152-wide) head terms on that random share of the positions
    only; mse > 0 adds mse x the hidden-state term on every position (cheap, no head)."""
    if x is not None:  # frozen shared bottom: start from the cached target states
        h_s = _top(student, x, student.shared_layers)[ans]
    else:
        h_s = _hidden(student, ids, att)[ans]  # [N, D]
    rel = (h_s - h_t).pow(2).sum(-1).mean() / h_t.pow(2).sum(-1).mean()
    if kind == "mse":
        rel.backward()
        return {"loss": float(rel), "mse": float(rel)}
    leaf = h_s.detach().requires_grad_(True)
    n_all = leaf.shape[0]
    sel = torch.arange(n_all)
    if kl_frac < 1.0:
        k = max(1, int(round(kl_frac * n_all)))
        sel = torch.randperm(n_all, generator=gen)[:k].sort().values
    sel = sel.to(leaf.device)
    tot, match, jss = 0.0, 0.0, 0.0
    n = sel.numel()
    for i in range(0, n, chunk):
        j = sel[i:i + chunk]
        with torch.no_grad():
            zt = head(h_t[j])
        zs = head(leaf[j])
        kl, js = _div(zt, zs)
        part = kl.sum() + (js.sum() if kind == "kl+js" else 0.0)
        (part / n).backward()
        tot += float(part.detach())
        jss += float(js.detach().sum())
        match += float((zt.argmax(-1) == zs.argmax(-1)).sum())
    grad = leaf.grad
    if mse > 0:
        torch.autograd.backward([h_s, mse * rel], [grad, torch.ones_like(rel)])
    else:
        h_s.backward(grad)
    return {"loss": tot / n, "js": jss / n, "top1_match": match / n, "mse": float(rel.detach())}


@torch.no_grad()
def top1_match(model_a, model_b, head, recs: list[dict], pad: int, batch: int = 8,
               h_b: bool = False) -> dict:
    """Teacher-forced top-1 match and mean js of model_a vs model_b on answer positions
    (h_b=True: model_b's hidden states are the records' cached target states). Not the decoders'
    "agreement with target greedy output" (`core.stats.agreement`): here every position is scored
    on the reference's own prefix."""
    match = js_sum = n = 0.0
    for i in range(0, len(recs), batch):
        dev = next(model_a.parameters()).device
        ids, att, ans, h = (t.to(dev) for t in collate(recs, list(range(i, min(i + batch, len(recs)))), pad))
        ha = _hidden(model_a, ids, att)[ans]
        hb = h if h_b else _hidden(model_b, ids, att)[ans]
        for j in range(0, ha.shape[0], 512):
            za, zb = head(ha[j:j + 512]), head(hb[j:j + 512])
            match += float((za.argmax(-1) == zb.argmax(-1)).sum())
            js_sum += float(_div(zb, za)[1].sum())
        n += ha.shape[0]
    return {"top1_match": round(match / n, 4), "js": round(js_sum / n, 4), "positions": int(n)}


def per_token_ms(model, ctx: int = 200, n: int = 25) -> float:
    """Median ms of a cached one-token forward (fp32, logits of one position)."""
    import statistics

    from transformers import DynamicCache

    g = torch.Generator().manual_seed(0)
    dev = next(model.parameters()).device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    cache = DynamicCache(config=model.config)
    ts = []
    with torch.inference_mode():
        model(input_ids=torch.randint(0, 49152, (1, ctx), generator=g).to(dev), past_key_values=cache,
              use_cache=True, logits_to_keep=1)
        for _ in range(n):
            x = torch.randint(0, 49152, (1, 1), generator=g).to(dev)
            sync()
            t = time.perf_counter()
            model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1)
            sync()
            ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1000
