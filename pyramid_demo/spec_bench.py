"""Spec-Bench's questions (`assets/spec_bench/`, Apache-2.0): its six tasks and a seeded selection per task."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "assets" / "spec_bench" / "question.jsonl"

# the multi-turn conversation task is MT-bench's eight categories; the other tasks are one category each
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
TITLES = {
    "mt_bench": "Multi-turn Conversation",
    "translation": "Translation",
    "summarization": "Summarization",
    "qa": "Question Answering",
    "math_reasoning": "Mathematical Reasoning",
    "rag": "Retrieval-aug. Generation",
}


@dataclass(frozen=True)
class Question:
    id: int
    category: str  # Spec-Bench's own (an MT-bench category, or the task's name)
    turns: tuple[str, ...]  # the user's turns: two in MT-bench, one elsewhere

    @property
    def task(self) -> str:
        return "mt_bench" if self.category in MT_BENCH else self.category


@cache
def questions() -> tuple[Question, ...]:
    """All 480 questions, in the file's order."""
    rows = [json.loads(line) for line in SOURCE.read_text(encoding="utf-8").splitlines() if line.strip()]
    return tuple(Question(int(r["question_id"]), str(r["category"]), tuple(r["turns"])) for r in rows)


@cache
def _by_text() -> dict[str, Question]:
    """First turn, stripped → question, built once (the 480 first turns are unique)."""
    return {q.turns[0].strip(): q for q in questions()}


@cache
def question(qid: int) -> Question:
    """The question numbered `qid` (a KeyError if Spec-Bench has none): the page's examples name theirs by id."""
    return {q.id: q for q in questions()}[qid]


def find(text: str | None) -> Question | None:
    """The question whose first turn is `text`, surrounding whitespace ignored, else None (the page names its task)."""
    return _by_text().get((text or "").strip())


def parse_tasks(text: str | None) -> tuple[str, ...]:
    """Task names from a comma-separated list (None or "all": every task), checked; a clear ValueError otherwise."""
    if not text or text.strip() == "all":
        return TASKS
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [t for t in names if t not in TASKS]
    if bad or not names:
        raise ValueError(f"unknown Spec-Bench task(s) {', '.join(bad) or text!r}: choose from {', '.join(TASKS)}")
    return names


def select(per_task: int | None, tasks: tuple[str, ...] = TASKS, seed: int = 0) -> list[Question]:
    """`per_task` questions of each task (None: all 80), a seeded draw kept in file order: the same on every machine.
    MT-bench's draw is spread over its eight categories in turn, so 8 or more cover every category."""
    out: list[Question] = []
    for task in tasks:
        pool = [q for q in questions() if q.task == task]
        if per_task is None or per_task >= len(pool):
            out += pool
            continue
        rng = random.Random(f"{seed}:{task}")
        if task == "mt_bench":
            by_cat = [rng.sample([q for q in pool if q.category == c], 10) for c in MT_BENCH]
            picked = [by_cat[i % 8][i // 8] for i in range(per_task)]
        else:
            picked = rng.sample(pool, per_task)
        out += sorted(picked, key=lambda q: q.id)
    return out
