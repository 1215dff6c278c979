"""`bench`: every method and peer on the same models and prompts, interleaved per prompt after one warm-up each (so
machine drift hits all alike); writes results.csv, results.json and a self-contained report.html."""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import signal
import statistics
import sys
import time
from collections.abc import Callable

import torch

from .. import hardware_cli
from ..clock import ratio, timed, warm_up
from ..core.methods import TREE_BUDGET, method_spec
from ..core.run import generate, prepare_prompt
from ..core.trace import agreement as token_agreement  # one definition, shared with the app
from ..core.trace import prefix_agreement
from ..forward.lm import ModelTriplet
from ..models import background
from ..models.errors import LoadError
from ..models.runtime import cpu_class
from ..models.warm import cost_profile
from . import costs_report, csqa, peers, report, spec_suite, spec_table
from .options import ROW_COLUMNS, add_arguments, command_line
from .prompts import Prompt, load_prompts
from .variants import Variant, build_variants, largest, name_models

__all__ = ["ROW_COLUMNS", "add_arguments", "run", "run_bench", "run_variant"]  # the CLI reads add_arguments here


def run_variant(
    triplet: ModelTriplet, v: Variant, ids: list[int], chat: bool, profile: dict | None = None
) -> tuple[dict, list[int]]:
    """One timed run (shape "auto" resolved from `profile`); the row's measured columns and the produced ids."""
    if v.kind == "peer":
        pr = (
            peers.llama_cpp_generate(triplet, ids, v.cfg)
            if v.method == "llama_cpp"
            else peers.hf_generate(triplet, ids, v.cfg, v.method, v.lookup)
        )
        speed = ratio(len(pr.token_ids), pr.wall_s)  # wall time, prefill included
        return dict(
            n_new_tokens=len(pr.token_ids),
            stopped=pr.stopped,
            wall_s=pr.wall_s,
            tokens_per_s_incl_prefill=speed,
            tokens_per_s_wall=speed,
            target_forwards=pr.target_forwards,
        ), pr.token_ids
    res, wall = timed(triplet, v, ids, chat, profile)  # statuses only
    assert res is not None  # no `stop`: the run went to its end
    s, n = res.stats, res.stats.n_new_tokens
    ran = res.config  # the shape (and a tree's budget) that ran: "auto" resolved
    row = dict(
        shape=ran["shape"] if method_spec(v.method).shaped else None,
        shape_why=res.shape_why,
        qualifier_prompt=ran["qualifier_prompt"] if method_spec(v.method).pyramid else None,  # what ran
        **({k: ran[k] for k in TREE_BUDGET} if ran["shape"] == "tree" else {}),
        n_new_tokens=n,
        stopped=s.stopped,
        prefill_s=s.prefill_s,
        decode_s=s.decode_s,
        wall_s=wall,
        tokens_per_s=s.tokens_per_s,
        tokens_per_s_incl_prefill=ratio(n, s.prefill_s + s.decode_s),
        tokens_per_s_wall=ratio(n, wall),
        target_passes=s.target_passes,
        mean_accepted_per_target_pass=s.mean_accepted_per_target_pass,
        tokens_per_target_pass=s.tokens_per_target_pass,
        engine_overhead_s=s.engine_overhead_s,
        engine_overhead_share=ratio(s.engine_overhead_s, s.decode_s),
    )
    for stage in s.acceptance:  # the stages that ran rounds
        for name in ("acceptance", "proposed", "accepted", "rounds"):
            row[f"{name}_{stage}"] = getattr(s, name)[stage]
    for role in ("draft", "qualifier", "target"):
        if role in s.forward_passes:
            row[f"fwd_{role}"] = s.forward_passes[role]
            row[f"fwd_time_{role}_s"] = s.forward_time_s.get(role)
    row.update(costs_report.row_record(res.steps, res.method, res.config))  # forwards, times, acceptance, engine work
    row.update(spec_table.position_counts(res.steps))  # per-position acceptance, pooled over runs by the suite
    return row, res.token_ids


