"""Guards on the exactness record's rules that no other test held (issue 60): a pass with one top-1 flip anywhere
in it is no "top-1 equal" pass, a tree whose top-1 agrees while its logits differ is no exact tree, and the tallies
and sentences users read follow the checks they are built from.

Smallest inputs: the bigram mock behind a fake kernel that moves one chosen row, and hand-built check dicts. Each
test states one rule; each was checked to fail by its assertion with a slip of that rule planted."""

from __future__ import annotations

import pytest
import torch
from mock_lm import BigramLM, bigram_table

from pyramid_demo.forward.weights import weights
from pyramid_demo.models import checks

V = 40
TABLE = bigram_table(V, 3, 3.0)
IDS = [(5 * i + 1) % V for i in range(60)]


def _flip(row: torch.Tensor) -> torch.Tensor:
    """The row with its top logit moved just below the runner-up: top-1 flips, every other logit unchanged."""
    out = row.clone()
    top, second = torch.topk(row, 2).values.tolist()
    out[int(row.argmax())] = second - 1e-3
    assert top != second and int(out.argmax()) != int(row.argmax())
    return out


def _nudge(row: torch.Tensor) -> torch.Tensor:
    """The row with one non-top logit moved by 0.25: the logits differ, top-1 agrees."""
    out = row.clone()
    low = int(row.argmin())
    out[low] = out[low] + 0.25
    assert int(out.argmax()) == int(row.argmax())
    return out


class ChainRowOff(BigramLM):
    """The bigram mock whose `keep`-row passes (only those) have row `row` changed by `change`; steps are exact."""

    def __init__(self, keep: int, row: int, change=_flip):
        super().__init__(TABLE)
        self.keep, self.row, self.change = keep, row, change

    def _run(self, tokens, pos, keep):
        z = super()._run(tokens, pos, keep)
        if keep == self.keep:
            z[self.row] = self.change(z[self.row])
        return z


class TreeRowOff(BigramLM):
    """The bigram mock whose tree passes have row `row` changed by `change` (chains and steps exact)."""

    def __init__(self, row: int, change=_nudge):
        super().__init__(TABLE)
        self.row, self.change = row, change

    def _run_tree(self, rows, base, pos):
        z = super()._run_tree(rows, base, pos)
        if len(z) > self.row:
            z[self.row] = self.change(z[self.row])
        return z


# ---------------------------------------------------------------- chain passes


@pytest.mark.parametrize("row", [0, 2, 4])
def test_one_flipped_row_makes_its_pass_not_top1(row):
    """Rule: a pass's top-1 agrees only when every row's argmax equals its step's: one flipped row (first, middle or
    last of a 5-row pass) makes that pass top-1 False and not bitwise; the other passes stay exact."""
    got = checks.pass_vs_steps(ChainRowOff(5, row), IDS, 10, (2, 5, 9))
    assert [c["k"] for c in got] == [2, 5, 9]
    assert [c["top1"] for c in got] == [True, False, True], "a pass with a flipped top-1 was called top-1 equal"
    assert [c["bitwise"] for c in got] == [True, False, True]
    assert got[1]["max_abs_diff"] > 0 and got[0]["max_abs_diff"] == got[2]["max_abs_diff"] == 0.0


def test_a_record_with_one_flipped_pass_says_top1_differed():
    """Rule: the record of passes where one pass flipped one top token says top-1 not always equal, not exact, and
    its sentence says the top-1 differed (never "top-1 always equal")."""
    rec = checks.check_model(lambda ids: ChainRowOff(3, 1), V, ((10, (2, 3, 5)), (20, (3,))))
    assert rec["passes"] == 4 and rec["bitwise_passes"] == 2 and rec["max_k"] == 5
    assert rec["exact"] is False and rec["top1"] is False, "one flipped top token must make top-1 not always equal"
    text = checks.describe(rec)
    assert "top-1 differed" in text and "always" not in text, text


