"""One recorded target pass as beats, a plain sentence each, read from the `Step` alone (docs/how-it-works.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..core import rules
from ..core.rules import fuzzy_passes
from ..core.trace import StageRound, Step, accepted_path, parents_of

HIDDEN, PROPOSED = "hidden", "proposed"  # a chip not out yet; out but not judged yet
MARKS = {"accepted": "✓", "rejected": "✗", "discarded": "·"}  # under a judged proposed token


@dataclass(frozen=True)
class Chip:
    """One token as a beat shows it: its text, its origin and its state (hidden, proposed, or a token status)."""

    text: str
    origin: str
    state: str


@dataclass(frozen=True)
class Beat:
    """One step of the replay: the round's chips, parent list, the nodes lit (len(parents): the own token), commits."""

    sentence: str
    actor: str  # the model acting in this beat: draft | qualifier | target
    round: int  # index into `step.rounds`; −1 for AR (no round)
    title: str  # which round: "stage 1 · round 1: draft → qualifier"
    chips: tuple[Chip, ...]
    parents: tuple[int, ...]
    lit: tuple[int, ...]
    committed: tuple[Chip, ...]


def visits(rnd: StageRound) -> list[tuple[int, ...]]:
    """A round's nodes as the verifier tried them, a group per beat (a plain fuzzy test refuses a context at once)."""
    recs = rnd.tokens[:-1]
    kids = rules.children(parents_of(rnd))
    out: list[tuple[int, ...]] = []
    c = 0
    while kids[c]:
        ch = kids[c]
        took = next((i for i in ch if recs[i].status == "accepted"), None)
        tried = [i for i in ch[: ch.index(took) if took is not None else len(ch)] if recs[i].status == "rejected"]
        if tried and took is None and not rnd.exact and not rnd.sd_fallback:
            out.append(tuple(tried))
        else:
            out += [(i,) for i in tried]
        if took is None:
            break
        out.append((took,))
        c = took + 1
    return out


def _q(text: str) -> str:
    return f"‘{text}’"


def _versus(d: float | None, tau: float | None, name: str) -> str:
    """ "divergence 0.12 ≤ τ_Q 0.30" (passes) or "divergence 0.52 > τ_T 0.30" (fails); τ 0 accepts nothing."""
    if d is None or tau is None:
        return ""
    for nd in (2, 3, 4):  # the fewest decimals that keep unequal values apart
        a, b = f"{d:.{nd}f}", f"{tau:.{nd}f}"
        if a != b or d == tau:
            break
    if fuzzy_passes([d], tau)[0]:
        return f"divergence {a} ≤ {name} {b}"
    if d <= tau:
        return f"divergence {a}, but {name} = 0 accepts nothing by divergence"
    return f"divergence {a} > {name} {b}"


