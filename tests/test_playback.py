"""Playing one recorded target pass as beats (`app/playback.py`) and the ▶ Play panel's handlers (`app/play_view.py`),
on hand-built records: every method, chain and tree, each beat's sentence written out in full, so a beat out of
order or wrong fails. No model runs, no browser."""

from __future__ import annotations

from helpers import shown

from pyramid_demo.app import play_view, playback
from pyramid_demo.app.play_view import PlayState
from pyramid_demo.app.races import Race, Session
from pyramid_demo.core.trace import StageRound, Step, TokenRec

WORDS = [" The", " A", " cat", " dog", " sat", " ran", " on", " mat", " big", " ate", " the", "."]
ID = {w: i for i, w in enumerate(WORDS)}
TAU = {"qualifier": 0.3, "target": 0.4}


def decode(tid: int) -> str:
    return WORDS[tid]


def rnd(
    stage: str,
    rule: str,
    nodes: list[tuple],
    own: tuple[str, str],
    parents: list[int] | None = None,
    fallback: bool = False,
) -> StageRound:
    """A round from (word, status, …) nodes: fuzzy (word, status, div); greedy (word, status[, verifier's top-1]);
    sampled sd (word, status, p, q). `own`: (word, status) of the verifier's own token."""
    verifier = "qualifier" if stage == "qualifier" else "target"
    proposer = "draft"
    toks = []
    for w, st, *x in nodes:
        rec = TokenRec(ID[w], proposer, st)
        if rule.startswith("fuzzy"):
            rec.div, rec.tau = x[0], TAU[stage]
        elif rule == "greedy" and x:
            rec.top5 = {verifier: [[ID[x[0]], 0.6]]}
        elif rule == "sd":
            rec.p, rec.q = x
        toks.append(rec)
    toks.append(TokenRec(ID[own[0]], verifier, own[1]))
    n_acc = sum(t.status == "accepted" for t in toks[:-1])
    return StageRound(
        stage,
        proposer,
        verifier,
        rule,
        toks,
        n_acc,
        exact=rule in ("sd", "greedy"),
        sd_fallback=fallback,
        parents=parents if parents is not None else list(range(-1, len(nodes) - 1)),
    )


def block(r: StageRound) -> StageRound:
    """A pyramid's target round: the qualified block's proposer is the qualifier."""
    r.proposer = "qualifier"
    for t in r.tokens[:-1]:
        t.proposer = "qualifier"
    return r


def step(target: StageRound | None, words: list[str], origins: list[str], qual: list[StageRound] = ()) -> Step:
    return Step(0, list(qual), target, [ID[w] for w in words], origins, 0.0, 0.1)


def _walk_order(r: StageRound) -> list[int]:
    """Every node the verifier's walk visited, in order (`playback.visits` flattened)."""
    return [i for group in playback.visits(r) for i in group]


def sentences(s: Step) -> list[str]:
    return [b.sentence for b in playback.beats(s, decode)]


def test_ar_is_one_beat():
    """Rule: AR has no round: one beat, the target writing its token alone, committed at once."""
    beats = playback.beats(step(None, [" cat"], ["target"]), decode)
    assert [b.sentence for b in beats] == ["the target alone writes ‘ cat’ — one token per pass"]
    assert [c.text for c in beats[0].committed] == [" cat"] and beats[0].round == -1


