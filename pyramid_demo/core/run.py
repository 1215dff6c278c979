"""Run a method on a loaded triplet: validate, prefill, stream `RunResult` snapshots built pass by pass."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from ..forward.lm import LM, ModelTriplet
from . import engine
from .engine import prefill, roles_for, shares_prompt
from .methods import ROLE_ORDER, DecodeConfig, method_spec
from .trace import RunResult, Step, Tally

MAX_PROMPT_CHARS = 20_000


def encode_prompt(tokenizer: Any, text: str, chat: bool = True) -> list[int]:
    """Token ids for a user prompt: through the chat template when the tokenizer has one."""
    if chat and getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return [int(i) for i in ids]
    return [int(i) for i in tokenizer(text, add_special_tokens=True)["input_ids"]]


def prepare_prompt(triplet: ModelTriplet, prompt: str | list[int], cfg: DecodeConfig, chat: bool = True) -> list[int]:
    """Token ids for the prompt, or a ValueError that says what is wrong with it."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("the prompt is empty: type a question or instruction")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ValueError(f"the prompt is {len(prompt):,} characters; the limit is {MAX_PROMPT_CHARS:,}")
        ids = encode_prompt(triplet.tokenizer, prompt, chat=chat)
    else:
        ids = [int(i) for i in prompt]
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    block = max(cfg.gamma, cfg.l_q, cfg.tree_nodes) + 1
    windows = (getattr(getattr(triplet.model(r), "config", None), "max_position_embeddings", None) for r in ROLE_ORDER)
    limit = int(min(w or 10**9 for w in windows))  # the smallest context window of the three
    if len(ids) + cfg.max_new_tokens + block > limit:
        raise ValueError(
            f"the prompt is {len(ids)} tokens; with max_new_tokens={cfg.max_new_tokens} and drafts of up to {block} "
            f"tokens it exceeds the models' context of {limit} tokens — shorten the prompt or lower max new tokens"
        )
    return ids


class _TextTail:
    """The text so far: a short window at the end decoded each pass (as TGI and vLLM stream), at whole characters."""

    def __init__(self, tokenizer: Any):
        self.tokenizer, self.text, self.prefix, self.read = tokenizer, "", 0, 0
        self.ids: list[int] = []

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def extend(self, new: list[int]) -> None:
        self.ids.extend(new)
        before = self._decode(self.ids[self.prefix : self.read])
        now = self._decode(self.ids[self.prefix :])
        if len(now) > len(before) and not now.endswith("\ufffd"):  # a partial UTF-8 character waits
            self.text += now[len(before) :]
            self.prefix, self.read = self.read, len(self.ids)

    def full(self) -> str:
        return self._decode(self.ids)


class _Snapshots:
    """A run's record built pass by pass, statistics tallied from each new step alone: a long race costs linear time."""

    def __init__(
        self,
        triplet: ModelTriplet,
        cfg: DecodeConfig,
        prompt: str,
        ids: list[int],
        shape_why: str = "",
        solo: str | None = None,
    ):
        self.triplet, self.cfg, self.prompt, self.ids, self.prefill_s = triplet, cfg, prompt, ids, 0.0
        self.shape_why, self.solo = shape_why, solo
        self.config, self.tail, self.tally, self.stopped = cfg.to_dict(), _TextTail(triplet.tokenizer), Tally(), ""
        self.steps: list[Step] = []
        self.token_ids: list[int] = []
        self.texts: list[str] = []
        self.origins: list[str] = []
        self.forwards: dict[str, str] = {}  # role -> the forward that ran it (its family's plan)

    def add(self, step: Step) -> None:
        tok = self.triplet.tokenizer
        self.steps.append(step)
        self.token_ids.extend(step.new_tokens)
        self.texts.extend(tok.decode([t]) for t in step.new_tokens)
        self.origins.extend(step.origins)
        self.tail.extend(step.new_tokens)
        self.tally.add(step)
        eos = bool(step.new_tokens) and step.new_tokens[-1] in self.triplet.eos_ids
        self.stopped = "eos" if eos else "max_new_tokens" if len(self.token_ids) >= self.cfg.max_new_tokens else ""

    def result(self, full: bool = False) -> RunResult:
        """This pass's snapshot; `full` (and any snapshot that ends the run): the text decoded from scratch."""
        full = full or bool(self.stopped)
        stats = self.tally.stats(self.cfg.method, self.prefill_s, self.stopped)
        return RunResult(
            method=self.cfg.method,
            config=dict(self.config),
            models=list(self.triplet.names),
            prompt=self.prompt,
            prompt_ids=self.ids,
            token_ids=list(self.token_ids),
            token_texts=list(self.texts),
            origins=list(self.origins),
            text=self.tail.full() if full else self.tail.text,
            stats=stats,
            steps=list(self.steps),
            shape_why=self.shape_why,
            solo=self.solo,
            forwards=dict(self.forwards),
        )


def takes_trees(triplet: ModelTriplet, method: str) -> bool:
    """Whether the models that would grow and verify `method`'s tree take one, known before the run."""
    return all(
        triplet.forward(r).trees for st in method_spec(method).stages if st.shaped for r in (st.proposer, st.verifier)
    )


