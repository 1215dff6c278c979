"""The player on trees whose walk takes a child that is not the first: below the root, among three siblings, and
where the taken child's own children are all refused. Each beat's sentence, lit nodes and committed text must name
the child the walk took, never its first sibling. Hand-built records (`test_playback`'s), no model runs."""

from __future__ import annotations

from helpers import shown
from test_playback import _walk_order, decode, rnd, sentences, step

from pyramid_demo.app import playback


def committed(beats: list[playback.Beat]) -> list[str]:
    """The committed text after each beat."""
    return ["".join(c.text for c in b.committed) for b in beats]


def deep_tree() -> tuple:
    """root ─ The(✓) ─ cat(✗, the target's top choice is ' dog') ─ sat(·)
                     └ dog(✓) ─ ran(✓)      then the leaf's bonus ' on'
            └ A(·) ─ big(·)
    record order (breadth first): The, A, cat, dog, big, sat, ran."""
    t = rnd(
        "target",
        "greedy",
        [
            (" The", "accepted"),
            (" A", "discarded"),
            (" cat", "rejected", " dog"),
            (" dog", "accepted"),
            (" big", "discarded"),
            (" sat", "discarded"),
            (" ran", "accepted"),
        ],
        (" on", "bonus"),
        parents=[-1, -1, 0, 0, 1, 2, 3],
    )
    return t, step(t, [" The", " dog", " ran", " on"], ["draft", "draft", "draft", "bonus"])


def test_a_walk_takes_the_second_child_below_the_root() -> None:
    """Rule: below an accepted first guess the walk tries that node's children in order: the first refused (the
    sentence names the target's top choice, the sibling it then takes), the second taken, then the taken child's
    child; the refused child's subtree and the root's second child are never visited."""
    t, s = deep_tree()
    assert _walk_order(t) == [0, 2, 3, 6]
    assert sentences(s) == [
        "draft guesses ‘ The’",
        "draft adds ‘ A’ as another guess",
        "draft guesses ‘ cat’ after ‘ The’",
        "draft adds ‘ dog’ as another guess after ‘ The’",
        "draft guesses ‘ big’ after ‘ A’",
        "draft guesses ‘ sat’ after ‘ cat’",
        "draft guesses ‘ ran’ after ‘ dog’",
        "target: ‘ The’ ✓ — the target's top choice too",
        "target: ‘ cat’ ✗ — the target's top choice here is ‘ dog’",
        "target: ‘ dog’ ✓ — the target's top choice too",
        "target: ‘ ran’ ✓ — the target's top choice too",
        "the path reached a leaf of the tree, so the target adds ‘ on’ for free (bonus)",
        "the pass commits 4 tokens: ‘ The dog ran on’",
    ]


def test_the_committed_text_grows_with_the_child_taken() -> None:
    """Rule: after each ✓ beat the committed text gains that beat's node (the second child ' dog', not its first
    sibling ' cat'); a ✗ beat adds nothing; each judging beat lights exactly the node it names."""
    t, s = deep_tree()
    beats = playback.beats(s, decode)
    judged = beats[7:11]
    assert [[b.chips[i].text for i in b.lit] for b in judged] == [[" The"], [" cat"], [" dog"], [" ran"]]
    assert committed(beats)[6:12] == ["", " The", " The", " The dog", " The dog ran", " The dog ran on"]
    assert shown(beats[11]) == [
        (" The", "✓"),
        (" A", "·"),
        (" cat", "✗"),
        (" dog", "✓"),
        (" big", "·"),
        (" sat", "·"),
        (" ran", "✓"),
        (" on", "+"),
    ]


def test_the_third_of_three_siblings() -> None:
    """Rule: with three guesses at the root the walk refuses the first two in rank order, each with the target's
    top choice, takes the third, and the sampled SD test's p and q are the third's; its own token then replaces the
    refused guess under it."""
    t = rnd(
        "target",
        "sd",
        [
            (" The", "rejected", 0.01, 0.5),
            (" A", "rejected", 0.02, 0.3),
            (" big", "accepted", 0.4, 0.1),
            (" cat", "rejected", 0.05, 0.6),
        ],
        (" dog", "resampled"),
        parents=[-1, -1, -1, 2],
    )
    s = step(t, [" big", " dog"], ["draft", "target"])
    assert sentences(s) == [
        "draft guesses ‘ The’",
        "draft adds ‘ A’ as another guess",
        "draft adds ‘ big’ as another guess",
        "draft guesses ‘ cat’ after ‘ big’",
        "target: ‘ The’ ✗ — the exact SD test refuses it (p 0.01, q 0.50)",
        "target: ‘ A’ ✗ — the exact SD test refuses it (p 0.02, q 0.30)",
        "target: ‘ big’ ✓ — the exact SD test keeps it (p 0.40, q 0.10)",
        "target: ‘ cat’ ✗ — the exact SD test refuses it (p 0.05, q 0.60)",
        "target writes its own ‘ dog’ in place of the refused guess (resampled)",
        "the pass commits 2 tokens: ‘ big dog’",
    ]
    beats = playback.beats(s, decode)
    assert [b.lit for b in beats[4:9]] == [(0,), (1,), (2,), (3,), (4,)]
    assert committed(beats)[5:9] == ["", " big", " big", " big dog"]
