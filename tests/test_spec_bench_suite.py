"""`bench --suite spec-bench`: Spec-Bench's arithmetic from hand-built runs, MT-bench's second turn as a conversation,
the seeded selection, per-position acceptance, the hf_prompt_lookup peer, and one short run on tiny-random."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from pyramid_demo import spec_bench
from pyramid_demo.bench import peers, spec_suite, spec_table
from pyramid_demo.cli import main as cli_main
from pyramid_demo.core.methods import DecodeConfig
from pyramid_demo.core.trace import StageRound, Step, TokenRec

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: more threads only contend


@pytest.fixture(scope="module")
def triplet():
    from pyramid_demo.models.tiny import tiny_random_triplet

    return tiny_random_triplet()


# ---------------------------------------------------------------- (a) Spec-Bench's arithmetic
def _row(variant, qid, task, turn, tokens, wall, passes=None, forwards=None, kind="engine", repeat=0) -> dict:
    return dict(
        variant=variant,
        method=variant,
        kind=kind,
        repeat=repeat,
        question_id=qid,
        task=task,
        turn=turn,
        n_new_tokens=tokens,
        wall_s=wall,
        target_passes=passes if kind == "engine" else None,
        target_forwards=forwards,
    )


def _hand_built() -> list[dict]:
    """AR, SD and two peers on MT-bench question 81 (two turns) and QA questions 321, 322."""
    rows = [
        _row("ar", 81, "mt_bench", 1, 10, 2.0, passes=10),  # 40 tokens in 3 s over the two turns: 13.33 tok/s
        _row("ar", 81, "mt_bench", 2, 30, 1.0, passes=30),
        _row("ar", 321, "qa", 1, 20, 1.0, passes=20),  # 20 tok/s
        _row("ar", 322, "qa", 1, 20, 4.0, passes=20),  # 5 tok/s
        _row("sd", 81, "mt_bench", 1, 10, 1.0, passes=5),  # 40 tokens in 1.5 s: 26.67 tok/s
        _row("sd", 81, "mt_bench", 2, 30, 0.5, passes=10),
        _row("sd", 321, "qa", 1, 20, 0.5, passes=8),  # 40 tok/s
        _row("sd", 322, "qa", 1, 20, 1.0, passes=7),  # 20 tok/s
    ]
    for v, forwards in (("hf_prompt_lookup", (20, 10, 10, 10)), ("hf_assisted", (None, None, None, None))):
        walls = (1.0, 1.0, 1.0, 1.0)  # 20 tok/s on 81, 20 and 20 on QA
        keys = ((81, "mt_bench", 1, 10), (81, "mt_bench", 2, 30), (321, "qa", 1, 20), (322, "qa", 1, 20))
        for (qid, task, turn, n), wall, f in zip(keys, walls, forwards):
            rows.append(
                _row(v, qid, task, turn, n, wall * (2 if turn == 1 and qid == 81 else 1), forwards=f, kind="peer")
            )
    return rows


def test_speedup_is_the_mean_of_per_question_speeds_with_turns_summed() -> None:
    """Rule (Spec-Bench's speed.py): a question's tokens and wall time are each summed over its turns; a task's speed
    is the mean over its questions of tokens/s; the speed-up is that mean over AR's on the same questions. Neither
    the mean of per-turn speeds nor pooled tokens ÷ pooled time gives these figures."""
    by = {r["variant"]: r for r in spec_table.table(_hand_built())}
    ar, sd = by["ar"]["tasks"], by["sd"]["tasks"]
    assert ar["mt_bench"]["tokens_per_s"] == pytest.approx(40 / 3)  # not (10/2 + 30/1) / 2 = 17.5
    assert ar["qa"]["tokens_per_s"] == pytest.approx((20 + 5) / 2)  # not 40 tokens / 5 s = 8
    assert sd["mt_bench"]["speedup"] == pytest.approx((40 / 1.5) / (40 / 3))  # 2.0
    assert sd["qa"]["speedup"] == pytest.approx(((40 + 20) / 2) / 12.5)  # 2.4
    assert ar["qa"]["speedup"] == pytest.approx(1.0) and ar["qa"]["questions"] == 2
    peer = by["hf_prompt_lookup"]["tasks"]  # 81: 40 tokens in 3 s; QA: 20 tok/s each
    assert peer["mt_bench"]["speedup"] == pytest.approx((40 / 3) / (40 / 3))
    assert peer["qa"]["speedup"] == pytest.approx(20 / 12.5)


def test_overall_pools_every_question_not_the_task_columns() -> None:
    """Rule: Overall = mean tokens/s over all selected questions pooled ÷ AR's over the same questions (Spec-Bench's
    "overall" task), not a mean of the task columns."""
    by = {r["variant"]: r for r in spec_table.table(_hand_built())}
    ar_mean = (40 / 3 + 20 + 5) / 3
    assert by["sd"]["overall"] == pytest.approx((40 / 1.5 + 40 + 20) / 3 / ar_mean)  # 2.26, not (2.0 + 2.4) / 2
    assert by["sd"]["overall_tokens_per_s"] == pytest.approx((40 / 1.5 + 40 + 20) / 3)
    assert by["ar"]["overall"] == pytest.approx(1.0) and by["sd"]["questions"] == 3


def test_mean_accepted_tokens_is_tokens_per_target_forward_pooled() -> None:
    """Rule: #Mean Accepted Tokens = tokens written ÷ target forwards over all the method's forwards in the suite
    (1.00 for plain decoding); a peer's counted forwards alike; a peer with none counted shows –."""
    by = {r["variant"]: r for r in spec_table.table(_hand_built())}
    assert by["ar"]["mean_accepted_tokens"] == pytest.approx(1.0)
    assert by["sd"]["mean_accepted_tokens"] == pytest.approx(80 / 30)  # not the mean of per-run ratios (2.57)
    assert by["hf_prompt_lookup"]["mean_accepted_tokens"] == pytest.approx(80 / 50)
    assert by["hf_assisted"]["mean_accepted_tokens"] is None
    md = spec_table.markdown(list(by.values()), [])
    head = md.splitlines()[0]
    assert head == "| Method | Multi-turn Conversation | Question Answering | #Mean Accepted Tokens | Overall |"
    assert "| sd | 2.00x | 2.40x | 2.67 | 2.26x |" in md and "| hf_assisted | " in md
    assert md.splitlines()[5].split(" | ")[-2] == "–"  # hf_assisted's unknown #MAT


