"""A visitor's races (the page's gr.State), mutated in place: Stop and Clear reach the running race's own object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.methods import lanes
from ..core.trace import RunResult


@dataclass
class Race:
    """One race: every method on one prompt with one family and one configuration."""

    n: int
    preset: str
    models: list[str]
    prompt: str
    config: dict[str, Any]
    lanes: tuple[str, ...] = tuple(lane.key for lane in lanes())  # its lanes' keys (`methods.LANES`), in order
    results: dict[str, RunResult] = field(default_factory=dict)  # lane key -> its median run (what every view reads)
    vocab: dict[int, str] = field(default_factory=dict)  # token id -> text, for the inspector (no tokenizer)
    stopped: bool = False  # stopped by the user before every method ran
    note: str = ""  # shown above the lanes (family, budget cut)
    profile: dict | None = None  # the cost profile taken before the clocks started
    setup: str = ""  # the one-time costs (load, warm-up, profile), shown under the finished race's lanes
    repeats: list[dict[str, RunResult]] = field(default_factory=list)  # each repeat: lane key -> its finished run
    machine: str = ""  # the CPU the lanes were timed on, named under the replay
    exact_note: str = ""  # whether lossless lanes must write AR's text here: shown with the results, not above


@dataclass
class Session:
    """A visitor's races, oldest first, and the flags of the race that runs now."""

    races: list[Race] = field(default_factory=list)
    next: int = 1  # the next race's number
    busy: bool = False  # a race is running
    stop: bool = False  # Stop (or Clear) was asked for the running race
    budget_note: str = ""  # a ZeroGPU cut of max_new_tokens, shown with the next race
    exports: Any = None  # a TemporaryDirectory for this visitor's downloads, made at the first export

    @property
    def latest(self) -> Race | None:
        return self.races[-1] if self.races else None

    def find(self, n: Any) -> Race | None:
        """The race numbered `n` (as the dropdown sends it), else the latest."""
        return next((r for r in self.races if str(r.n) == str(n)), self.latest)

    def clear(self) -> None:
        """Forget every race, in place (the flags of a running race stay: it is being stopped)."""
        self.races, self.next = [], 1
