"""CommonsenseQA as in the FSD and PyramidSD papers: a 5-shot chain-of-thought prompt, the answer read back."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .prompts import read_rows

LABELS = "ABCDE"


@dataclass(frozen=True)
class Question:
    stem: str
    labels: tuple[str, ...]
    choices: tuple[str, ...]
    answer: str  # the correct label, "" if unknown


# Five worked examples in the FSD reference's style (CSQA training-set questions, reasoning written for this project)
SHOTS: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    (
        "Sammy wanted to go to where the people were. Where might he go?",
        ("race track", "populated areas", "the desert", "apartment", "roadblock"),
        "He wants crowds. A race track is busy only on race days, an apartment holds a few people, "
        "a roadblock and the desert have almost nobody. Populated areas are full of people by definition.",
        "B",
    ),
    (
        "Google Maps and other highway and street GPS services have replaced what?",
        ("united states", "mexico", "countryside", "atlas", "oceans"),
        "GPS services give maps and directions, the job a printed road atlas used to do. "
        "Countries, the countryside and oceans are places, not tools.",
        "D",
    ),
    (
        "The fox walked from the city into the forest, what was it looking for?",
        ("pretty flowers", "hen house", "natural habitat", "storybook", "dense forest"),
        "A wild fox leaving the city for the forest is going back to where it naturally lives, "
        "finds food and shelter. The other options are too narrow or make no sense for a fox.",
        "C",
    ),
    (
        "What home entertainment equipment requires cable?",
        ("radio shack", "substation", "cabinet", "television", "desk"),
        "Cable service is used to watch channels on a television. A radio shack is a shop, a "
        "substation is part of the power grid, and cabinets and desks are furniture.",
        "D",
    ),
    (
        "Where do you put your grapes just before checking out?",
        ("mouth", "grocery cart", "super market", "fruit basket", "fruit market"),
        "Just before checking out at a shop you collect what you are buying in your grocery cart. "
        "Eating them or leaving them in a basket or market does not fit checking out.",
        "B",
    ),
)

INSTRUCTION = (
    "You will be given a multiple-choice question that needs common-sense reasoning. Think "
    "about the situation and every option, explain your reasoning briefly, and end with "
    "'Therefore, the answer is X.' where X is the letter of the best option. Follow the examples."
)


def _choices_line(labels: tuple[str, ...], choices: tuple[str, ...]) -> str:
    return ", ".join(f"{lab}) {c}" for lab, c in zip(labels, choices))


def format_prompt(q: Question) -> str:
    """The 5-shot chain-of-thought prompt for one question (sent as the user's message)."""
    parts = [INSTRUCTION, ""]
    for i, (stem, choices, why, ans) in enumerate(SHOTS, 1):
        parts += [
            f"Example {i}:",
            f"Question: {stem}",
            f"Choices: {_choices_line(tuple(LABELS), choices)}",
            f"Answer: {why} Therefore, the answer is {ans}.",
            "",
        ]
    parts += [f"Question: {q.stem}", f"Choices: {_choices_line(q.labels, q.choices)}", "Answer:"]
    return "\n".join(parts)


_ANSWER = re.compile(r"(?i:answer\s+is)\s*[:\-]?\s*\(?\s*([A-E])(?=\)|\.|,|:|\s|$)")


def extract_answer(text: str) -> str | None:
    """The letter in the last "the answer is X" of a generated text, or None."""
    found = _ANSWER.findall(text)
    return found[-1] if found else None


def parse_row(obj: dict) -> Question:
    """One CSQA row in either layout (original release or Hugging Face)."""
    q = obj.get("question")
    if isinstance(q, dict):  # original release
        stem = q.get("stem", "")
        labels = tuple(str(c["label"]) for c in q.get("choices", []))
        choices = tuple(str(c["text"]) for c in q.get("choices", []))
    else:  # Hugging Face tau/commonsense_qa
        stem = q or ""
        ch = obj.get("choices") or {}
        labels, choices = tuple(map(str, ch.get("label", []))), tuple(map(str, ch.get("text", [])))
    if not stem or not choices or len(labels) != len(choices):
        raise ValueError("a CSQA row needs a question stem and labelled choices")
    return Question(stem, labels, choices, str(obj.get("answerKey", "") or ""))


def load_questions(path: str | None = None, limit: int | None = None) -> list[Question]:
    """Questions from `path`, or from the Hub (`tau/commonsense_qa`) when no file is given."""
    if path:
        qs = read_rows(path, "CSQA", parse_row)
    else:
        try:
            from datasets import load_dataset  # optional dependency
        except ImportError:
            raise ValueError(
                "--dataset csqa needs --dataset-file FILE.jsonl, or the `datasets` "
                "package and Hub access (pip install datasets)"
            ) from None
        try:
            rows = load_dataset("tau/commonsense_qa", split="validation")
        except Exception as e:  # offline, no cache, Hub error
            raise ValueError(
                f"could not load tau/commonsense_qa from the Hub ({type(e).__name__}: {e}); "
                "pass --dataset-file with a local CSQA JSONL instead"
            ) from None
        qs = [parse_row(dict(r)) for r in rows]
    return qs[:limit] if limit else qs