def test_the_decode_only_table_times_the_engines_decode_and_leaves_out_peers() -> None:
    """Rule: the decode-only table is the same arithmetic over each turn's decode seconds (prefill excluded), over
    the engine's rows only: a peer's wall time holds its prefill, so it has no row there."""
    rows = [{**r, "decode_s": r["wall_s"] / 2 if r["variant"] == "sd" else r["wall_s"]} for r in _hand_built()]
    by = {r["variant"]: r for r in spec_table.table(rows, "decode_s")}
    assert set(by) == {"ar", "sd"}
    assert by["sd"]["tasks"]["qa"]["speedup"] == pytest.approx(2 * 2.4)  # twice the wall-time figure
    assert by["ar"]["tasks"]["qa"]["tokens_per_s"] == pytest.approx(12.5)
    md = spec_table.markdown(list(by.values()), [], decode=list(by.values()))
    assert spec_table.DECODE_NOTE in md and md.count("| Method |") == 2


def test_only_questions_every_method_finished_are_compared() -> None:
    """Rule: a speed-up compares the same questions: a sample some method lacks a turn of (a run cut short) counts
    for no method; a repeat is a further sample of its question."""
    rows = _hand_built()
    rows.append(_row("ar", 82, "mt_bench", 1, 10, 0.1, passes=10))
    rows.append(_row("sd", 82, "mt_bench", 1, 10, 0.1, passes=10))  # nobody ran question 82's second turn but AR:
    rows.append(_row("ar", 82, "mt_bench", 2, 10, 0.1, passes=10))
    by = {r["variant"]: r for r in spec_table.table(rows)}
    assert by["sd"]["tasks"]["mt_bench"]["questions"] == 1 and by["ar"]["tasks"]["mt_bench"]["questions"] == 1
    assert by["sd"]["tasks"]["mt_bench"]["speedup"] == pytest.approx(2.0)
    again = [dict(r, repeat=1, wall_s=r["wall_s"] * 2) for r in _hand_built()]  # a slower repeat: half the speed
    by2 = {r["variant"]: r for r in spec_table.table(_hand_built() + again)}
    assert by2["ar"]["tasks"]["qa"]["questions"] == 4
    assert by2["ar"]["tasks"]["qa"]["tokens_per_s"] == pytest.approx((20 + 5 + 10 + 2.5) / 4)


