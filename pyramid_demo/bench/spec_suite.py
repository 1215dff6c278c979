"""`bench --suite spec-bench`: Spec-Bench's questions through the bench's own loop (MT-bench's second turn after each
method's own first answer, through the chat template), and Spec-Bench's table (`spec_table`) in the report."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import spec_bench
from ..core.methods import DecodeConfig
from ..core.run import encode_prompt, prepare_prompt
from ..forward.lm import ModelTriplet
from . import report, spec_table
from .prompts import Prompt
from .variants import largest

SEED = 0  # the selection's: stated in the report, the same on every machine
COLUMNS = ["question_id", "task", "turn", "target_forwards"]  # what the suite adds to results.csv
Group = list[tuple[dict, list[int]]]  # one turn's rows and produced tokens, one per variant (`runner._run_prompt`)


@dataclass(frozen=True)
class Turn(Prompt):
    """One user turn of a Spec-Bench question: which question, which turn, and all the question's turns."""

    question: int = 0
    task: str = ""
    turn: int = 1
    turns: tuple[str, ...] = ()

    @property
    def n_turns(self) -> int:
        return len(self.turns)


def first_turn(q: spec_bench.Question) -> Turn:
    return Turn(q.turns[0], q.category, q.id, q.task, 1, q.turns)


def conversation_ids(tokenizer: Any, turns: Sequence[str], answers: Sequence[str], chat: bool = True) -> list[int]:
    """The prompt of turn len(answers) + 1: the user's turns with the model's own answers between, through the chat
    template; without one (or with --no-chat) joined by blank lines, tokenized as the bench tokenizes one prompt."""
    said = [x for i in range(len(answers) + 1) for x in (turns[i], *answers[i : i + 1])]  # user, assistant, … user
    if chat and getattr(tokenizer, "chat_template", None):
        messages = [{"role": ("user", "assistant")[j % 2], "content": x} for j, x in enumerate(said)]
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return [int(i) for i in (out["input_ids"] if hasattr(out, "keys") else out)]
    return encode_prompt(tokenizer, "\n\n".join(said), chat=False)


@dataclass
class Plan:
    """A suite run: the selected questions, how they were chosen, and what happened to their later turns."""

    questions: list[spec_bench.Question]
    tasks: tuple[str, ...]
    per_task: int | None
    check: DecodeConfig  # the largest budget and draft of the variants: a later turn's context is checked with it
    notes: list[str] = field(default_factory=list)

    @property
    def prompts(self) -> list[Prompt]:
        return [first_turn(q) for q in self.questions]

    def follower(
        self, triplet: ModelTriplet, chat: bool = True
    ) -> Callable[[Prompt, Group], tuple[Prompt, dict[str, list[int]]] | None]:
        """The bench's `follow`: after a turn ran, tag its rows with the question and turn, and give the next turn's
        prompt with each variant's own context (its earlier answers in it), or None when the question is done."""
        answers: dict[tuple[int, str], list[str]] = {}

        def follow(p: Prompt, group: Group) -> tuple[Prompt, dict[str, list[int]]] | None:
            assert isinstance(p, Turn)
            for row, _ in group:
                row.update(question_id=p.question, task=p.task, turn=p.turn)
                mine = answers.setdefault((p.question, row["variant"]), [])
                del mine[p.turn - 1 :]  # a repeat starts the conversation again
                mine.append(row["text"].strip())  # Spec-Bench's answer: special tokens dropped, stripped
            if p.turn >= p.n_turns:
                return None
            ids: dict[str, list[int]] = {}  # each variant's own conversation so far
            try:
                for row, _ in group:
                    turns = conversation_ids(triplet.tokenizer, p.turns, answers[(p.question, row["variant"])], chat)
                    ids[row["variant"]] = prepare_prompt(triplet, turns, self.check, chat)
            except ValueError as e:  # a conversation beyond the models' context: every variant stops at this turn
                self.notes.append(f"question {p.question}: turns after {p.turn} not run ({e})")
                print(f"note: {self.notes[-1]}", file=sys.stderr)
                return None
            return dataclasses.replace(p, text=p.turns[p.turn], turn=p.turn + 1), ids

        return follow

    def finish(self, result: dict, out: str | Path) -> list[Path]:
        """Spec-Bench's table into `result["suite"]` (results.json, report.html, the terminal) and spec_bench.csv."""
        records, pos = spec_table.table(result["runs"]), spec_table.positions(result["runs"])
        decode = spec_table.table(result["runs"], "decode_s")
        ran = {r.get("question_id") for r in result["runs"]}
        if missing := [q.id for q in self.questions if q.id not in ran]:
            self.notes.append(
                f"selected but not run (longer than the models' context, or the run stopped early): question"
                f"{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
            )
        ids = {t: [q.id for q in self.questions if q.task == t] for t in self.tasks}  # how chosen, and which
        how = f"{self.per_task} per task" if self.per_task else "all 80 per task"
        listed = "; ".join(f"{t} {', '.join(map(str, qs))}" for t, qs in ids.items())
        text = f"Spec-Bench, seed {SEED}, {how} (spec_bench.select) — question ids: {listed}"
        result["suite"] = dict(
            selection=dict(
                suite="spec-bench", seed=SEED, per_task=self.per_task, tasks=list(self.tasks), question_ids=ids
            ),
            selection_text=text,
            table=records,
            decode_table=decode,
            positions=pos,
            notes=list(self.notes),
            footnote=spec_table.FOOTNOTE,
            position_note=spec_table.POSITION_NOTE,
            markdown=spec_table.markdown(records, pos, text, decode) + "".join(f"\n\nnote: {n}" for n in self.notes),
        )
        Path(out).mkdir(parents=True, exist_ok=True)
        return [report.write_csv(Path(out) / "spec_bench.csv", *spec_table.csv_rows(records))]


def plan(args: argparse.Namespace, variants: Sequence[Any]) -> Plan | None:
    """The suite `args` ask for (None without --suite), or a ValueError saying which option does not fit it."""
    if not args.suite:
        if args.per_task is not None or args.tasks:
            raise ValueError("--per-task and --tasks choose Spec-Bench's questions: add --suite spec-bench")
        return None
    given = {"--prompts": args.prompts != "builtin", "--limit": args.limit is not None, "--dataset": args.dataset}
    if clash := [name for name, yes in given.items() if yes]:
        raise ValueError(
            f"--suite spec-bench brings its own questions: drop {' and '.join(clash)} "
            "(choose them with --tasks and --per-task)"
        )
    if any(v.cfg.temperature > 0 for v in variants):
        raise ValueError("Spec-Bench is greedy: --suite spec-bench runs at temperature 0; drop --temperature")
    if not any(v.method == "ar" and v.kind == "engine" for v in variants):
        raise ValueError("Spec-Bench's speed-ups are over plain decoding: include ar in --methods")
    if args.per_task is not None and args.per_task < 1:
        raise ValueError(f"--per-task must be at least 1, got {args.per_task}")
    tasks = spec_bench.parse_tasks(args.tasks)
    return Plan(spec_bench.select(args.per_task, tasks, SEED), tasks, args.per_task, largest(variants))