def test_sd_chain_greedy():
    """Rule: SD: the draft's guesses one by one, the target's marks in order (greedy: its top choice or not), its
    own token in place of the refused guess, then the commit; the committed text grows with each ✓."""
    t = rnd(
        "target",
        "greedy",
        [(" The", "accepted"), (" cat", "accepted"), (" sat", "rejected", " ran"), (" on", "discarded")],
        (" ran", "resampled"),
    )
    beats = playback.beats(step(t, [" The", " cat", " ran"], ["draft", "draft", "target"]), decode)
    assert [b.sentence for b in beats] == [
        "draft guesses ‘ The’",
        "draft guesses ‘ cat’ after ‘ The’",
        "draft guesses ‘ sat’ after ‘ cat’",
        "draft guesses ‘ on’ after ‘ sat’",
        "target: ‘ The’ ✓ — the target's top choice too",
        "target: ‘ cat’ ✓ — the target's top choice too",
        "target: ‘ sat’ ✗ — the target's top choice here is ‘ ran’",
        "target writes its own ‘ ran’ in place of the refused guess (resampled)",
        "the pass commits 3 tokens: ‘ The cat ran’",
    ]
    assert [b.lit for b in beats] == [(0,), (1,), (2,), (3,), (0,), (1,), (2,), (4,), ()]
    assert [len(b.committed) for b in beats] == [0, 0, 0, 0, 1, 2, 2, 3, 3]
    assert shown(beats[6]) == [(" The", "✓"), (" cat", "✓"), (" sat", "✗"), (" on", "")]
    assert shown(beats[7]) == [(" The", "✓"), (" cat", "✓"), (" sat", "✗"), (" on", "·"), (" ran", "+")]


def test_sd_tree_sampled():
    """Rule: a tree's guesses appear in record order (a sibling is 'another guess'); the target tries a context's
    children in rank order, the SD test refusing or keeping each (p, q shown), and at a leaf adds its bonus."""
    t = rnd(
        "target",
        "sd",
        [(" The", "rejected", 0.05, 0.4), (" A", "accepted", 0.5, 0.3), (" dog", "accepted", 0.6, 0.6)],
        (" sat", "bonus"),
        parents=[-1, -1, 1],
    )
    s = step(t, [" A", " dog", " sat"], ["draft", "draft", "bonus"])
    assert sentences(s) == [
        "draft guesses ‘ The’",
        "draft adds ‘ A’ as another guess",
        "draft guesses ‘ dog’ after ‘ A’",
        "target: ‘ The’ ✗ — the exact SD test refuses it (p 0.05, q 0.40)",
        "target: ‘ A’ ✓ — the exact SD test keeps it (p 0.50, q 0.30)",
        "target: ‘ dog’ ✓ — the exact SD test keeps it (p 0.60, q 0.60)",
        "the path reached a leaf of the tree, so the target adds ‘ sat’ for free (bonus)",
        "the pass commits 3 tokens: ‘ A dog sat’",
    ]
    assert _walk_order(t) == [0, 1, 2]
    assert [c.origin for c in playback.beats(s, decode)[-1].committed] == ["draft", "draft", "bonus"]


def test_fsd_chain():
    """Rule: FSD's target marks each guess by divergence against τ_T (≤ passes, > refuses); the guess after the
    refusal is never reached; every guess passing ends with the bonus."""
    t = rnd(
        "target",
        "fuzzy",
        [(" The", "accepted", 0.12), (" cat", "rejected", 0.52), (" sat", "discarded", 0.1)],
        (" dog", "resampled"),
    )
    assert sentences(step(t, [" The", " dog"], ["draft", "target"])) == [
        "draft guesses ‘ The’",
        "draft guesses ‘ cat’ after ‘ The’",
        "draft guesses ‘ sat’ after ‘ cat’",
        "target: ‘ The’ ✓ — divergence 0.12 ≤ τ_T 0.40",
        "target: ‘ cat’ ✗ — divergence 0.52 > τ_T 0.40",
        "target writes its own ‘ dog’ in place of the refused guess (resampled)",
        "the pass commits 2 tokens: ‘ The dog’",
    ]
    full = rnd("target", "fuzzy", [(" The", "accepted", 0.1), (" cat", "accepted", 0.4)], (" sat", "bonus"))
    assert sentences(step(full, [" The", " cat", " sat"], ["draft", "draft", "bonus"]))[-3:] == [
        "target: ‘ cat’ ✓ — divergence 0.40 ≤ τ_T 0.40",
        "every guess passed, so the target adds ‘ sat’ for free (bonus)",
        "the pass commits 3 tokens: ‘ The cat sat’",
    ]


