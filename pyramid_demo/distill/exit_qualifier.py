"""A second qualifier design for the insertion table: the target's first k layers plus a trained exit layer
(Kangaroo / HiSpec style), measured on the same held-out answers as every proposer.

Why this design: its first k layers are the target's own, so they agree with the target exactly where the
target's answer is already decided early; one trained decoder layer (initialised from the target's layer k)
maps the layer-k state to the target's final normed state, read by the target's head on the token subset.
In a pyramid its cached layer-k keys and values are the target's too, so the target's pass could skip those
layers for the block; only agreement and cost are measured here.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..models.feature_draft import FeatureDraft
from . import feature_train as ft


class ExitQualifier(FeatureDraft):
    """The target's layers 0..k-1 (frozen, shared) → one trained layer → the target's norm and subset head."""

    def __init__(self, target: torch.nn.Module, subset: torch.Tensor, k: int):
        super().__init__(target, subset, init_layer=k)
        del self.fc_w, self.fc_b  # it reads the target's layer-k state itself, not a state and a token
        self.exit_at = k
        object.__setattr__(self, "_target", target)  # not a submodule: its weights are the target's

    @torch.no_grad()
    def layer_k(self, tokens: torch.Tensor) -> torch.Tensor:
        """The target's hidden state entering layer k for tokens [B, T] -> [B, T, d]."""
        out = self._target.model(input_ids=tokens, output_hidden_states=True)
        return out.hidden_states[self.exit_at]

    def exit_states(self, h: torch.Tensor) -> torch.Tensor:
        """Layer-k states [B, T, d] -> predicted final normed states [B, T, d] (causal, one pass)."""
        cos, sin = self.rope_tables(h.shape[1], h.dtype)
        q, k, v = self.qkv(h, cos, sin)
        rep = self.n_heads // self.n_kv
        att = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                             is_causal=True)
        return self.finish(h, att)


def _batch(model: ExitQualifier, recs: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b = ft.collate(recs)
    return model.layer_k(b["tokens"]), b["f_true"], b["mask"]


def loss_fn(model: ExitQualifier, recs: list[dict], w_feat: float = 1.0) -> tuple[torch.Tensor, float]:
    h, f_true, m = _batch(model, recs)
    out = model.exit_states(h)
    with torch.no_grad():
        lp_t = F.log_softmax(model.logits_subset(f_true[m]).float(), -1)
    lq = F.log_softmax(model.logits_subset(out[m]).float(), -1)
    loss = F.kl_div(lq, lp_t, log_target=True, reduction="batchmean") + w_feat * F.smooth_l1_loss(
        out[m].float(), f_true[m].float())
    return loss, float((lq.argmax(-1) == lp_t.argmax(-1)).float().mean())


@torch.no_grad()
def evaluate(model: ExitQualifier, held: list[dict], full_head: torch.Tensor, batch: int = 16) -> float:
    """Held-out top-1 (subset argmax as a token) against the target's full-vocabulary argmax."""
    hit = n = 0
    for i in range(0, len(held), batch):
        h, f_true, m = _batch(model, held[i:i + batch])
        got = model.subset[model.logits_subset(model.exit_states(h)[m]).argmax(-1)]
        hit += int((got == F.linear(f_true[m], full_head).argmax(-1)).sum())
        n += int(m.sum())
    return hit / max(n, 1)


def train(target, subset: torch.Tensor, dirs: list[Path], held: list[dict], k: int, minutes: float,
          lr: float = 1e-3, lr_min: float = 3e-5, batch: int = 16, eval_every: int = 100, seed: int = 0,
          autocast: bool = True, log=print) -> dict:
    """Train the exit layer for `minutes` (cosine LR over the budget); returns the learning curve."""
    model = ExitQualifier(target, subset, k)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    full_head = target.lm_head.weight.detach().float()
    recs = [r for p in ft._shards(dirs) for r in torch.load(p, weights_only=False)]
    state: dict = {"step": 0, "seen": 0, "curve": [{"step": 0, "seen": 0, "heldout_top1": evaluate(model, held,
                                                                                                  full_head)}]}
    log(f"k={k}: untrained exit top-1 {state['curve'][0]['heldout_top1']:.3f}, {len(recs)} answers")
    g, t0 = torch.Generator().manual_seed(seed), time.time()
    while time.time() - t0 < 60 * minutes:
        for j in torch.randperm(len(recs), generator=g).split(batch):
            frac = min(1.0, (time.time() - t0) / (60 * minutes))
            if frac >= 1.0:
                break
            cur = (lr_min + 0.5 * (lr - lr_min) * (1 + math.cos(math.pi * frac))) * min(1, (state["step"] + 1) / 30)
            for gr in opt.param_groups:
                gr["lr"] = cur
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss, acc = loss_fn(model, [recs[int(i)] for i in j])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            state["step"] += 1
            state["seen"] += sum(len(recs[int(i)]["ids"]) - recs[int(i)]["n_prompt"] for i in j)
            if state["step"] % eval_every == 0:
                ev = evaluate(model, held, full_head)
                state["curve"].append({"step": state["step"], "seen": state["seen"], "heldout_top1": ev,
                                       "minutes": round((time.time() - t0) / 60, 1)})
                log(f"EVAL k={k} step {state['step']} seen {state['seen']:,}: held-out top-1 {ev:.3f} "
                    f"(train {acc:.3f}, loss {float(loss):.3f})")
    state["curve"].append({"step": state["step"], "seen": state["seen"],
                           "heldout_top1": evaluate(model, held, full_head),
                           "minutes": round((time.time() - t0) / 60, 1)})
    state["model"] = model.state_dict()
    return state