def _base_row(v: Variant, r: int, pi: int, prompt: Prompt, ids: list[int]) -> dict:
    c = v.cfg
    row = dict.fromkeys(ROW_COLUMNS)
    row.update(
        repeat=r,
        prompt_index=pi,
        category=prompt.category,
        variant=v.label,
        method=v.method,
        kind=v.kind,
        solo=v.solo,
        lossless=v.lossless,
        temperature=c.temperature,
        divergence=c.divergence,
        div_support=c.div_support,
        prompt_tokens=len(ids),
        prompt=prompt.text,
    )
    if v.kind == "engine":
        spec = method_spec(v.method)
        row.update(fallback=c.fallback)
        if spec.proposer:
            row.update(conf_stop=c.conf_stop, lookup_first=c.lookup_first)
        row.update({k: getattr(c, k) for k in spec.lengths + spec.thresholds})
        if spec.pyramid:
            row.update(stage2=c.stage2)
    return row


def run_bench(
    triplet: ModelTriplet,
    variants: list[Variant],
    prompts: list[Prompt],
    repeats: int = 1,
    chat: bool = True,
    answers: list[str] | None = None,
    warmup_tokens: int = 8,
    progress: bool = True,
    max_minutes: float | None = None,
    follow: Callable[[Prompt, list], tuple[Prompt, dict[str, list[int]]] | None] | None = None,
) -> dict:
    """Warm up, time every variant on every prompt (interleaved), then per-prompt speed-ups and quality. `follow`: a
    conversation's next turn after each turn (its prompt and each variant's own ids), kept whole like a prompt."""
    from tqdm import tqdm

    biggest = largest(variants)
    prepared: list[tuple[int, Prompt, list[int]]] = []
    for pi, p in enumerate(prompts):
        try:
            prepared.append((pi, p, prepare_prompt(triplet, p.text, biggest, chat)))
        except ValueError as e:
            print(f"skipping prompt {pi}: {e}", file=sys.stderr)
    if not prepared:
        raise ValueError("no usable prompts")
    greedy = all(v.cfg.greedy for v in variants)
    try:  # recorded per machine × family × forwards (cached, else measured now: a few seconds); "auto" reads it
        profile = cost_profile(triplet, measure_now=True)
    except Exception as e:  # noqa: BLE001 - the bench's other results stand without it
        profile = {"error": repr(e)}
    usable = profile if profile and "ms" in profile else None
    runs = len({v.label for v in variants}) + repeats * len(variants) * sum(
        getattr(p, "n_turns", 1) for _, p, _ in prepared
    )
    bar = tqdm(total=runs, disable=not progress, desc="bench", unit="run", dynamic_ncols=True)  # on stderr
    first = prepared[0][2]

    def warm(v: Variant) -> None:  # a peer warms up too
        bar.set_postfix_str(f"warm-up {v.label}")
        bar.update()
        run_variant(triplet, v, first, chat, usable)

    warm_up(triplet, variants, first, chat, usable, warmup_tokens, warm)
    roles = {"target"}.union(
        *(
            (v.solo,) if v.solo else method_spec(v.method).roles if v.kind == "engine" else peers.PEER_ROLES[v.method]
            for v in variants
        )
    )
    speeds_one = {role: peers.one_token_speed(triplet, role, first) for role in sorted(roles)}
    rows: list[dict] = []
    refs: dict[Prompt, list[int]] = {}
    interrupted, t_start = False, time.perf_counter()
    todo = [(r, pi, p, ids) for r in range(repeats) for pi, p, ids in prepared]

    def _run_prompt(r: int, pi: int, p: Prompt, ids: list[int] | dict[str, list[int]]) -> list[tuple[dict, list[int]]]:
        """Every variant once on one prompt, in order: rows (without per-prompt ratios) and tokens; `ids` by label: a
        conversation's later turn, each variant's own."""
        group: list[tuple[dict, list[int]]] = []
        scored: dict[tuple[int, ...], float | None] = {}
        for v in variants:
            bar.set_postfix_str(f"prompt {pi} {v.label}")
            cfg = v.cfg if v.cfg.greedy else dataclasses.replace(v.cfg, seed=v.cfg.seed + r)
            vids = ids[v.label] if isinstance(ids, dict) else ids
            measured, toks = run_variant(triplet, dataclasses.replace(v, cfg=cfg), vids, chat, usable)
            row = _base_row(v, r, pi, p, vids) | measured
            row["text"] = triplet.tokenizer.decode(toks, skip_special_tokens=True)
            key = (tuple(vids), tuple(toks))  # identical outputs (lossless methods at T=0) share one scoring pass
            if key not in scored:
                scored[key] = peers.target_logprob(triplet, vids, toks)
            row["target_logprob"] = scored[key]
            if answers:
                row.update(csqa_answer=answers[pi], csqa_pred=csqa.extract_answer(row["text"]))
                row["csqa_correct"] = int(row["csqa_pred"] == answers[pi])
            group.append((row, toks))
            bar.update()
        return group

    try:
        for r, pi, p, ids in todo:
            if max_minutes is not None and time.perf_counter() - t_start > 60 * max_minutes and rows:
                print(f"time budget of {max_minutes:g} min reached: stopping after {len(rows)} runs", file=sys.stderr)
                interrupted = True
                break
            done: list[dict] = []
            while p is not None:  # a prompt, or each turn of a conversation (`follow`)
                group = _run_prompt(r, pi, p, ids)
                if greedy and p not in refs:
                    ar = next((t for row, t in group if row["method"] == "ar" and row["kind"] == "engine"), None)
                    if ar is None:  # no AR variant: one untimed target-only greedy reference
                        ar = generate(triplet, ids, dataclasses.replace(variants[0].cfg, method="ar"), chat).token_ids
                    refs[p] = ar
                _per_prompt(group, refs.get(p))
                done += [row for row, _ in group]
                p, ids = (follow(p, group) if follow else None) or (None, ids)
            rows.extend(done)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: keep whole prompts only, so comparisons stay paired
        interrupted = True
        if not rows:
            raise
    if interrupted:
        print(f"stopped early: keeping the {len(rows)} runs of completed prompts", file=sys.stderr)
    bar.close()
    ar_speeds = [
        r["fwd_target"] / r["fwd_time_target_s"]
        for r in rows
        if r["method"] == "ar" and r["kind"] == "engine" and r["fwd_time_target_s"]
    ]
    speeds = dict(speeds_one, **({"target": statistics.median(ar_speeds)} if ar_speeds else {}))
    for row in rows:
        row["predicted_tokens_per_s"] = costs_report.row_prediction(row, speeds)
        row["predicted_plus_one_tokens_per_s"] = costs_report.row_prediction(row, speeds, plus_one=True)
    return dict(
        runs=rows,
        interrupted=interrupted,
        speeds=speeds,
        speeds_one_token=speeds_one,
        cost_profile=costs_report.finish(rows, profile),
        speed_sources={"target": "AR runs (forwards per second)" if ar_speeds else "one-token timing"}
        | dict.fromkeys(("draft", "qualifier"), "one-token timing"),
    )