def test_fsd_tree_walks_through_a_non_first_child():
    """Rule: the walk visits nodes in the verifier's order: the root's first child refused, its second taken (by
    the SD fallback, the divergence being over τ), then that child's first child; the nodes light up in that
    order, and the subtree under the refused child is never visited."""
    # root ─ The(rejected) ─ cat(discarded)
    #      └ A(accepted)   ─ dog(accepted) ; └ big(discarded)   then the leaf's bonus ' ate'
    t = rnd(
        "target",
        "fuzzy+sd",
        [
            (" The", "rejected", 0.5),
            (" A", "accepted", 0.5),
            (" cat", "discarded", 0.2),
            (" dog", "accepted", 0.1),
            (" big", "discarded", 0.1),
        ],
        (" ate", "bonus"),
        parents=[-1, -1, 0, 1, 1],
        fallback=True,
    )
    s = step(t, [" A", " dog", " ate"], ["draft", "draft", "bonus"])
    beats = playback.beats(s, decode)
    assert [b.sentence for b in beats] == [
        "draft guesses ‘ The’",
        "draft adds ‘ A’ as another guess",
        "draft guesses ‘ cat’ after ‘ The’",
        "draft guesses ‘ dog’ after ‘ A’",
        "draft adds ‘ big’ as another guess after ‘ A’",
        "target: ‘ The’ ✗ — divergence 0.50 > τ_T 0.40 and the exact SD test refuses it too",
        "target: ‘ A’ ✓ — divergence 0.50 > τ_T 0.40, but the exact SD test keeps it",
        "target: ‘ dog’ ✓ — divergence 0.10 ≤ τ_T 0.40",
        "the path reached a leaf of the tree, so the target adds ‘ ate’ for free (bonus)",
        "the pass commits 3 tokens: ‘ A dog ate’",
    ]
    assert _walk_order(t) == [0, 1, 3]
    assert [b.lit for b in beats if b.actor == "target"][:3] == [(0,), (1,), (3,)]
    assert shown(beats[8]) == [
        (" The", "✗"),
        (" A", "✓"),
        (" cat", "·"),
        (" dog", "✓"),
        (" big", "·"),
        (" ate", "+"),
    ]


def test_a_fuzzy_refusal_of_a_context_is_one_beat():
    """Rule: without the SD fallback one divergence test refuses every child of a context at once: one beat
    lighting them all."""
    t = rnd(
        "target", "fuzzy", [(" The", "rejected", 0.7), (" A", "rejected", 0.7)], (" cat", "resampled"), parents=[-1, -1]
    )
    beats = playback.beats(step(t, [" cat"], ["target"]), decode)
    assert beats[2].sentence == "target: ‘ The’, ‘ A’ ✗ — divergence 0.70 > τ_T 0.40 here, so no guess passes"
    assert beats[2].lit == (0, 1) and len(beats) == 5


def psd_f_chain() -> Step:
    q1 = rnd("qualifier", "fuzzy", [(" The", "accepted", 0.12), (" big", "rejected", 0.45)], (" cat", "resampled"))
    q2 = rnd("qualifier", "fuzzy", [(" sat", "accepted", 0.05), (" on", "accepted", 0.2)], (" the", "discarded"))
    t = block(
        rnd(
            "target",
            "fuzzy",
            [
                (" The", "accepted", 0.1),
                (" cat", "accepted", 0.2),
                (" sat", "rejected", 0.6),
                (" on", "discarded", 0.1),
            ],
            (" ran", "resampled"),
        )
    )
    return step(t, [" The", " cat", " ran"], ["draft", "qualifier", "target"], [q1, q2])