def shape_to_run(cfg: DecodeConfig, trees: bool, why: str = "") -> tuple[DecodeConfig, str]:
    """The config the loop runs (shape "chain" or "tree") and why: `why` as the caller settled it, else what needs no
    cost model; a tree the forwards cannot take is refused, an unpriced "auto" runs the chain and says so."""
    spec = method_spec(cfg.method)
    if not spec.shaped:
        return replace(cfg, shape="chain"), f"{spec.short} proposes nothing: no shape to choose"
    if cfg.shape == "tree" and not trees:
        raise ValueError(
            f"{spec.short} over a tree needs models that take a tree of candidates, and these cannot (prompt "
            "lookup proposes one chain; HF's forward over sliding windows or a cache of convolution or "
            "linear-attention state verifies chains); run it with --shape chain"
        )
    if cfg.shape == "auto":
        because = (
            "these models cannot take a tree (prompt lookup proposes one chain; HF's forward over sliding windows "
            "or a cache of convolution or linear-attention state verifies chains)"
            if not trees
            else "no cost profile of this machine is available"
        )
        return replace(cfg, shape="chain"), f"auto: the chain, because {because}"
    return cfg, why or f"shape {cfg.shape}, as asked"


def solo_lms(triplet: ModelTriplet, role: str) -> dict[str, LM]:
    """A reference run's LMs: `role` decoding alone as "ar" in the target's slot; ValueError where it cannot."""
    if role not in ROLE_ORDER:
        raise ValueError(f"unknown role {role!r} to decode alone; choose one of {', '.join(ROLE_ORDER)}")
    model = triplet.model(role)
    if getattr(model, "reads_verifier", False):
        raise ValueError(f"the {role} reads its verifier's hidden states, so it cannot decode alone")
    return {"target": triplet.open(role)}


def relabel(step: Step, role: str) -> Step:
    """A step recorded with `role` in the target's slot, naming `role` wherever it says "target"."""

    def swap(d: dict) -> dict:
        return {role if k == "target" else k: v for k, v in d.items()}

    return replace(
        step,
        origins=[role if o == "target" else o for o in step.origins],
        time_s=swap(step.time_s),
        n_forward=swap(step.n_forward),
        fed=swap(step.fed),
    )


def _passes(
    triplet: ModelTriplet,
    prompt: str | list[int],
    cfg: DecodeConfig,
    chat: bool,
    text: str | None,
    full_records: bool,
    shape_why: str,
    solo: str | None,
) -> Iterator[_Snapshots]:
    """Encode, settle the shape, prefill, decode (own caches and generator); yield the record after each pass."""
    ids = prepare_prompt(triplet, prompt, cfg, chat)
    if text is None:
        text = prompt if isinstance(prompt, str) else triplet.tokenizer.decode(ids)
    if solo is not None and cfg.method != "ar":
        raise ValueError(f"a member decoding alone runs as method 'ar', not {cfg.method!r}")
    cfg, why = shape_to_run(cfg, takes_trees(triplet, cfg.method), shape_why)  # a tree refused before any work
    gen = None if cfg.greedy else torch.Generator().manual_seed(cfg.seed)
    record = _Snapshots(triplet, cfg, text, ids, why, solo)
    lms = solo_lms(triplet, solo) if solo is not None else {r: triplet.open(r) for r in roles_for(cfg.method)}
    record.forwards = {r: triplet.forward(solo or r).kind for r in lms}  # what each role runs: its family's plan
    share = cfg.qualifier_prompt == "target" and shares_prompt(lms)
    record.prefill_s = prefill(lms, ids, share)
    for lm in lms.values():  # prefill forwards are reported separately
        lm.reset_counters()
    if "qualifier" in lms:  # what ran: a qualifier of other shapes prefills its own whatever was asked
        record.config["qualifier_prompt"] = "target" if share else "own"
    for step in engine.decode(lms, ids, cfg, triplet.eos_ids, gen, full_records, defer=True):  # records after the clock
        record.add(relabel(step, solo) if solo is not None else step)
        yield record


def stream(
    triplet: ModelTriplet,
    prompt: str | list[int],
    cfg: DecodeConfig,
    chat: bool = True,
    text: str | None = None,
    shape_why: str = "",
    solo: str | None = None,
) -> Iterator[RunResult]:
    """A snapshot after every target pass (the last has stats.stopped). `prompt`: text, or `prepare_prompt`'s ids with
    `text` as the user wrote it; `solo`: a reference run."""
    for record in _passes(triplet, prompt, cfg, chat, text, True, shape_why, solo):
        yield record.result()


def generate(
    triplet: ModelTriplet,
    prompt: str | list[int],
    cfg: DecodeConfig,
    chat: bool = True,
    text: str | None = None,
    full_records: bool = True,
    shape_why: str = "",
    solo: str | None = None,
) -> RunResult:
    """Run to the end and return the final record; arguments as `stream`, `full_records=False` keeps statuses only."""
    *_, record = _passes(triplet, prompt, cfg, chat, text, full_records, shape_why, solo)  # the last is the run's
    return record.result(full=True)
