"""Spec-Bench's table from the bench's rows, computed as its `evaluation/speed.py` does (see `FOOTNOTE`), and
per-position acceptance as vLLM and llama.cpp state it: pure arithmetic over plain rows."""

from __future__ import annotations

import html
import statistics
from itertools import zip_longest

from ..clock import ratio
from ..core.trace import STAGES, Step, Tally
from ..spec_bench import TASKS, TITLES

Key = tuple[int, int]  # (repeat, question id): one sample of a question

FOOTNOTE = (
    "Speed-ups over AR (the engine's plain decoding of the target) as Spec-Bench's `speed.py` computes them: per "
    "question, tokens = new tokens summed over its turns and time = wall seconds summed over its turns (each turn's "
    "`generate` call, prefill included, for every row alike); a task's figure = mean over its questions of the "
    "method's tokens/s ÷ mean over the same questions of AR's. Overall: the same over every selected question pooled "
    "(not a mean of the task columns). #Mean Accepted Tokens: tokens written per target forward over all the "
    "method's target forwards in the suite (the pass that scored the drafts writes the accepted ones and its own; "
    "1.00 for plain decoding; HF peers: the target's forward calls counted during `generate`; – where not known). "
    "Differences from Spec-Bench: one run per method unless --repeats (Spec-Bench averages 3 runs; here repeats are "
    "pooled as further samples of each question), the methods interleaved question by question in one process "
    "(Spec-Bench runs each method on its own), each answer capped at --max-new-tokens (Spec-Bench: 1024), the "
    "target tokenizer's own chat template with its default system prompt (Spec-Bench: FastChat's template of the "
    "model), tokens counted as generated ids (Spec-Bench re-tokenizes the baseline's text), and only questions every "
    "method completed are counted."
)
DECODE_NOTE = (
    "Decode only: the same arithmetic with each turn's decode seconds in place of its wall seconds (the engine's "
    "methods; prefill excluded, which every method pays once per turn for each model that reads the prompt itself, "
    "a pyramid's qualifier not where it takes the target's prompt keys and values): on a long prompt and a short "
    "answer the prefill can outweigh the decode."
)
POSITION_NOTE = (
    "Per-position acceptance, as vLLM and llama.cpp define it: for draft position i (1-based), the fraction of "
    "target verification rounds that proposed at least i tokens in which the i-th proposed token was accepted "
    "(a tree: a node at depth i, and the accepted path reaching depth i), pooled over every run of the suite; vLLM's "
    "accepted-per-position ÷ drafts when every draft has full length. Q stage: a pyramid's qualifier rounds, alike."
)


def position_counts(steps: list[Step]) -> dict[str, list[int]]:
    """Per stage that ran rounds: how many rounds proposed at position i, and in how many the i-th was accepted."""
    t = Tally()
    for s in steps:
        t.add(s)
    out: dict[str, list[int]] = {}
    for st in STAGES:
        if t.rounds.get(st):
            reached, kept = t.reached[st], t.kept[st]
            out[f"positions_{st}"] = reached
            out[f"positions_{st}_accepted"] = kept + [0] * (len(reached) - len(kept))
    return out


def _samples(rows: list[dict]) -> dict[str, dict[Key, list[dict]]]:
    """Rows by variant and sample, for the samples every variant ran whole: speed-ups compare the same questions."""
    by: dict[str, dict[Key, list[dict]]] = {}
    for r in rows:
        if r.get("question_id") is not None:
            by.setdefault(r["variant"], {}).setdefault((int(r["repeat"]), int(r["question_id"])), []).append(r)
    turns: dict[Key, set[int]] = {}
    for per in by.values():
        for key, rs in per.items():
            turns.setdefault(key, set()).update(int(r["turn"]) for r in rs)
    whole = {
        key
        for key, ts in turns.items()
        if all(key in per and {int(r["turn"]) for r in per[key]} == ts for per in by.values())
    }
    return {label: {k: rs for k, rs in per.items() if k in whole} for label, per in by.items()}


def question_speed(turn_rows: list[dict], clock: str = "wall_s") -> float | None:
    """One question's tokens/s: new tokens ÷ seconds (`clock`: wall_s as Spec-Bench, or decode_s), summed over turns."""
    return ratio(sum(int(r["n_new_tokens"]) for r in turn_rows), sum(float(r[clock]) for r in turn_rows))


def mean_accepted_tokens(rows: list[dict]) -> float | None:
    """Tokens per target forward over the rows (a peer's counted forwards); None when a row has none counted."""
    passes = [r.get("target_passes") if r["kind"] != "peer" else r.get("target_forwards") for r in rows]
    if not rows or any(p is None for p in passes) or not sum(passes):
        return None
    return sum(int(r["n_new_tokens"]) for r in rows) / sum(passes)