def test_psd_f_chain():
    """Rule: a pyramid pass plays each stage-1 round (guesses, the qualifier's marks against τ_Q, its own token or
    the block's cut), then the block goes up at once, the target marks it against τ_T, its own token, the commit."""
    assert sentences(psd_f_chain()) == [
        "draft guesses ‘ The’",
        "draft guesses ‘ big’ after ‘ The’",
        "qualifier: ‘ The’ ✓ — divergence 0.12 ≤ τ_Q 0.30",
        "qualifier: ‘ big’ ✗ — divergence 0.45 > τ_Q 0.30",
        "qualifier writes its own ‘ cat’ in place of the refused guess (resampled)",
        "draft guesses ‘ sat’",
        "draft guesses ‘ on’ after ‘ sat’",
        "qualifier: ‘ sat’ ✓ — divergence 0.05 ≤ τ_Q 0.30",
        "qualifier: ‘ on’ ✓ — divergence 0.20 ≤ τ_Q 0.30",
        "the block is complete after ‘ on’, so the rest of this round is not used",
        "the qualified block of 4 tokens goes up to the target",
        "target: ‘ The’ ✓ — divergence 0.10 ≤ τ_T 0.40",
        "target: ‘ cat’ ✓ — divergence 0.20 ≤ τ_T 0.40",
        "target: ‘ sat’ ✗ — divergence 0.60 > τ_T 0.40",
        "target writes its own ‘ ran’ in place of the refused guess (resampled)",
        "the pass commits 3 tokens: ‘ The cat ran’",
    ]


def test_psd_f_chain_block_keeps_who_wrote_each_token():
    """Rule: the block's chips keep their origin (draft, or the qualifier's own token) and each beat names its
    round and actor: rounds 0, 1 of stage 1 (draft, then qualifier), round 2 the target's."""
    beats = playback.beats(psd_f_chain(), decode)
    up = beats[10]
    assert [c.origin for c in up.chips[:4]] == ["draft", "qualifier", "draft", "draft"] and up.lit == (0, 1, 2, 3)
    assert [(b.round, b.actor) for b in beats[:11]] == [(0, "draft")] * 2 + [(0, "qualifier")] * 3 + [
        (1, "draft")
    ] * 2 + [(1, "qualifier")] * 3 + [(2, "qualifier")]
    assert shown(beats[9]) == [(" sat", "✓"), (" on", "✓"), (" the", "·")]  # the own token cut
    assert [c.origin for c in beats[-1].committed] == ["draft", "qualifier", "target"]


def test_psd_f_tree():
    """Rule: a stage-1 tree refused by one fuzzy test at the root ends at once with the qualifier's token; the
    block (that single token) is what the target checks."""
    q = rnd(
        "qualifier",
        "fuzzy",
        [(" The", "rejected", 0.9), (" A", "rejected", 0.9), (" cat", "discarded", 0.1)],
        (" dog", "resampled"),
        parents=[-1, -1, 0],
    )
    t = block(rnd("target", "fuzzy", [(" dog", "accepted", 0.05)], (" sat", "bonus")))
    assert sentences(step(t, [" dog", " sat"], ["qualifier", "bonus"], [q])) == [
        "draft guesses ‘ The’",
        "draft adds ‘ A’ as another guess",
        "draft guesses ‘ cat’ after ‘ The’",
        "qualifier: ‘ The’, ‘ A’ ✗ — divergence 0.90 > τ_Q 0.30 here, so no guess passes",
        "qualifier writes its own ‘ dog’ in place of the refused guess (resampled)",
        "the qualified block of 1 token goes up to the target",
        "target: ‘ dog’ ✓ — divergence 0.05 ≤ τ_T 0.40",
        "every guess passed, so the target adds ‘ sat’ for free (bonus)",
        "the pass commits 2 tokens: ‘ dog sat’",
    ]


