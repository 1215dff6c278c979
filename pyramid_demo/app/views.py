"""The inspector and Statistics tabs' handlers over a session's recorded races: no model runs, they answer at once."""

from __future__ import annotations

import html
from dataclasses import replace
from typing import Any

import gradio as gr

from ..core import rules
from ..core.methods import METHOD_LABELS
from ..core.trace import RunResult, StageRound, parents_of
from . import charts, inspector, play_view, render, story
from .pass_hist import accepted_figure
from .races import Session
from .text import DEFAULT, MSG
from .tree_view import tree_figure


def _pos_slider(r: RunResult | None) -> Any:
    """Positions along a target pass's accepted path (`inspector.positions`): as many as the run's deepest pass has."""
    steps = r.steps if r is not None else []
    top = max((len(inspector.positions(s.target_round)) for s in steps if s.target_round is not None), default=1)
    return gr.update(minimum=1, maximum=max(top, 2), value=1, step=1)  # max > min


def shape_words(rnd: StageRound) -> str:
    """ "a chain of 4" or "a tree of 7 candidates, depth 3": what a round proposed, read from its parent list."""
    ps = parents_of(rnd)
    if rules.is_chain(ps):
        return f"a chain of {len(ps)}"
    return f"a tree of {len(ps)} candidates, depth {max(rules.depths(ps))}"


def kept_words(rnd: StageRound) -> str:
    """What the verifier kept: "**2 of 4** proposed tokens" for a chain, "**2** (a path) of a tree of …" for a tree."""
    ps = parents_of(rnd)
    if rules.is_chain(ps):
        return f"**{rnd.n_accepted} of {len(ps)}** proposed tokens"
    return f"**{rnd.n_accepted}** (a path) of {shape_words(rnd)}"


def position_title(rnd: StageRound, depth: int, texts: dict[int, str]) -> tuple[int, str]:
    """The top-5 chart's title at a position (clamped): its token, the other candidates, the own token if there."""
    at = inspector.position_at(rnd, depth)

    def name(i: int) -> str:
        t = rnd.tokens[i]
        return html.escape(f"{render.token_label(texts, t.token_id)} ({t.status})", quote=False)

    title = f"Top-5 next tokens at position {at.depth}: " + (
        name(at.node) if at.node is not None else f"{rnd.verifier}'s own {name(len(rnd.tokens) - 1)}"
    )
    if at.siblings:
        title += "<br>other candidates at this position: " + ", ".join(name(i) for i in at.siblings)
    if at.own and at.node is not None:
        title += f" · {rnd.verifier}'s own: {name(len(rnd.tokens) - 1)}"
    return at.depth, title


def pick_method(session: Session, race_n: Any, method: str | None) -> tuple:
    """A method was chosen: reset the round slider and start the what-if τs at the recorded values."""
    race = session.find(race_n)
    r = race.results.get(method) if race and method else None
    cfg = race.config if race else DEFAULT.to_dict()
    return (
        play_view.pass_slider(len(r.steps) if r else 1, 1),
        gr.update(value=cfg["tau_q"]),
        gr.update(value=cfg["tau_t"]),
        _pos_slider(r),
    )


def pick_race(session: Session, race_n: Any = None) -> tuple:
    """A race was chosen (or just finished): refresh the inspector's choices, the statistics and the race histogram."""
    race = session.find(race_n)
    if race is None:
        none, empty = charts.empty_figure(MSG["no_race"]), gr.update(choices=[], value=None)
        stats = (none, none, none, "", none, "", none)  # the Statistics tab's outputs and the race histogram
        return empty, empty, play_view.pass_slider(1, 1), gr.skip(), gr.skip(), _pos_slider(None), *stats
    res = race.results
    method = list(res)[-1] if res else None  # the last raced: the fullest pyramid
    profile = race.profile
    details = (
        story.profile_markdown(profile),
        story.pass_costs_markdown(res, profile),
        story.teaching_aid(res, profile),
        story.passes_markdown(res),
    )
    return (
        gr.update(choices=[(f"Race {r.n}", str(r.n)) for r in session.races], value=str(race.n)),
        gr.update(choices=[(METHOD_LABELS[m], m) for m in res], value=method),
        *pick_method(session, race.n, method),
        accepted_figure(res),
        charts.position_figure(res),
        charts.throughput_figure(story.rows(res, profile, race.repeats)),
        story.markdown(res, profile, race.repeats, race.prompt),
        charts.cost_figure(profile, res),
        "\n\n".join(x for x in details if x),
        accepted_figure(res, f"Race {race.n}: drafted tokens accepted per target pass"),
    )


def inspect_round(
    session: Session,
    race_n: Any,
    method: str | None,
    round_no: float,
    tau_q: float,
    tau_t: float,
    position: float,
) -> tuple[str, Any, Any, str, Any]:
    """One recorded target pass: chips, divergences vs the what-if τs, the top-5 at a position, its candidate tree."""
    race = session.find(race_n)
    r = race.results.get(method) if race and method else None
    if race is None or r is None or not r.steps:
        none = charts.empty_figure(MSG["no_race"])
        return render.message_html(MSG["no_race"]), none, none, "", none
    step = r.steps[max(0, min(int(round_no or 1) - 1, len(r.steps) - 1))]
    vocab = race.vocab
    committed = "".join(vocab.get(t, f"#{t}") for t in step.new_tokens)
    head = (
        f"**Target pass {step.index + 1} of {len(r.steps)}** · committed {len(step.new_tokens)} "
        f"token(s): `{committed!r}`"
    )
    if step.target_round is None:
        none = charts.empty_figure(MSG["ar_round"])
        return render.message_html(MSG["ar_round"]), none, none, head, tree_figure(step, vocab)
    parts, lines = [], [head]
    for j, rnd in enumerate(step.rounds):
        tau = inspector.round_tau(rnd, tau_q, tau_t)
        what_if = inspector.whatif_statuses(rnd, tau)
        k = what_if.count("accepted") if tau is not None else rnd.n_accepted
        name = (
            f"Stage 1 · round {j + 1}: draft → qualifier"
            if rnd.stage == "qualifier"
            else f"Stage 2: {rnd.proposer} → target"
        )
        if tau is None:  # exact rule; still show what a fuzzy test at the slider's τ would have kept
            slider = tau_q if rnd.stage == "qualifier" else tau_t
            fuzzy_k = inspector.reevaluate(replace(rnd, exact=False, sd_fallback=False), slider)
            what = f"exact rule (τ unused) · a fuzzy test at τ = {slider:g} would keep <b>{fuzzy_k}</b>"
        else:
            what = f"at τ = {tau:g}: <b>{k}</b>" + (" (same)" if k == rnd.n_accepted else " ← changed")
        note = f"rule {rnd.rule} · {shape_words(rnd)} · recorded: <b>{rnd.n_accepted}</b> accepted<br>{what}"
        parts.append(render.round_chips_html(rnd, vocab, name, None if tau is None else what_if, note))
        if rnd.stage == "target":
            lines.append(
                f"The target kept {kept_words(rnd)}; "
                + ("τ does not apply (exact rule)." if tau is None else f"at τ_T = {tau:g} it would accept **{k}**.")
            )
    if step.qualifier_rounds:
        lines.append("A different τ_Q would change the block itself; the what-if re-checks each recorded round only.")
    depth, title = position_title(step.target_round, int(position or 1), vocab)
    return (
        render.status_legend_html() + "".join(parts),
        charts.divergence_figure(step, tau_q, tau_t, vocab),
        charts.top5_figure(inspector.position_top5(step, depth), vocab, title),
        "  \n".join(lines),
        tree_figure(step, vocab),
    )