class _Play:
    """Builds the beats of one pass: the round being played and what the pass has committed so far."""

    def __init__(self, step: Step, decode: Callable[[int], str]):
        self.step, self.decode = step, decode
        self.beats: list[Beat] = []
        self.committed: list[Chip] = []

    def text(self, tid: int) -> str:
        return self.decode(int(tid))

    def add(
        self, sentence: str, actor: str, j: int, title: str, chips: list[Chip], ps: list[int], lit: tuple[int, ...] = ()
    ) -> None:
        self.beats.append(Beat(sentence, actor, j, title, tuple(chips), tuple(ps), lit, tuple(self.committed)))

    def judged(self, rnd: StageRound, group: tuple[int, ...], tau_name: str) -> str:
        """The sentence for a group of nodes the verifier just tried (`visits`)."""
        v, recs = rnd.verifier, rnd.tokens
        names = ", ".join(_q(self.text(recs[i].token_id)) for i in group)
        rec = recs[group[0]]
        ok = rec.status == "accepted"
        head = f"{v}: {names} {'✓' if ok else '✗'}"
        if rnd.exact:
            if rnd.rule == "greedy":
                if ok:
                    return f"{head} — the {v}'s top choice too"
                top = (rec.top5.get(v) or [[None]])[0][0]
                if top is None:
                    return f"{head} — not the {v}'s top choice"
                return f"{head} — the {v}'s top choice here is {_q(self.text(top))}"
            pq = f" (p {rec.p:.2f}, q {rec.q:.2f})" if rec.p is not None and rec.q is not None else ""
            return f"{head} — the exact SD test {'keeps' if ok else 'refuses'} it{pq}"
        why = _versus(rec.div, rec.tau, tau_name)
        if rnd.sd_fallback and not (
            rec.div is not None and rec.tau is not None and fuzzy_passes([rec.div], rec.tau)[0]
        ):
            sd = ", but the exact SD test keeps it" if ok else " and the exact SD test refuses it too"
            return f"{head} — {why}{sd}" if why else f"{head} — the exact SD test {'keeps' if ok else 'refuses'} it"
        if len(group) > 1:
            return f"{head} — {why} here, so no guess passes" if why else f"{head} — no guess here passes"
        return f"{head} — {why}" if why else head

    def own(self, rnd: StageRound, ps: list[int]) -> str:
        """The sentence for the verifier's own token (resampled or bonus)."""
        v, own = rnd.verifier, rnd.tokens[-1]
        t = _q(self.text(own.token_id))
        if own.status == "resampled":
            return f"{v} writes its own {t} in place of the refused guess (resampled)"
        if not ps:
            return f"nothing was proposed, so the {v} writes {t} itself (bonus)"
        if rules.is_chain(ps):
            return f"every guess passed, so the {v} adds {t} for free (bonus)"
        return f"the path reached a leaf of the tree, so the {v} adds {t} for free (bonus)"

    def round(self, j: int, rnd: StageRound, title: str, origins: list[str], block: bool) -> None:
        """One round: its guesses appear (`block`: at once), the verifier marks them, its own lands or it is cut."""
        ps, recs = parents_of(rnd), rnd.tokens
        n, target = len(ps), rnd.stage == "target"
        own_origin = "bonus" if target and recs[-1].status == "bonus" else rnd.verifier
        chips = [
            Chip(self.text(r.token_id), origins[i] if i < len(origins) else rnd.proposer, HIDDEN)
            for i, r in enumerate(recs[:-1])
        ] + [Chip(self.text(recs[-1].token_id), own_origin, HIDDEN)]

        def set_state(i: int, state: str) -> None:
            chips[i] = replace(chips[i], state=state)

        if block and n:
            for i in range(n):
                set_state(i, PROPOSED)
            said = f"the qualified block of {n} token{'s' if n != 1 else ''} goes up to the target"
            self.add(said, "qualifier", j, title, chips, ps, tuple(range(n)))
        elif not block:
            kids = rules.children(ps)
            for i in range(n):
                set_state(i, PROPOSED)
                t, parent = _q(chips[i].text), ps[i]
                after = f" after {_q(chips[parent].text)}" if parent >= 0 else ""
                what = f"guesses {t}" if kids[parent + 1][0] == i else f"adds {t} as another guess"
                self.add(f"{rnd.proposer} {what}{after}", rnd.proposer, j, title, chips, ps, (i,))
        tau_name = "τ_Q" if rnd.stage == "qualifier" else "τ_T"
        for group in visits(rnd):
            for i in group:
                set_state(i, recs[i].status)
                if target and recs[i].status == "accepted":
                    self.committed.append(replace(chips[i], state="accepted"))
            self.add(self.judged(rnd, group, tau_name), rnd.verifier, j, title, chips, ps, group)
        for i in range(n):
            if chips[i].state in (HIDDEN, PROPOSED):
                set_state(i, "discarded")  # never reached (or past a cut)
        own = recs[-1]
        if own.status == "discarded":  # a cut: the round's own token never entered the block or the output
            set_state(n, "discarded")
            kept = accepted_path(rnd)
            last = f" after {_q(chips[kept[-1]].text)}" if kept else ""
            said = (
                f"the text ends{last}, so the rest of this pass is not used"
                if target
                else f"the block is complete{last}, so the rest of this round is not used"
            )
            self.add(said, rnd.verifier, j, title, chips, ps)
            return
        set_state(n, own.status)
        if target:
            self.committed.append(chips[n])
        self.add(self.own(rnd, ps), rnd.verifier, j, title, chips, ps, (n,))

    def play(self) -> list[Beat]:
        step, t = self.step, self.step.target_round
        if t is None:  # AR: one model alone (the target, or a reference lane's member, as its origins say)
            who = step.origins[0] if step.origins else "target"
            text = "".join(self.text(x) for x in step.new_tokens)
            self.committed = [Chip(self.text(x), o, "accepted") for x, o in zip(step.new_tokens, step.origins)]
            title = "AR: target alone" if who == "target" else f"the {who} alone"
            self.add(f"the {who} alone writes {_q(text)} — one token per pass", who, -1, title, [], [])
            return self.beats
        block: list[str] = []  # the origin of each token of the qualified block
        for j, rnd in enumerate(step.qualifier_rounds):
            self.round(j, rnd, f"stage 1 · round {j + 1}: draft → qualifier", ["draft"] * len(rnd.tokens), False)
            block += ["draft"] * rnd.n_accepted + ([] if rnd.tokens[-1].status == "discarded" else ["qualifier"])
        j = len(step.qualifier_rounds)
        pyramid = bool(step.qualifier_rounds) or t.proposer == "qualifier"
        title = "stage 2: qualifier → target" if pyramid else f"{t.proposer} → target"
        self.round(j, t, title, block if pyramid else [t.proposer] * len(t.tokens), pyramid)
        chips, ps = self.beats[-1].chips, list(self.beats[-1].parents)
        self.committed = [Chip(self.text(x), o, "accepted") for x, o in zip(step.new_tokens, step.origins)]
        text = "".join(c.text for c in self.committed)
        k = len(self.committed)
        self.add(f"the pass commits {k} token{'s' if k != 1 else ''}: {_q(text)}", "target", j, title, list(chips), ps)
        return self.beats


def beats(step: Step, decode: Callable[[int], str]) -> list[Beat]:
    """The beats of one recorded target pass, in order (see the module doc); `decode` gives a token id's text."""
    return _Play(step, decode).play()


def mark(beat: Beat, i: int) -> str:
    """The mark under chip i: ✓ / ✗ / · once judged; the verifier's own token "+" unless it was cut."""
    if i == len(beat.parents):
        return "+" if beat.chips[i].state != "discarded" else "·"
    return MARKS.get(beat.chips[i].state, "")
