"""The tests' own API over the decoding core: what only tests call, kept out of the product.

- `verify`: decide and record one chain round at once, on hand-built logits;
- `check`: a tree's parent list is breadth-first;
- `compute_stats`: a run's statistics recomputed from its steps alone;
- `reads`: every DecodeConfig setting a method's run reads;
- `devices_of`: the devices a model's parameters sit on;
- `clear_loaded`: forget every family `models.loading` loaded;
- `saved_tiny_models`: tiny Llama folders a custom family loads from;
- `leading_run`, `sd_passes`, `next_token`: SD's chain rule as the papers state it, position by position, the
  reference the walk (`rules.decide_tree`) is held to on chains;
- `shown`: a replayed beat's chips as (text, mark); `visible`: the text a reader sees of a Markdown snippet.
"""

from __future__ import annotations

import re

import torch

from pyramid_demo.app.playback import HIDDEN, Beat, mark
from pyramid_demo.core import rules
from pyramid_demo.core.methods import TREE_BUDGET, DecodeConfig, Method
from pyramid_demo.core.round import Round, decide_round, record
from pyramid_demo.core.rules import Tree
from pyramid_demo.core.trace import StageRound, Stats, Step, Tally


def verify(
    z_p: torch.Tensor,
    z_q: torch.Tensor,
    x: list[int],
    rule: str,
    tau: float | None,
    cfg: DecodeConfig,
    gen: torch.Generator | None,
    proposer: str,
    verifier: str,
) -> tuple[StageRound, int]:
    """Decide and record one chain round at once: the round record and the verifier's token."""
    rnd = decide(z_p, z_q, x, rule, tau, cfg, gen, proposer, verifier)
    return record(rnd, cfg), rnd.dec.nxt


def decide(
    z_p: torch.Tensor,
    z_q: torch.Tensor,
    x: list[int],
    rule: str,
    tau: float | None,
    cfg: DecodeConfig,
    gen: torch.Generator | None,
    proposer: str,
    verifier: str,
) -> Round:
    """A chain's round: proposed tokens x [n] with the proposer's logits z_q [n, V] (`core.round.decide_round`)."""
    return decide_round(z_p, rules.chain(x, z_q if x else z_p[:0]), rule, tau, cfg, gen, proposer, verifier)


def check(tree: Tree) -> None:
    """A ValueError when the parent list is not breadth-first (each parent earlier, depth non-decreasing)."""
    depth = rules.depths(tree.parents)
    for i, p in enumerate(tree.parents):
        if not -1 <= p < i:
            raise ValueError(f"node {i}'s parent {p} is not an earlier node")
        if i and depth[i] < depth[i - 1]:
            raise ValueError(f"node {i} is shallower than node {i - 1}: nodes must be in breadth-first order")


def leading_run(passes: list[bool]) -> int:
    """Length of the leading run of True: tokens are accepted until the first failure."""
    for i, ok in enumerate(passes):
        if not ok:
            return i
    return len(passes)


def sd_passes(p: torch.Tensor, q: torch.Tensor, x: list[int], r: torch.Tensor | None) -> list[bool]:
    """Per-token SD test. Greedy (r None): x̃_i == argmax p_i. Sampled: r_i < p_i(x̃_i)/q_i(x̃_i).

    p, q: [n, V] warped (greedy: p may be raw logits, only its argmax is read); x: n proposed
    ids; r: [n] uniforms.
    """
    if r is None:
        return [a == t for a, t in zip(p.argmax(-1).tolist(), x)]
    return [float(r[i]) * float(q[i, t]) < float(p[i, t]) for i, t in enumerate(x)]


def next_token(p_next: torch.Tensor, q_next: torch.Tensor | None, gen: torch.Generator | None) -> int:
    """The verifier's own token: from the residual under SD (q given), from p otherwise."""
    dist = rules.residual(p_next, q_next) if q_next is not None else p_next
    return rules.sample(dist, gen)