def test_psd_a_tree():
    """Rule: PSD_A's stage 1 is the exact rule: the qualifier refuses a guess that is not its top choice, takes
    the next sibling, goes down to a leaf and adds its bonus; the block is draft, draft, qualifier."""
    q = rnd(
        "qualifier",
        "greedy",
        [(" The", "rejected", " A"), (" A", "accepted"), (" dog", "accepted")],
        (" sat", "bonus"),
        parents=[-1, -1, 1],
    )
    t = block(
        rnd(
            "target",
            "fuzzy",
            [(" A", "accepted", 0.1), (" dog", "accepted", 0.15), (" sat", "accepted", 0.2)],
            (" on", "bonus"),
        )
    )
    s = step(t, [" A", " dog", " sat", " on"], ["draft", "draft", "qualifier", "bonus"], [q])
    assert sentences(s) == [
        "draft guesses ‘ The’",
        "draft adds ‘ A’ as another guess",
        "draft guesses ‘ dog’ after ‘ A’",
        "qualifier: ‘ The’ ✗ — the qualifier's top choice here is ‘ A’",
        "qualifier: ‘ A’ ✓ — the qualifier's top choice too",
        "qualifier: ‘ dog’ ✓ — the qualifier's top choice too",
        "the path reached a leaf of the tree, so the qualifier adds ‘ sat’ for free (bonus)",
        "the qualified block of 3 tokens goes up to the target",
        "target: ‘ A’ ✓ — divergence 0.10 ≤ τ_T 0.40",
        "target: ‘ dog’ ✓ — divergence 0.15 ≤ τ_T 0.40",
        "target: ‘ sat’ ✓ — divergence 0.20 ≤ τ_T 0.40",
        "every guess passed, so the target adds ‘ on’ for free (bonus)",
        "the pass commits 4 tokens: ‘ A dog sat on’",
    ]
    assert _walk_order(q) == [0, 1, 2]
    assert [c.origin for c in playback.beats(s, decode)[7].chips[:3]] == ["draft", "draft", "qualifier"]


def test_psd_a_chain_with_an_empty_last_pass():
    """Rule: a chain fully accepted at stage 1 ends with the qualifier's bonus; a pass that proposed nothing (the
    budget's last token) is the target writing its token itself."""
    q = rnd("qualifier", "greedy", [(" The", "accepted"), (" cat", "accepted")], (" sat", "bonus"))
    t = block(
        rnd(
            "target",
            "fuzzy",
            [(" The", "accepted", 0.1), (" cat", "rejected", 0.5), (" sat", "discarded", 0.1)],
            (" dog", "resampled"),
        )
    )
    assert sentences(step(t, [" The", " dog"], ["draft", "target"], [q])) == [
        "draft guesses ‘ The’",
        "draft guesses ‘ cat’ after ‘ The’",
        "qualifier: ‘ The’ ✓ — the qualifier's top choice too",
        "qualifier: ‘ cat’ ✓ — the qualifier's top choice too",
        "every guess passed, so the qualifier adds ‘ sat’ for free (bonus)",
        "the qualified block of 3 tokens goes up to the target",
        "target: ‘ The’ ✓ — divergence 0.10 ≤ τ_T 0.40",
        "target: ‘ cat’ ✗ — divergence 0.50 > τ_T 0.40",
        "target writes its own ‘ dog’ in place of the refused guess (resampled)",
        "the pass commits 2 tokens: ‘ The dog’",
    ]
    empty = block(rnd("target", "fuzzy", [], (".", "bonus")))
    assert sentences(step(empty, ["."], ["bonus"])) == [
        "nothing was proposed, so the target writes ‘.’ itself (bonus)",
        "the pass commits 1 token: ‘.’",
    ]


# ------------------------------------------------------------------ the ▶ Play panel's handlers
def session_with(s: Step) -> Session:
    race = Race(n=1, preset="tiny-random", models=[], prompt="hi", config={}, lanes=("psd_f",))
    from pyramid_demo.core.trace import RunResult

    race.results["psd_f"] = RunResult("psd_f", {}, [], "hi", [], [], [], [], "", None, [s])  # type: ignore[arg-type]
    race.vocab = dict(enumerate(WORDS))
    return Session(races=[race])