def test_a_pass_whose_logits_differ_but_top1_agrees_is_not_exact():
    """Rule: a pass whose logits differ in one row while every argmax agrees is top-1 equal but not exact, and its
    largest difference is that row's (0.25)."""
    got = checks.pass_vs_steps(ChainRowOff(5, 2, _nudge), IDS, 10, (2, 5))
    assert got[1]["top1"] is True and got[1]["bitwise"] is False
    assert got[1]["max_abs_diff"] == pytest.approx(0.25)
    rec = checks.summarise(got)
    assert rec["exact"] is False and rec["top1"] is True and rec["bitwise_passes"] == 1


# ---------------------------------------------------------------- tree passes


@pytest.mark.parametrize("row", [0, 3, 7])
def test_a_tree_whose_top1_agrees_while_a_row_differs_is_not_exact(row):
    """Rule: a tree pass is exact only when every row equals the steps along its path bitwise: a tree whose rows all
    keep their top-1 while one row's logits differ (a root, a middle row or the last) is top-1 equal, not exact."""
    shape = checks.TREE_SHAPES[0]
    got = checks.tree_vs_steps(TreeRowOff(row), IDS, 10, shape)
    assert got["k"] == len(shape) and got["context"] == 10
    assert got["top1"] is True, "every row kept its top-1"
    assert got["bitwise"] is False, "a tree was counted exact because its top-1 agreed"
    assert got["max_abs_diff"] == pytest.approx(0.25)
    same = checks.tree_vs_steps(BigramLM(TABLE), IDS, 10, shape)
    assert same["bitwise"] and same["top1"] and same["max_abs_diff"] == 0.0


@pytest.mark.parametrize("row", [0, 4, 7])
def test_a_tree_with_one_flipped_row_is_not_top1(row):
    """Rule: a tree pass agrees on top-1 only when every row's argmax equals its path's step: one flipped row
    anywhere in the tree makes it top-1 False (and not bitwise)."""
    got = checks.tree_vs_steps(TreeRowOff(row, _flip), IDS, 10, checks.TREE_SHAPES[0])
    assert got["top1"] is False and got["bitwise"] is False


def test_each_tree_row_is_held_to_steps_along_its_own_path(one_thread):
    """Rule: a tree row is compared with one-token steps along its own path (its ancestors in order, then itself, at
    their positions), not with a step of its token alone: on the core forward of a tiny Llama (whose rows depend on
    their context) every row of EAGLE-2's 16-node tree is within rounding of its path's steps, top-1 equal."""
    from transformers import LlamaForCausalLM

    from pyramid_demo.forward.core import CoreLM
    from pyramid_demo.models.tiny import tiny_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(V)).eval()
    shape = checks.TREE_SHAPES[1]
    got = checks.tree_vs_steps(CoreLM(weights(model), V, "target"), IDS, 10, shape)
    assert got["k"] == len(shape) and got["top1"] is True, "a row was held to another context's step"
    assert got["max_abs_diff"] < 1e-4, f"a row was held to another context's step ({got['max_abs_diff']:.3g})"


def test_tree_records_follow_their_trees():
    """Rule: the record's trees say exact only when every tree was bitwise, top-1 from every tree's, counted apart
    from the chain; a record of trees whose top-1 agreed while one differed is not exact, its sentence "top-1 always
    equal"; one whose tree flipped a top token says "not always"."""
    plan = ((10, (2, 43)),)  # trees at contexts 10 and 35
    rec = checks.check_model(lambda ids: TreeRowOff(3), V, plan)
    assert rec["exact"] and rec["passes"] == 2, "the chain passes are exact"
    t = rec["trees"]
    assert t["passes"] == 4 and t["bitwise_passes"] == 0 and t["exact"] is False and t["top1"] is True
    assert t["max_k"] == 17 and t["max_abs_diff"] == pytest.approx(0.25)
    assert "not bitwise exact" in checks.describe_trees(rec) and "top-1 always equal" in checks.describe_trees(rec)
    flip = checks.check_model(lambda ids: TreeRowOff(3, _flip), V, plan)
    assert flip["trees"]["top1"] is False and "top-1 not always equal" in checks.describe_trees(flip)


# ---------------------------------------------------------------- the tally and the sentences, from hand-built checks


def _c(k: int, bitwise: bool, top1: bool, diff: float, kind: str = "chain") -> dict:
    return {"k": k, "context": 10, "bitwise": bitwise, "top1": top1, "max_abs_diff": diff, "kind": kind}