def peaked(*hot: int, vocab: int = 6, scale: float = 10.0) -> torch.Tensor:
    """Logits [vocab] peaked on `hot` (the first highest): hand-built distributions for the rule tests."""
    z = torch.zeros(vocab)
    for r, t in enumerate(hot):
        z[t] = scale - r
    return z


def compute_stats(method: str, steps: list[Step], prefill_s: float, stopped: str) -> Stats:
    """The statistics of a run's steps, recomputed from the records alone (`trace.Tally`, as a run keeps them)."""
    tally = Tally()
    for step in steps:
        tally.add(step)
    return tally.stats(method, prefill_s, stopped)


def reads(m: Method) -> tuple[str, ...]:
    """Every DecodeConfig setting a run of `m` reads (the tests hold each to a row of `settings.SETTINGS`)."""
    out = ["max_new_tokens", "temperature", "top_k", "top_p", "seed", *m.lengths, *m.thresholds]
    rules_ = {s.rule for s in m.stages}
    if m.stages:
        out += ["conf_stop", "lookup_first"]
    if m.shaped:
        out += ["shape", *TREE_BUDGET]
    if rules_ - {"sd"}:
        out += ["divergence", "div_support", "fallback"]
    if "config" in rules_:
        out.append("stage2")
    return tuple(dict.fromkeys(out))


def devices_of(model: torch.nn.Module) -> list[str]:
    """The devices a model's parameters sit on, in order of first appearance."""
    return list(dict.fromkeys(str(p.device) for p in model.parameters()))


def clear_loaded() -> None:
    """Forget every loaded triplet (their memory is freed once no run holds them)."""
    from pyramid_demo.models import loading

    with loading._LOCK:
        loading._CACHE.clear()


def saved_tiny_models(folder, names: str) -> list[str]:
    """One tiny Llama (seed i) and the tiny tokenizer saved in folder/<name> for each letter of `names`: the paths
    a custom family names."""
    from transformers import LlamaForCausalLM

    from pyramid_demo.models.tiny import tiny_config, tiny_tokenizer

    paths = []
    for i, name in enumerate(names):
        torch.manual_seed(i)
        LlamaForCausalLM(tiny_config(len(tiny_tokenizer()))).save_pretrained(folder / name)
        tiny_tokenizer().save_pretrained(folder / name)
        paths.append(str(folder / name))
    return paths


def plan(config, max_memory: dict, dtype: torch.dtype = torch.float16) -> dict:
    """The device map accelerate would choose for `config` under `max_memory`, sized on `meta` (no weights or GPU):
    what `--device-map auto` does inside `from_pretrained`, for tests that split a model in memory."""
    from accelerate import infer_auto_device_map, init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()
    no_split = getattr(model, "_no_split_modules", None) or []
    return infer_auto_device_map(model.to(dtype), max_memory=max_memory, no_split_module_classes=no_split)


def dispatch(model: torch.nn.Module, device_map: dict, offload_dir: str | None = None) -> torch.nn.Module:
    """Put an in-memory model's modules where `device_map` says ("disk" entries offloaded to `offload_dir`)."""
    from accelerate import dispatch_model

    if len(set(map(str, device_map.values()))) == 1 and "disk" not in device_map.values():
        return model.to(next(iter(device_map.values())))
    main = next((d for d in device_map.values() if d not in ("cpu", "disk")), "cpu")
    return dispatch_model(model, device_map=device_map, main_device=main, offload_dir=offload_dir)


def shown(beat: Beat) -> list[tuple[str, str]]:
    """The round's chips out so far as (text, mark)."""
    return [(c.text, mark(beat, i)) for i, c in enumerate(beat.chips) if c.state != HIDDEN]


def visible(markdown: str) -> str:
    """The text a reader sees of a Markdown snippet (bold marks and line-break spaces removed)."""
    return re.sub(r"\*\*|`|  \n", lambda m: "\n" if m.group(0) == "  \n" else "", markdown)