def test_step_controls_clamp_and_play_stops_at_the_last_beat():
    """Rule: step ▶ stops at the last beat and ◀ at the first (both pause); ▶ Play turns the timer on, each tick
    shows the next beat, and at the last beat play stops and the timer turns off."""
    ps, page, timer = play_view.show(session_with(psd_f_chain()), 1, "psd_f", 1)
    n = len(ps.beats)
    assert n == 16 and ps.i == 0 and "beat 1 / 16" in page and timer.active is False
    assert play_view.step_back(ps)[0].i == 0
    assert play_view.play(ps)[0].playing and not ps.playing  # a new state each time: nothing shared or mutated
    for _ in range(n + 3):
        ps = play_view.step_forward(ps)[0]
    assert ps.i == n - 1 and not ps.playing
    ps, page, timer = play_view.play(ps)  # from the last beat: starts again at the first
    assert ps.i == 0 and ps.playing and timer.active is True
    seen = [ps.i]
    while ps.playing:
        ps, page, timer = play_view.tick(ps)
        seen.append(ps.i)
    assert seen == list(range(n)) and timer.active is False and "beat 16 / 16" in page and "the pass commits" in page
    assert play_view.tick(ps)[0].i == n - 1  # a late tick after the end changes nothing
    ps = play_view.play(ps)[0]
    ps, _, timer = play_view.pause(play_view.tick(ps)[0])
    assert ps.i == 1 and not ps.playing and timer.active is False
    assert play_view.step_back(play_view.play(ps)[0])[0].playing is False


def test_bad_input_is_a_message_not_a_traceback():
    """Rule: no race yet, a lane the race has not, a pass out of range or not a number: a message in the panel,
    and every control works on the empty player."""
    for got in (play_view.show(None, None, None, 1), play_view.show(Session(), 1, "sd", 1)):
        assert "Run a race first" in got[1] and got[0].beats == ()
    session = session_with(psd_f_chain())
    assert "no such lane" in play_view.show(session, 1, "sd", 1)[1]
    assert "out of range" in play_view.show(session, 1, "psd_f", 5)[1]
    assert "out of range" in play_view.show(session, 1, "psd_f", None)[1]
    empty = PlayState()
    for handler in (play_view.play, play_view.pause, play_view.step_forward, play_view.step_back, play_view.tick):
        ps, page, timer = handler(empty)
        assert ps.i == 0 and not ps.playing and timer.active is False and "Run a race first" in page


def test_a_tree_beat_lights_its_nodes_in_the_indented_list():
    """Rule: a tree's round is drawn as an indented list; the beat's lit node carries the outline, the others not."""
    t = rnd(
        "target",
        "fuzzy+sd",
        [(" The", "rejected", 0.5), (" A", "accepted", 0.5)],
        (" ate", "bonus"),
        parents=[-1, -1],
        fallback=True,
    )
    ps = PlayState(tuple(playback.beats(step(t, [" A", " ate"], ["draft", "bonus"]), decode)), i=3, label="x")
    page = play_view.beat_html(ps)
    assert page.count(play_view.LIT) == 1 and page.index(play_view.LIT) > page.index("The")
    assert "beat 4 / 6" in page and "the exact SD test keeps it" in page


def test_the_race_tabs_player_starts_on_the_last_lanes_busiest_pass():
    """Rule: after a race the race tab's player offers its lanes, picks the last raced and its pass that committed
    the most tokens, loaded at beat 1; an unknown lane or no race is a message."""
    quiet = step(rnd("target", "fuzzy", [(" The", "rejected", 0.9)], (" A", "resampled")), [" A"], ["target"])
    session = session_with(quiet)
    session.latest.results["psd_f"].steps.append(psd_f_chain())  # pass 2 commits 3 tokens
    lanes, slider, ps, page, timer = play_view.race_choices(session)
    assert lanes["value"] == "psd_f" and slider["value"] == 2 and slider["maximum"] == 2
    assert ps.label.endswith("target pass 2 of 2") and "beat 1 / 16" in page and timer.active is False
    assert "no such lane" in play_view.pick_lane(session, "sd")[2]
    assert "Run a race first" in play_view.race_choices(None)[3]