def test_the_tally_counts_each_check_once_by_its_own_fields():
    """Rule: a record's tally reads every check: exact = all bitwise, top1 = all top-1 (one False anywhere makes it
    False), bitwise_passes counts bitwise checks (not top-1 ones), the largest difference and pass length over all;
    tree checks are tallied apart and never in the chain's."""
    chain = [_c(2, True, True, 0.0), _c(9, False, False, 0.5), _c(5, False, True, 1e-6), _c(3, True, True, 0.0)]
    trees = [_c(17, False, True, 2.0, "tree"), _c(4, True, True, 0.0, "tree"), _c(8, False, True, 1e-7, "tree")]
    rec = checks.summarise([chain[0], trees[0], chain[1], chain[2], trees[1], chain[3], trees[2]])
    assert rec["exact"] is False and rec["top1"] is False, "a flipped top-1 in one check must show in the record"
    assert rec["passes"] == 4 and rec["bitwise_passes"] == 2 and rec["max_abs_diff"] == 0.5 and rec["max_k"] == 9
    assert rec["kinds"] == ["chain", "tree"]
    t = rec["trees"]
    assert t["exact"] is False and t["top1"] is True
    assert t["passes"] == 3 and t["bitwise_passes"] == 1 and t["max_abs_diff"] == 2.0 and t["max_k"] == 17
    top_only = checks.summarise([_c(2, False, True, 1e-6), _c(5, False, True, 1e-6)])
    assert top_only["exact"] is False and top_only["top1"] is True and top_only["bitwise_passes"] == 0
    assert top_only["trees"] is None and top_only["kinds"] == ["chain"]
    exact = checks.summarise([_c(2, True, True, 0.0), _c(5, True, True, 0.0)])
    assert exact["exact"] is True and exact["bitwise_passes"] == exact["passes"] == 2


def test_a_checks_kind_defaults_to_chain():
    """Rule: a check without a kind is a chain pass: tallied with the chain, listed as "chain"."""
    rec = checks.summarise([{k: v for k, v in _c(2, False, False, 0.1).items() if k != "kind"}])
    assert rec["passes"] == 1 and rec["top1"] is False and rec["trees"] is None and rec["kinds"] == ["chain"]


def _rec(exact: bool, top1: bool, bitwise: int, passes: int, diff: float, max_k: int = 65) -> dict:
    return {
        "exact": exact,
        "top1": top1,
        "passes": passes,
        "bitwise_passes": bitwise,
        "max_abs_diff": diff,
        "max_k": max_k,
    }


def test_the_sentence_follows_the_records_top1_and_counts():
    """Rule: what users read says "top-1 always equal" only when the record's top1 holds, "top-1 differed" when it
    does not, and carries the record's own counts and longest pass."""
    near = checks.describe(_rec(False, True, 1, 4, 6e-5))
    assert "top-1 always equal" in near and "1/4 passes equal" in near and "6e-05" in near
    off = checks.describe(_rec(False, False, 2, 4, 0.4))
    assert "top-1 differed" in off and "always" not in off and "0.4" in off
    exact = checks.describe(_rec(True, True, 3, 3, 0.0, 17))
    assert exact.startswith("exact: ") and "(3/3 passes checked)" in exact and "up to 17 tokens" in exact


def test_the_tree_sentence_follows_the_trees_top1_and_counts():
    """Rule: the trees' sentence says "top-1 always equal" only when every tree agreed on top-1 ("not always"
    otherwise), names the trees' own counts, and says exact only for an exact tally."""
    agree = checks.describe_trees({"trees": _rec(False, True, 1, 6, 0.25, 17)})
    assert agree.startswith("tree passes not bitwise exact") and "(1/6 trees equal" in agree
    assert "top-1 always equal" in agree and "not always" not in agree
    flip = checks.describe_trees({"trees": _rec(False, False, 1, 6, 0.25, 17)})
    assert "top-1 not always equal" in flip
    exact = checks.describe_trees({"trees": _rec(True, True, 6, 6, 0.0, 17)})
    assert exact.startswith("tree passes exact") and "(6/6 trees checked)" in exact
    assert checks.describe_trees({"trees": None}) == "" and checks.describe_trees(None) == ""