def table(rows: list[dict], clock: str = "wall_s") -> list[dict]:
    """One record per variant: per task its mean tokens/s and speed-up over AR, Overall, #Mean Accepted Tokens.
    `clock` "decode_s" times the engine's decode alone (its rows only: a peer's time holds its prefill)."""
    if clock != "wall_s":
        rows = [r for r in rows if r["kind"] == "engine" and r.get(clock) is not None]
    samples = _samples(rows)
    base = next((r["variant"] for r in rows if r["method"] == "ar" and r["kind"] == "engine"), None)  # AR's
    tasks = [t for t in TASKS if any(r.get("task") == t for r in rows)]
    speeds = {label: {k: question_speed(rs, clock) for k, rs in per.items()} for label, per in samples.items()}
    task_of = {k: rs[0]["task"] for per in samples.values() for k, rs in per.items()}
    first = {r["variant"]: r for r in reversed(rows) if r.get("question_id") is not None}

    def mean_speed(label: str | None, task: str | None) -> float | None:
        mine = [s for k, s in speeds.get(label, {}).items() if s is not None and (task is None or task_of[k] == task)]
        return statistics.mean(mine) if mine else None

    out = []
    for label in samples:
        by_task = {}
        for t in tasks:
            mine, ar = mean_speed(label, t), mean_speed(base, t)
            n = sum(1 for k in speeds[label] if task_of[k] == t)
            by_task[t] = dict(tokens_per_s=mine, speedup=ratio(mine, ar), questions=n)
        overall, ar_overall = mean_speed(label, None), mean_speed(base, None)
        out.append(
            dict(
                variant=label,
                method=first[label]["method"],
                kind=first[label]["kind"],
                tasks=by_task,
                overall_tokens_per_s=overall,
                overall=ratio(overall, ar_overall),
                mean_accepted_tokens=mean_accepted_tokens([r for rs in samples[label].values() for r in rs]),
                questions=len(samples[label]),
            )
        )
    return out


def positions(rows: list[dict]) -> list[dict]:
    """Per variant and stage that proposed: per-position acceptance pooled over the suite's runs (`POSITION_NOTE`)."""
    out = []
    for label, per in _samples(rows).items():
        rs = [r for rows_ in per.values() for r in rows_]
        for st in ("target", "qualifier"):  # the target's verification first: vLLM's and llama.cpp's figure
            reached, kept = _sum_lists(rs, f"positions_{st}"), _sum_lists(rs, f"positions_{st}_accepted")
            if reached:
                rates = [k / n if n else None for n, k in zip(reached, kept)]
                out.append(dict(variant=label, stage=st, rounds=reached, accepted=kept, rates=rates))
    return out


def _sum_lists(rows: list[dict], key: str) -> list[int]:
    return [sum(xs) for xs in zip_longest(*(r.get(key) or [] for r in rows), fillvalue=0)]


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}x"


def _n(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def task_columns(records: list[dict]) -> list[str]:
    """The tasks the table has columns for, in Spec-Bench's order."""
    return [t for t in TASKS if any(t in r["tasks"] for r in records)]


def grid(records: list[dict]) -> str:
    """One table: a row per variant, a column per task, #Mean Accepted Tokens, Overall."""
    tasks = task_columns(records)
    head = ["Method", *(TITLES[t] for t in tasks), "#Mean Accepted Tokens", "Overall"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        cells = [r["variant"], *(_x(r["tasks"][t]["speedup"]) for t in tasks), _n(r["mean_accepted_tokens"])]
        lines.append("| " + " | ".join([*cells, _x(r["overall"])]) + " |")
    return "\n".join(lines)


def markdown(records: list[dict], pos: list[dict], selection: str = "", decode: list[dict] | None = None) -> str:
    """Spec-Bench's table and footnote, the decode-only table where given, then per-position acceptance."""
    out = grid(records) + "\n\n" + (f"Questions: {selection}.\n\n" if selection else "") + FOOTNOTE
    if decode:
        out += "\n\n" + grid(decode) + "\n\n" + DECODE_NOTE
    if pos:
        out += "\n\n" + position_markdown(pos) + "\n\n" + POSITION_NOTE
    return out


def position_markdown(pos: list[dict]) -> str:
    width = max(len(p["rates"]) for p in pos)
    head = ["Method", *(f"pos {i}" for i in range(1, width + 1))]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in pos:
        label = p["variant"] + (" · Q stage" if p["stage"] == "qualifier" else "")
        cells = [_n(x) for x in p["rates"]] + [""] * (width - len(p["rates"]))
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines)


def csv_rows(records: list[dict]) -> tuple[list[str], list[dict]]:
    """spec_bench.csv (`cols` of each row): one row per variant, the table's figures and the tokens/s they come from."""
    tasks = task_columns(records)
    cols = ["variant", "method", "kind", *(f"{t}_speedup" for t in tasks), "mean_accepted_tokens", "overall"]
    cols += [*(f"{t}_tokens_per_s" for t in tasks), "overall_tokens_per_s", "questions"]
    return cols, [
        r | {f"{t}_{k}": r["tasks"][t][k] for t in tasks for k in ("speedup", "tokens_per_s")} for r in records
    ]


def html_section(suite: dict) -> str:
    """The report's Spec-Bench section: the table, per-task speed-ups as bars, per-position acceptance."""
    import plotly.graph_objects as go

    from .costs_report import html_table

    records, pos = suite["table"], suite["positions"]
    tasks = task_columns(records)
    fig = go.Figure()
    for r in records:
        fig.add_bar(
            x=[TITLES[t] for t in tasks] + ["Overall"],
            y=[r["tasks"][t]["speedup"] for t in tasks] + [r["overall"]],
            name=r["variant"],
        )
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(title="Spec-Bench: speed-up over AR per task", barmode="group", yaxis_title="× AR")
    decode = suite.get("decode_table")
    return (
        f"<h2>Spec-Bench</h2><p><b>Questions:</b> {html.escape(suite.get('selection_text', ''))}</p>"
        + html_table(grid(records) + "\n" + FOOTNOTE)  # the note below the table
        + "".join(f"<p><small>note: {html.escape(n)}</small></p>" for n in suite.get("notes", []))
        + fig.to_html(full_html=False, include_plotlyjs=False, default_height=460)
        + (html_table(grid(decode) + "\n" + DECODE_NOTE) if decode else "")
        + "<h3>Per-position acceptance</h3>"
        + (html_table(position_markdown(pos) + "\n" + POSITION_NOTE) if pos else "")
    )
