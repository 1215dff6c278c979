"""`python -m training draft-feature`: the draft that reads the target (EAGLE-style), for the offline target.

Steps (each resumable from files under --work, default feature_work/):
  heldout  the target's answers to the held-out prompts (fp32, as every proposer is measured) with its
           states at every position -> WORK/features/heldout/
  gen      the same for the training prompts (bf16 on a CPU: ~3x faster) -> WORK/features/train/
  train    train the feature draft (EAGLE-3 training-time test over --passes draft positions) -> WORK/ckpt/;
           --init shipped: a new run starts from the shipped weights (else from the target's last layer)
  eval     held-out top-1 agreement per draft position (1..--passes) and top-1..4 at position 1: the best
           checkpoint and the shipped file
  export   the best checkpoint -> pyramid_demo/models/weights/feature_draft.safetensors (fp16, with its
           learning curve in the metadata), only where it beats the shipped one (--force: always)
  grow     on-policy answers into the committed corpus (token ids, `training.corpus`), --gen-batch rows at a time
           with rows refilled as they finish, until --minutes (wall) or SIGTERM; a fresh seed per run
  corpus   check the corpus's manifest against its shards and print its totals
  text     existing text (installed packages' READMEs, the standard library's docstrings; `training.text_corpus`)
           into the corpus as separate sources, each piece with its licence (--text-source)
  vocab    rank tokens by their count in WORK/features/train's answers (special ids first) and write the first
           --vocab-n, with their coverage of the held-out answers, as the draft's token subset (`training.vocab`)
           -> --weights-dir or pyramid_demo/models/weights/vocab.safetensors; retrain the draft on a new subset
--data adds more work folders' training shards (several generators can run side by side).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from pyramid_demo.models import background, feature_draft
from pyramid_demo.models.bundled import bundled_target

from . import corpus, corpus_cli, feature_train, features
from . import vocab as dv
from .corpus_cli import gen_dtype

STEPS = ("heldout", "gen", "train", "eval", "export", "grow", "corpus", "text", "vocab")
VOCAB_N = 8192  # the shipped subset's size


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("steps", nargs="+", help=f"one or more of {', '.join(STEPS)}")
    p.add_argument("--work", default="feature_work")
    p.add_argument("--data", nargs="*", default=[], help="more work folders whose training shards train reads")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=10)
    p.add_argument("--minutes", type=float, default=30.0, help="gen: wall minutes; train: CPU (or GPU) minutes")
    p.add_argument("--gen-batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="gen: times each training prompt is answered")
    p.add_argument(
        "--mix",
        type=float,
        default=0.0,
        help="gen: prompts of other shapes (features.varied_prompts), as a share of templates x topics",
    )
    p.add_argument(
        "--init",
        default=None,
        help="train: start a new run from this feature-draft file ('shipped': the shipped weights)",
    )
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--max-batches", type=int, default=None)
    p.add_argument("--heldout-batches", type=int, default=4, help="batches of 32 held-out answers")
    p.add_argument(
        "--gen-dtype",
        default="auto",
        help="gen/grow on a CPU: auto (bfloat16 where oneDNN runs it natively, else float32), bfloat16 "
        "or float32 (without AVX-512 BF16 a bf16 matmul is ~3x slower than fp32)",
    )
    p.add_argument("--batch", type=int, default=16, help="train: sequences per step")
    p.add_argument("--passes", type=int, default=3, help="train: draft positions in the training-time test")
    p.add_argument(
        "--deep-frac",
        type=float,
        default=1.0,
        help="train: passes 4.. score their KL on this random share of rows (cheaper deep passes)",
    )
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-min", type=float, default=3e-5)
    p.add_argument("--eval-every", type=int, default=150)
    p.add_argument("--eval-seqs", type=int, default=None, help="eval: held-out answers used (default: all)")
    p.add_argument("--weights-dir", default=None, help="export into this folder instead of the shipped one")
    p.add_argument("--force", action="store_true", help="export even when the shipped draft is better")
    p.add_argument(
        "--corpus",
        default=None,
        help="grow/corpus/train: the token-id corpus folder (default: the committed one); train reads "
        "every shard of it (states recomputed once, cached under WORK/corpus_states); 'none': off",
    )
    p.add_argument(
        "--text-source",
        default="python-package-docs,python-stdlib-docstrings,python-reference-topics,debian-doc",
        help="text: which sources (comma-separated, without the 'text:' prefix)",
    )
    p.add_argument("--shard-seqs", type=int, default=256, help="grow: answers per corpus shard")
    p.add_argument(
        "--shard-minutes",
        type=float,
        default=20.0,
        help="grow: also write a shard after this many wall minutes (with at least 16 answers)",
    )
    p.add_argument("--max-shards", type=int, default=None, help="grow: stop after this many shards")
    p.add_argument("--vocab-n", type=int, default=VOCAB_N, help="vocab: tokens in the subset")
    p.add_argument(
        "--taps",
        default="",
        help="train: target layers (0-based, comma-separated) the draft reads beside the final state "
        "(EAGLE-3's multi-layer features, e.g. 2,15); empty: the final state only",
    )


def _dev(name: str) -> torch.device:
    return torch.device("cuda" if name == "auto" and torch.cuda.is_available() else "cpu" if name == "auto" else name)


def _taps(args: argparse.Namespace, ckpt: Path) -> tuple[int, ...]:
    """The draft's taps: `--taps`, else those of the run in `ckpt` (eval and export read the trained run's)."""
    if args.taps:
        return tuple(int(t) for t in args.taps.split(","))
    if ckpt.is_file():
        return tuple(torch.load(ckpt, weights_only=False, map_location="cpu")["state"].get("taps", ()))
    return ()


def _eval_checkpoint(target, held, model, passes: int = 3) -> dict:
    return feature_train.measure(model, held, target.lm_head.weight.detach().float(), passes=passes)


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    bad = [s for s in args.steps if s not in STEPS]
    if bad:
        print(f"unknown step(s) {bad}; choose from {', '.join(STEPS)}")
        return 2
    work, dev = Path(args.work), _dev(args.device)
    ckpt = work / "ckpt" / "feature_draft.pt"
    fp32 = None  # the fp32 target (held-out answers, training, evaluation)
    for step in args.steps:
        if step in ("grow", "corpus", "text"):
            corpus_cli.run_step(step, args, dev)
            continue
        if step == "vocab":
            make_vocab(work, args)
            continue
        if step in ("heldout", "gen"):
            dt = torch.float32 if step == "heldout" or dev.type != "cpu" else gen_dtype(args.gen_dtype)
            tok, model = bundled_target(dev, dt)
            split = "heldout" if step == "heldout" else "train"
            n = features.generate(
                model,
                tok,
                work / "features",
                split,
                rounds=1 if step == "heldout" else args.rounds,
                batch=min(32, args.gen_batch) if step == "heldout" else args.gen_batch,
                max_new=args.max_new,
                seed=0 if step == "heldout" else args.seed,
                max_batches=args.heldout_batches if step == "heldout" else args.max_batches,
                stop_at=None if step == "heldout" else time.time() + 60 * args.minutes,
                mix=0.0 if step == "heldout" else args.mix,
            )
            print(f"{split}: {n:,} new answer tokens in {work / 'features' / split}")
            cdir = corpus_cli.corpus_dir(args)
            if step == "heldout" and cdir is not None and args.heldout_batches == 4:  # the full set only
                saved = corpus_cli.save_heldout(work, cdir)
                if saved:
                    print(f"heldout: {saved['sequences']} answers saved as ids in {cdir / corpus_cli.HELDOUT}")
            continue
        if fp32 is None:
            fp32 = bundled_target(dev, torch.float32)[1]
        taps = _taps(args, ckpt)
        held = corpus_cli.heldout(fp32, work, corpus_cli.corpus_dir(args), taps)[: args.eval_seqs]
        if step == "train":
            dirs = [work, *map(Path, args.data)]
            cdir = corpus_cli.corpus_dir(args)
            background.register("corpus_train")  # so a benchmark pauses it (`models.background.paused`)
            if cdir is not None and cdir.is_dir() and corpus.shards(cdir):
                dirs.append(corpus_cli.materialize(fp32, cdir, work, log=lambda s: print(s, flush=True), taps=taps))
            feature_train.train(
                fp32,
                feature_draft.subset_ids(),
                dirs,
                held,
                ckpt,
                args.minutes,
                lr=args.lr,
                lr_min=args.lr_min,
                batch=args.batch,
                passes=args.passes,
                seed=args.seed,
                eval_every=args.eval_every,
                autocast=True,
                log=lambda s: print(s, flush=True),
                init=feature_draft.weight_path() if args.init == "shipped" else args.init,
                deep_frac=args.deep_frac,
                taps=taps,
            )
        elif step in ("eval", "export"):
            res = evaluate(fp32, held, ckpt, args.passes, taps)
            print(json.dumps(res, indent=1))
            (work / "eval.json").write_text(json.dumps(res, indent=1))
            if step == "export":
                export(fp32, ckpt, res, args, taps)
    return 0


def evaluate(target, held: list[dict], ckpt: Path, passes: int = 3, taps: tuple[int, ...] = ()) -> dict:
    """Held-out top-1 by draft position (and top-1..4 at position 1) for the best checkpoint and the shipped
    draft."""
    out: dict = {"heldout_answers": len(held), "positions": sum(len(r["ids"]) - r["n_prompt"] for r in held)}
    best = ckpt.with_name(ckpt.stem + "_best.pt")
    if best.is_file():
        m = feature_draft.FeatureDraft(target, feature_draft.subset_ids(), taps=taps)
        saved = torch.load(best, weights_only=False, map_location="cpu")
        m.load_state_dict(saved["model"], strict=False)
        out["checkpoint"] = {
            **_eval_checkpoint(target, held, m, passes),
            "seen": saved["state"]["seen"],
            "init": saved["state"].get("init"),
            "curve": saved["state"]["curve"],
        }
    if feature_draft.available():
        out["shipped"] = _eval_checkpoint(target, held, feature_draft.build(target), passes)
    return out


def export(target, ckpt: Path, res: dict, args: argparse.Namespace, taps: tuple[int, ...] = ()) -> None:
    new = res.get("checkpoint", {}).get("top1_by_position")
    old = res.get("shipped", {}).get("top1_by_position")
    if new is None:
        print("export: no checkpoint to export")
        return
    if old is not None and new[0] <= old[0] and not args.force:
        print(f"export: the shipped draft is better ({old[0]:.4f} ≥ {new[0]:.4f}); nothing written")
        return
    m = feature_draft.FeatureDraft(target, feature_draft.subset_ids(), taps=taps)
    m.load_state_dict(
        torch.load(ckpt.with_name(ckpt.stem + "_best.pt"), weights_only=False, map_location="cpu")["model"],
        strict=False,
    )
    path = feature_draft.weight_path(args.weights_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    size = m.save(
        path,
        {
            "heldout_top1_by_position": json.dumps([round(a, 4) for a in new]),
            "heldout_topk_pos1": json.dumps([round(a, 4) for a in res["checkpoint"]["topk_pos1"]]),
            "init": json.dumps(res["checkpoint"].get("init")),
            "curve": json.dumps(res["checkpoint"]["curve"]),
        },
    )
    print(f"export: {path} ({size / 1e6:.1f} MB), held-out top-1 by position {[round(a, 3) for a in new]}")


def make_vocab(work: Path, args: argparse.Namespace) -> dict:
    """The `vocab` step: count, rank, measure, write the subset file; returns its metadata."""
    from pyramid_demo.models.bundled import bundled_tokenizer

    tok = bundled_tokenizer()
    always = tuple([tok.eos_token_id] + [i for i in tok.all_special_ids if i != tok.eos_token_id])
    ranked, meta = dv.build(work / "features", len(tok), always, args.vocab_n)
    meta["made_by"] = f"python -m training draft-feature --work W vocab --vocab-n {args.vocab_n}"
    out = feature_draft.subset_path(args.weights_dir)
    size = dv.save_subset(out, ranked, meta)
    print(json.dumps(meta, indent=1))
    print(f"vocab: wrote {out} ({size / 1e3:.1f} kB, {len(ranked)} ids)")
    return meta