def test_a_selected_question_that_did_not_run_is_named(tmp_path: Path) -> None:
    """Rule: the report states the selection (seed, per task, ids) and names every selected question that has no
    runs (a prompt beyond the models' context is skipped by the bench), so a table over fewer questions says so."""
    qs = [q for q in spec_bench.questions() if q.id in (81, 321, 322, 323)]
    plan = spec_suite.Plan(qs, ("mt_bench", "qa"), 3, DecodeConfig())
    result = {"runs": _hand_built()}
    (path,) = plan.finish(result, tmp_path)
    suite = result["suite"]
    assert suite["selection"] == dict(
        suite="spec-bench",
        seed=0,
        per_task=3,
        tasks=["mt_bench", "qa"],
        question_ids={"mt_bench": [81], "qa": [321, 322, 323]},
    )
    assert suite["notes"] == [
        "selected but not run (longer than the models' context, or the run stopped early): question 323"
    ]
    assert "question 323" in suite["markdown"] and "seed 0, 3 per task" in suite["markdown"]
    with path.open() as f:
        got = {r["variant"]: r for r in csv.DictReader(f)}
    assert float(got["sd"]["qa_speedup"]) == pytest.approx(2.4) and got["hf_assisted"]["mean_accepted_tokens"] == ""


# ---------------------------------------------------------------- (b) the second turn's context
class RecordingTokenizer:
    """A tokenizer with a chat template that records the messages it was given."""

    chat_template = "recorded"

    def __init__(self) -> None:
        self.calls: list[tuple[list[dict], bool]] = []

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        self.calls.append((messages, add_generation_prompt))
        return list(range(len(self.calls) * 10, len(self.calls) * 10 + 5))


def test_second_turn_is_a_conversation_after_each_methods_own_answer(triplet) -> None:
    """Rule: MT-bench's second turn runs through the chat template on [user turn 1, assistant: the method's own first
    answer (special tokens dropped, stripped, as Spec-Bench keeps it), user turn 2], each variant with its own."""
    tok = RecordingTokenizer()
    q = spec_bench.Question(81, "writing", ("first question", "second question"))
    plan = spec_suite.Plan([q], ("mt_bench",), 1, DecodeConfig(max_new_tokens=8))
    follow = plan.follower(dataclasses.replace(triplet, tokenizer=tok), chat=True)
    group = [({"variant": "ar", "text": " answer of ar \n"}, [1]), ({"variant": "sd", "text": "answer of sd"}, [2])]
    first = spec_suite.first_turn(q)
    nxt = follow(first, group)
    assert nxt is not None
    p, ids = nxt
    assert p.text == "second question" and p.turn == 2 and p.question == 81
    assert [m for m, _ in tok.calls] == [
        [
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "second question"},
        ]
        for answer in ("answer of ar", "answer of sd")
    ]
    assert all(gen for _, gen in tok.calls)  # the assistant's turn is opened
    assert ids == {"ar": [10, 11, 12, 13, 14], "sd": [20, 21, 22, 23, 24]}  # each variant's own conversation
    assert [r["turn"] for r, _ in group] == [1, 1] and group[0][0]["question_id"] == 81
    assert follow(p, [({"variant": "ar", "text": "x"}, [3])]) is None  # the last turn ends the question


def test_second_turn_through_a_real_template_and_without_one() -> None:
    """Rule: with a real tokenizer's template the first answer sits between the two user turns in the prompt's ids;
    without a template (or --no-chat) the same text joined by blank lines, tokenized as one prompt is."""
    from pyramid_demo.core.run import encode_prompt
    from pyramid_demo.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    turns, answer = ("what is the water", "tell me more"), "the sky is blue"
    plain = spec_suite.conversation_ids(tok, turns, [answer], chat=True)  # tiny's tokenizer has no template
    assert plain == encode_prompt(tok, "what is the water\n\nthe sky is blue\n\ntell me more", chat=False)
    tok.chat_template = (
        "{{ messages | map(attribute='content') | join('. ') }}.{% if add_generation_prompt %}!{% endif %}"
    )
    text = tok.decode(spec_suite.conversation_ids(tok, turns, [answer], chat=True))
    assert text.index("what is the water") < text.index("the sky is blue") < text.index("tell me more")
    assert text.rstrip().endswith("!")
    assert "sky" not in tok.decode(spec_suite.conversation_ids(tok, turns, [], chat=True))  # turn 1: no answer yet