def _per_prompt(group: list[tuple[dict, list[int]]], ref: list[int] | None) -> None:
    """Speed-ups against AR's and SD's first variants on this prompt and repeat, agreement with `ref`."""
    by = {row["method"]: row for row, _ in reversed(group) if row["kind"] == "engine"}  # a method's first variant
    for row, toks in group:
        for m, baseline in (("ar", by.get("ar")), ("sd", by.get("sd"))):
            if row["kind"] != "peer":
                row[f"speedup_vs_{m}"] = ratio(row["tokens_per_s"], baseline and baseline["tokens_per_s"])
            row[f"speedup_vs_{m}_wall"] = ratio(row["tokens_per_s_wall"], baseline and baseline["tokens_per_s_wall"])
        if ref is not None:
            row["agreement"], row["prefix_agreement"] = token_agreement(toks, ref), prefix_agreement(toks, ref)


def _stop(signum, frame) -> None:  # SIGTERM: stop like Ctrl-C
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    try:
        if args.repeats < 1:
            raise ValueError("--repeats must be at least 1")
        if args.threads:
            torch.set_num_threads(args.threads)
        variants = build_variants(args)
        suite = spec_suite.plan(args, variants)  # None without --suite; refuses options that do not fit it
        answers, prompts = None, suite.prompts if suite else []
        if args.dataset == "csqa":
            qs = csqa.load_questions(args.dataset_file, limit=args.limit)
            prompts = [Prompt(csqa.format_prompt(q), "csqa") for q in qs]
            answers = [q.answer for q in qs]
        elif not suite:
            prompts = load_prompts(args.prompts, limit=args.limit or (3 if args.grid else None))
        triplet = hardware_cli.load(args)
        if triplet is None:  # --estimate-only
            return 0
    except (ValueError, LoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if triplet.note:
        print(f"note: {triplet.note}", file=sys.stderr)
    print(f"note: {cpu_class()}; {triplet.runs}", file=sys.stderr)
    variants = name_models(variants, triplet.names)  # a reference row names its model (an int4 copy, …)
    variants, skipped = peers.runnable(triplet, variants)  # a peer the family cannot run: one line, not run
    for why in skipped:
        print(f"note: {why}", file=sys.stderr)
    if not variants:
        print("error: nothing left to run", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    old_term = signal.signal(signal.SIGTERM, _stop)  # `kill PID` keeps completed prompts, like Ctrl-C
    try:
        with background.paused():  # registered background jobs (corpus growth, training) stop while it times
            result = run_bench(
                triplet,
                variants,
                prompts,
                args.repeats,
                chat=not args.no_chat,
                answers=answers,
                warmup_tokens=args.warmup_tokens,
                progress=not args.no_progress,
                max_minutes=args.max_minutes,
                follow=suite.follower(triplet, not args.no_chat) if suite else None,
            )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, old_term)
    result["meta"] = dict(
        platform=platform.platform(),
        processor=platform.processor() or platform.machine(),
        cpu_count=os.cpu_count(),
        torch=torch.__version__,
        torch_threads=torch.get_num_threads(),
        python=platform.python_version(),
        device=str(triplet.device),
        dtype=str(triplet.dtype),
        cpu_class=cpu_class(),
        runs=triplet.runs,
        exact=triplet.exact,
        exact_note=triplet.exact_note,
        models=list(triplet.names),
        preset=triplet.preset,
        note=triplet.note,
        time_utc=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        command=command_line(args),
        argv=sys.argv[1:],
        n_prompts=len({r["prompt_index"] for r in result["runs"]}),
        prompts_requested=len(prompts),
        stopped_early=result["interrupted"],
        repeats=args.repeats,
        grid=args.grid,
        dataset=args.dataset,
        total_s=round(time.perf_counter() - t0, 1),
        skipped=skipped,
        variants=[dict(label=v.label, method=v.method, lossless=v.lossless, config=v.cfg.to_dict()) for v in variants],
    )
    extra = suite.finish(result, args.out) if suite else []  # Spec-Bench's table: result["suite"], spec_bench.csv
    paths = extra + report.write_outputs(result, args.out, ROW_COLUMNS + (spec_suite.COLUMNS if suite else []))
    print(result["markdown"] + "\n\n" + costs_report.markdown(result["cost_profile"]))
    if suite:
        print("\n" + result["suite"]["markdown"])
    print("\nwrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0
