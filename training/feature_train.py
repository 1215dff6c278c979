"""Train the feature-conditioned draft (`models.feature_draft`) on `training.features` shards.

Loss per pass s (EAGLE-3's training-time test, weight 0.8^s): KL(target ‖ head) over the token subset (the
target renormalised on it) plus smooth-L1 between the predicted and the true normed state, on rows whose
next token is an answer token; pass 0's input states get EAGLE's uniform noise. The metric is what SD sees:
top-1 of the head over the subset against the target's full-vocabulary argmax, per draft position (pass s
= s+1 tokens ahead with the earlier ones right). Time-budgeted, checkpointed, resumable, and the learning
curve (answer positions seen → held-out agreement) is kept in the checkpoint.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from pyramid_demo.models.feature_draft import FeatureDraft

from . import features

PASS_DECAY = 0.8


def collate(recs: list[dict], dtype: torch.dtype = torch.float32, wide: bool = False) -> dict[str, torch.Tensor]:
    """Right-padded batch: f_prev [B, T, d] (row i: the target's state at i-1, row 0 zeros; `wide`: the tapped
    layers' states `aux` first, [B, T, w]), tokens [B, T], f_true [B, T, d] (the target's final state at row
    i), loss mask [B, T] (rows predicting an answer token)."""
    T = max(len(r["ids"]) - 1 for r in recs)
    d = recs[0]["f"].shape[1]
    B = len(recs)
    w = d + (recs[0]["aux"].shape[1] if wide else 0)
    f_prev = torch.zeros(B, T, w, dtype=dtype)
    f_true = torch.zeros(B, T, d, dtype=dtype)
    tokens = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b, r in enumerate(recs):
        n = len(r["ids"])  # rows 0 .. n-2
        f = r["f"].to(dtype)  # [n-1, d]: states at positions 0 .. n-2
        f_true[b, : n - 1] = f
        f_prev[b, 1 : n - 1] = torch.cat((r["aux"].to(dtype), f), 1)[: n - 2] if wide else f[: n - 2]
        tokens[b, : n - 1] = r["ids"][: n - 1].long()
        mask[b, r["n_prompt"] - 1 : n - 1] = True
    return {"f_prev": f_prev, "tokens": tokens, "f_true": f_true, "mask": mask}


def loss_fn(
    model: FeatureDraft,
    batch: dict,
    passes: int,
    gen: torch.Generator | None,
    noise: float = 0.1,
    w_feat: float = 1.0,
    deep_frac: float = 1.0,
    deep_from: int = 3,
) -> tuple[torch.Tensor, list[float]]:
    """Total loss and each pass's top-1 agreement on the batch (over the subset vs the subset argmax).
    `deep_frac` < 1: passes from `deep_from` on (0-based) score the KL on that random share of their rows
    only (the subset head and its softmax are half a pass's cost; the state loss still covers every row)."""
    dev = model.norm.device
    f_prev, f_true, m, tokens = (batch[k].to(dev) for k in ("f_prev", "f_true", "mask", "tokens"))
    if gen is not None and noise:
        std = f_true[m].std()
        f_prev = f_prev + ((torch.rand(f_prev.shape, generator=gen) * 2 - 1) * noise).to(dev) * std
    outs = model.forward_train(f_prev, tokens, passes)
    with torch.no_grad():
        lp_t = F.log_softmax(model.logits_subset(f_true[m]).float(), -1)  # [N, S]
    total, accs = f_true.new_zeros(()), []
    for s, out in enumerate(outs):
        ms = m.clone()
        ms[:, :s] = False  # rows with fewer than s true rows before them
        sel = ms[m]  # [N]: this pass's rows among the masked ones
        feat = F.smooth_l1_loss(out[ms].float(), f_true[ms].float())
        if s >= deep_from and deep_frac < 1.0 and gen is not None:
            keep = torch.rand(ms.shape, generator=gen).to(dev) < deep_frac
            ms, sel = ms & keep, sel & keep[m]
        lq = F.log_softmax(model.logits_subset(out[ms]).float(), -1)  # [N_s, S]
        kl = F.kl_div(lq, lp_t[sel], log_target=True, reduction="batchmean")
        total = total + PASS_DECAY**s * (kl + w_feat * feat)
        accs.append(float((lq.argmax(-1) == lp_t[sel].argmax(-1)).float().mean()))
    return total, accs


@torch.no_grad()
def measure(
    model: FeatureDraft, held: list[dict], full_head: torch.Tensor, passes: int = 3, batch: int = 16, k: int = 4
) -> dict[str, list[float]]:
    """Held-out agreement with the target's full-vocabulary argmax: `top1_by_position`, the head's top-1 (its
    subset argmax, as a token id) at draft positions 1..passes (earlier drafted tokens right, as SD's
    acceptance needs), and `topk_pos1`, whether the target's token is among the head's 1..k best at
    position 1 (what a tree's first level spends)."""
    hit, n, top = [0] * passes, [0] * passes, torch.zeros(k)
    was = model.training
    model.eval()
    dev = model.norm.device
    for i in range(0, len(held), batch):
        b = {key: v.to(dev) for key, v in collate(held[i : i + batch], wide=bool(model.taps)).items()}
        outs = model.forward_train(b["f_prev"], b["tokens"], passes)
        m = b["mask"]
        want = F.linear(b["f_true"][m], full_head).argmax(-1)  # [N] the target's own token
        for s, out in enumerate(outs):
            sel = m.clone()
            sel[:, :s] = False
            lg = model.logits_subset(out[sel])
            got = model.subset[lg.argmax(-1)]
            hit[s] += int((got == want[sel[m]]).sum())
            n[s] += int(sel.sum())
            if s == 0:
                best = model.subset[lg.topk(k, -1).indices]  # [N, k]
                top += (best == want[:, None]).float().cumsum(-1).clamp_max(1).sum(0).cpu()
    model.train(was)
    return {"top1_by_position": [h / max(c, 1) for h, c in zip(hit, n)], "topk_pos1": (top / max(n[0], 1)).tolist()}


def evaluate(
    model: FeatureDraft, held: list[dict], full_head: torch.Tensor, passes: int = 3, batch: int = 16
) -> list[float]:
    """`measure`'s held-out top-1 by draft position only."""
    return measure(model, held, full_head, passes, batch)["top1_by_position"]


def init_from(model: FeatureDraft, path: str | Path) -> dict:
    """Load a shipped (safetensors) feature draft into `model`; returns where its own curve ended (positions
    seen, CPU minutes), read from the file's metadata, so a continued run's curve can be read end to end."""
    from safetensors import safe_open

    model.load(path)
    with safe_open(str(path), "pt") as fh:
        meta = fh.metadata() or {}
    curve = json.loads(meta.get("curve", "[]"))
    last = curve[-1] if curve else {}
    return {
        "file": str(path),
        "seen": int(last.get("seen", 0)) + int(last.get("seen_before", 0)),
        "minutes": float(last.get("minutes", 0.0)) + float(last.get("minutes_before", 0.0)),
    }


def _shards(dirs: list[Path]) -> list[Path]:
    return sorted(p for d in dirs for p in (d / "features" / "train").glob("shard_*.pt"))


def train(
    target,
    subset: torch.Tensor,
    dirs: list[Path],
    held: list[dict],
    ckpt: Path,
    minutes: float,
    lr: float = 1e-3,
    lr_min: float = 5e-5,
    batch: int = 16,
    passes: int = 3,
    seed: int = 0,
    eval_every: int = 200,
    autocast: bool = False,
    log=print,
    init: str | Path | None = None,
    deep_frac: float = 1.0,
    taps: tuple[int, ...] = (),
) -> dict:
    """Train (or resume from `ckpt`) for `minutes` of CPU time; the LR follows a cosine over that budget
    (`autocast`: bf16 matmuls on the CPU, about 1.7x faster on AVX-512 BF16; weights and loss stay fp32).
    New shards written by a running generation are picked up at every epoch. `init`: a new run starts from
    this feature-draft file (e.g. the shipped one) instead of the target's last layer, measured first (step
    0); its curve's positions seen and minutes are kept as `seen_before` / `minutes_before` in every entry.
    `taps`: the draft also reads these target layers (records need their `aux` states)."""
    model = FeatureDraft(target, subset, taps=taps)
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.95), weight_decay=0.0
    )
    state = {
        "step": 0,
        "seen": 0,
        "elapsed": 0.0,
        "epoch": 0,
        "curve": [],
        "best": -1.0,
        "init": None,
        "taps": list(taps),
    }
    full_head = target.lm_head.weight.detach().float()
    if ckpt.is_file():
        saved = torch.load(ckpt, weights_only=False)
        model.load_state_dict(saved["model"], strict=False)
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
        log(f"resumed at step {state['step']} ({state['seen']:,} positions seen)")
    elif init is not None:
        state["init"] = init_from(model, init)
        log(f"from {init} ({state['init']['seen']:,} positions seen, {state['init']['minutes']} CPU-minutes)")
    before = state.get("init") or {"seen": 0, "minutes": 0.0}

    def point(ev: dict, unique: int) -> dict:
        return {
            "step": state["step"],
            "seen": state["seen"],
            "unique": unique,
            "heldout_top1": ev["top1_by_position"],
            "heldout_topk_pos1": ev["topk_pos1"],
            "minutes": round(state["elapsed"] / 60, 1),
            "seen_before": before["seen"],
            "minutes_before": before["minutes"],
        }

    if state["init"] is not None and not state["curve"]:
        ev = measure(model, held, full_head, passes)
        state["curve"].append(point(ev, 0))
        state["best"] = ev["top1_by_position"][0]
        log(
            f"EVAL step 0: held-out top-1 by position {' '.join(f'{a:.3f}' for a in ev['top1_by_position'])}, "
            f"top-1..{len(ev['topk_pos1'])} at position 1 {' '.join(f'{a:.3f}' for a in ev['topk_pos1'])}"
        )
    gen = torch.Generator().manual_seed(seed * 7919 + state["step"])
    # the budget is this process's CPU time (one thread: its running time), so that pauses (`kill -STOP` while
    # something else is timed) and a busy machine do not eat the schedule; on a GPU, wall time
    clock = time.process_time if model.norm.device.type == "cpu" else time.time
    budget, t0 = 60 * minutes - state["elapsed"], clock()
    start = state["elapsed"]

    def save(tag: str = "") -> None:
        p = ckpt if not tag else ckpt.with_name(ckpt.stem + f"_{tag}.pt")
        p.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state}, p.with_suffix(".tmp"))
        p.with_suffix(".tmp").replace(p)

    loaded: dict[Path, list[dict]] = {}
    while clock() - t0 < budget:
        for p in _shards(dirs):
            if p not in loaded:
                loaded[p] = torch.load(p, weights_only=False)
                if not taps:  # the tapped layers' states are only read by a draft with taps
                    for r in loaded[p]:
                        r.pop("aux", None)
        recs = [r for rs in loaded.values() for r in rs]
        order = torch.randperm(len(recs), generator=torch.Generator().manual_seed(seed + 31 * state["epoch"]))
        for i in range(0, len(order) - batch + 1, batch):
            state["elapsed"] = start + clock() - t0
            if clock() - t0 >= budget:
                break
            frac = min(1.0, state["elapsed"] / (60 * minutes))
            cur = lr_min + 0.5 * (lr - lr_min) * (1 + math.cos(math.pi * frac))
            for g in opt.param_groups:
                g["lr"] = cur * min(1.0, (state["step"] + 1) / 30)
            b = collate([recs[int(j)] for j in order[i : i + batch]], wide=bool(taps))
            with torch.autocast(model.norm.device.type, dtype=torch.bfloat16, enabled=autocast):  # bf16 matmuls
                loss, accs = loss_fn(model, b, passes, gen, deep_frac=deep_frac)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            state["step"] += 1
            state["seen"] += int(b["mask"].sum())
            if state["step"] % 20 == 0:
                log(
                    f"step {state['step']} seen {state['seen']:,} loss {float(loss):.3f} "
                    f"train top1 {' '.join(f'{a:.3f}' for a in accs)} lr {cur:.2e} recs {len(recs)}"
                )
            if state["step"] % eval_every == 0:
                ev = measure(model, held, full_head, passes)
                state["curve"].append(point(ev, len(recs)))
                log(
                    f"EVAL step {state['step']} seen {state['seen']:,}: held-out top-1 by position "
                    f"{' '.join(f'{a:.3f}' for a in ev['top1_by_position'])}, top-k at position 1 "
                    f"{' '.join(f'{a:.3f}' for a in ev['topk_pos1'])}"
                )
                save()
                if ev["top1_by_position"][0] > state["best"]:
                    state["best"] = ev["top1_by_position"][0]
                    save("best")
        state["epoch"] += 1
    if not state["curve"] or state["curve"][-1]["step"] != state["step"]:  # the budget's end: measure it too
        ev = measure(model, held, full_head, passes)
        state["curve"].append(point(ev, sum(len(v) for v in loaded.values())))
        log(
            f"EVAL step {state['step']} seen {state['seen']:,} (end): held-out top-1 by position "
            f"{' '.join(f'{a:.3f}' for a in ev['top1_by_position'])}"
        )
        if ev["top1_by_position"][0] > state["best"]:
            state["best"] = ev["top1_by_position"][0]
            save("best")
    save()
    return state


def heldout(work: Path) -> list[dict]:
    """The held-out answers written by `python -m training draft-feature heldout --work WORK`."""
    return features.load(work / "features", "heldout")