# ---------------------------------------------------------------- (c) the selection
def test_selection_is_seeded_stable_and_spreads_over_mt_benchs_categories() -> None:
    """Rule: `select` draws the same questions on every call and machine (seeded, in file order), a different seed
    draws others, per_task ≥ 8 covers MT-bench's eight categories, None takes all 80 of each task."""
    a = spec_bench.select(3, ("qa", "mt_bench"))
    assert [q.id for q in a] == [q.id for q in spec_bench.select(3, ("qa", "mt_bench"))]
    assert [q.id for q in spec_bench.select(1, ("qa", "mt_bench"))] == [374, 84]  # the report's stated ids
    assert [q.task for q in a] == ["qa"] * 3 + ["mt_bench"] * 3
    assert [q.id for q in spec_bench.select(3, ("qa",), seed=1)] != [q.id for q in a[:3]]
    for n in (8, 9, 16):
        mt = spec_bench.select(n, ("mt_bench",))
        assert len(mt) == n and {q.category for q in mt} == set(spec_bench.MT_BENCH)
        assert all(len(q.turns) == 2 for q in mt)
    assert len(spec_bench.select(None, ("rag",))) == 80


def test_unknown_tasks_are_refused_by_name() -> None:
    """Rule: --tasks takes Spec-Bench's own names; an unknown one is refused with the choices listed."""
    assert spec_bench.parse_tasks("summarization, rag") == ("summarization", "rag")
    with pytest.raises(ValueError, match=r"unknown Spec-Bench task\(s\) 'poetry': choose from mt_bench, translation"):
        spec_bench.parse_tasks("qa,poetry")


# ---------------------------------------------------------------- (d) per-position acceptance
def _round(n_proposed: int, n_accepted: int, parents: list[int] | None = None) -> StageRound:
    toks = [TokenRec(5, "draft", "accepted" if i < n_accepted else "rejected") for i in range(n_proposed)]
    return StageRound(
        "target", "draft", "target", "greedy", toks + [TokenRec(6, "target", "bonus")], n_accepted, parents=parents
    )


def _step(i: int, rnd: StageRound | None) -> Step:
    return Step(i, [], rnd, [5], ["draft"], 0.0, 0.1 * (i + 1))


def test_per_position_acceptance_counts_rounds_that_proposed_that_far() -> None:
    """Rule (vLLM, llama.cpp): at position i, rounds whose i-th proposed token was accepted ÷ rounds that proposed at
    least i tokens (a tree: a node at depth i, the accepted path reaching it); pooled over runs by counts, so a
    round cut short by the budget does not lower the later positions."""
    run1 = [_step(0, _round(4, 2)), _step(1, _round(4, 4)), _step(2, _round(2, 0)), _step(3, None)]
    run2 = [_step(0, _round(4, 1, parents=[-1, -1, 0, 2]))]  # a tree of depth 3 whose path took node 0 only
    c1, c2 = spec_table.position_counts(run1), spec_table.position_counts(run2)
    assert c1 == {"positions_target": [3, 3, 2, 2], "positions_target_accepted": [2, 2, 1, 1]}
    assert c2 == {"positions_target": [1, 1, 1], "positions_target_accepted": [1, 0, 0]}
    rows = [
        dict(variant="sd", method="sd", kind="engine", repeat=0, question_id=q, task="qa", turn=1, **c)
        for q, c in ((1, c1), (2, c2))
    ]
    (pos,) = spec_table.positions(rows)
    assert pos["rounds"] == [4, 4, 3, 2] and pos["accepted"] == [3, 2, 1, 1]
    assert pos["rates"] == pytest.approx([3 / 4, 2 / 4, 1 / 3, 1 / 2])  # not ÷ every round (5): 0.6, 0.4, 0.2, 0.2
    assert "| sd | 0.75 | 0.50 | 0.33 | 0.50 |" in spec_table.position_markdown([pos])


