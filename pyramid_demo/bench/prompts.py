"""The benchmark's prompts: a built-in, varied set, or a user's JSONL ({"prompt", optional "category"} lines)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str = "user"


_BUILTIN: dict[str, list[str]] = {
    "explanation": [
        "Explain why the sky looks blue during the day and red at sunset.",
        "Explain in simple terms how a refrigerator keeps food cold.",
        "What is the difference between weather and climate? Explain briefly.",
        "Explain how vaccines help the body fight infections.",
    ],
    "code": [
        "Write a Python function that checks whether a string is a palindrome.",
        "Write a Python function that returns the n-th Fibonacci number using a loop.",
        "Show how to read a CSV file in Python and print the first five rows.",
        "Write a JavaScript function that removes duplicate values from an array.",
    ],
    "story": [
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Tell a bedtime story about a small robot who is afraid of the dark.",
        "Write the opening paragraph of a mystery set in a snowy mountain village.",
        "Write a short fable about a patient tortoise and a clever crow.",
    ],
    "list": [
        "List five tips for getting better sleep.",
        "Give me a list of seven healthy snacks to take on a long hike.",
        "List the planets of the solar system in order from the Sun.",
        "List six things to check before going on a long car trip.",
    ],
    "qa": [
        "What is the capital of Australia, and why is it not Sydney?",
        "How many legs does a spider have, and how is that different from insects?",
        "Who wrote the play Romeo and Juliet, and roughly when?",
        "What is photosynthesis and why does it matter for life on Earth?",
    ],
}


def read_rows(path: str | Path, what: str, parse: Callable[[Any], Any]) -> list:
    """`parse` of each line of a JSONL file (blank and # lines skipped); a clear ValueError naming a bad line."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{what} file not found: {p}")
    out = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            out.append(parse(json.loads(line)))
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}:{n}: not valid JSON ({e.msg})") from None
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{p}:{n}: not a {what} row ({e})") from None
    if not out:
        raise ValueError(f"{p}: no {what} rows found")
    return out


def _prompt(obj: Any) -> Prompt:
    text = obj.get("prompt") if isinstance(obj, dict) else None
    if not isinstance(text, str) or not text.strip():
        raise ValueError('each line must be an object with a non-empty "prompt" string')
    return Prompt(text, str(obj.get("category", "user")))


def load_prompts(spec: str, limit: int | None = None) -> list[Prompt]:
    """`builtin` (round-robin over categories) or a JSONL path; the first `limit` prompts."""
    if spec == "builtin":
        by_cat = [[Prompt(t, c) for t in texts] for c, texts in _BUILTIN.items()]
        prompts = [row[i] for i in range(max(map(len, by_cat))) for row in by_cat if i < len(row)]
    else:
        prompts = read_rows(spec, "prompt", _prompt)
    return prompts[:limit] if limit else prompts