# ---------------------------------------------------------------- hf_prompt_lookup
def test_prompt_lookup_peer_writes_plain_greedy_text(triplet, monkeypatch) -> None:
    """Rule: transformers' prompt lookup on the target is lossless at greedy: the same tokens as plain `generate()`,
    with proposals copied from the context verified on the way; its target forwards are counted, one per
    verification round (plain decoding: one per token); it is listed among the peers."""
    from transformers.generation import candidate_generator as cg

    proposed: list[int] = []
    real = cg.PromptLookupCandidateGenerator.get_candidates

    def spy(self, input_ids, **kw):
        out = real(self, input_ids, **kw)
        proposed.append(out[0].shape[1] - input_ids.shape[1])
        return out

    monkeypatch.setattr(cg.PromptLookupCandidateGenerator, "get_candidates", spy)
    ids = [int(t) for t in triplet.tokenizer("one two one two one two one two")["input_ids"]]
    cfg = DecodeConfig(max_new_tokens=48)
    plain = peers.hf_generate(triplet, ids, cfg, "hf_generate")
    assert not proposed and plain.target_forwards == len(plain.token_ids) == 48
    pld = peers.hf_generate(triplet, ids, cfg, "hf_prompt_lookup", (10, 3))
    assert pld.token_ids == plain.token_ids
    assert max(proposed) > 0 and pld.target_forwards == len(proposed)  # lookups made, one target forward per round
    assert "hf_prompt_lookup" in peers.PEERS and peers.PEER_ROLES["hf_prompt_lookup"] == ("target",)


# ---------------------------------------------------------------- (e) bad input, and one short run
@pytest.mark.parametrize(
    "extra, message",
    [
        (["--suite", "spec-bench", "--tasks", "qa,poetry"], "unknown Spec-Bench task(s) 'poetry'"),
        (["--suite", "spec-bench", "--per-task", "0"], "--per-task must be at least 1"),
        (["--suite", "spec-bench", "--prompts", "mine.jsonl"], "drop --prompts"),
        (["--suite", "spec-bench", "--temperature", "0.7"], "Spec-Bench is greedy"),
        (["--suite", "spec-bench", "--methods", "sd"], "include ar in --methods"),
        (["--per-task", "2"], "add --suite spec-bench"),
        (["--pld-tokens", "0"], "--pld-tokens and --pld-ngram must be at least 1"),
    ],
)
def test_bad_suite_options_are_one_clear_line(extra: list[str], message: str, capsys) -> None:
    """Rule: an option the suite cannot take exits 2 with one `error:` line naming it, before any model loads."""
    assert cli_main(["bench", "--models", "tiny-random", "--no-progress", *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


def test_suite_on_tiny_random_writes_spec_benchs_table(tmp_path: Path, capsys) -> None:
    """Rule: `bench --suite spec-bench` prints and writes Spec-Bench's table: a row per method and peer
    (hf_prompt_lookup among the default peers), a column per task asked, #Mean Accepted Tokens, Overall; MT-bench's
    question runs two turns; results.json carries the suite and its selection, spec_bench.csv and report.html it."""
    out = tmp_path / "s"
    argv = ["bench", "--suite", "spec-bench", "--models", "tiny-random", "--per-task", "1", "--tasks", "qa,mt_bench"]
    assert cli_main([*argv, "--max-new-tokens", "6", "--shape", "chain", "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    head = "| Method | Multi-turn Conversation | Question Answering | #Mean Accepted Tokens | Overall |"
    assert head in printed and "seed 0, 1 per task" in printed and "qa 374; mt_bench 84" in printed
    variants = ["ar", "sd", "fsd", "psd_a", "psd_f", "hf_generate", "hf_assisted", "hf_prompt_lookup"]
    table = printed[printed.index(head) :].split("\n\n")[0].splitlines()[2:]
    assert [line.split(" | ")[0].strip("| ") for line in table] == variants
    assert table[0] == "| ar | 1.00x | 1.00x | 1.00 | 1.00x |"
    data = json.loads((out / "results.json").read_text())
    suite = data["suite"]
    assert suite["selection"]["question_ids"] == {"qa": [374], "mt_bench": [84]}
    assert [r["variant"] for r in suite["table"]] == variants
    assert all(r["overall"] > 0 for r in suite["table"])
    assert {p["variant"] for p in suite["positions"]} >= {"sd", "fsd", "psd_a", "psd_f"}
    turns = sorted((r["question_id"], r["turn"]) for r in data["runs"] if r["variant"] == "sd")
    assert turns == [(84, 1), (84, 2), (374, 1)]
    with (out / "spec_bench.csv").open() as f:
        assert [r["variant"] for r in csv.DictReader(f)] == variants
    with (out / "results.csv").open() as f:
        assert {"question_id", "task", "turn"} <= set(csv.DictReader(f).fieldnames or [])
    page = (out / "report.html").read_text()
    assert "<h2>Spec-Bench</h2>" in page and "speed-up over AR per task" in page and "Per-position acceptance" in page
