"""The model interface the engine drives; weights are shared between runs, caches never (fresh per run)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from .cache import CachedModel, VerifierStates, tap_norm, tree_seen
from .core import CoreLM
from .feature_lm import FeatureLM
from .lookup import LookupLM, PromptLookup
from .weights import covered, weights


class LM(Protocol):
    """What the engine needs from a model (every implementation is a `cache.CachedModel`): one pass of rows
    (`forward`), and the loop's side of the cache (`feed`, `keep_along`, `truncate`)."""

    role: str
    vocab_size: int  # the width of its logits
    ids: list[int]  # tokens whose keys/values are in the cache, in order
    n_forward: int
    time_s: float
    fed: list[int]  # new tokens fed by each forward since the counters were reset (cost profile)
    publish: VerifierStates | None  # the verifier hands its states out here when a proposer reads them

    @property
    def cache_len(self) -> int: ...
    def forward(
        self, tokens: list[int], pos: int, keep: int | None = None, parents: list[int] | None = None
    ) -> torch.Tensor: ...  # rows at pos: [keep, V]; with parents, pending until a path of them is kept
    def feed(self, seq: list[int], keep: int) -> torch.Tensor: ...  # seq past the cache; [keep, V] fp32, CPU
    def unfed(self, seq: list[int]) -> list[int]: ...  # seq past the cache, the cached tokens checked
    def keep_along(self, seq: list[int]) -> int: ...  # the pending rows that spell seq join the cache
    def truncate(self, pos: int) -> int: ...  # returns where the cache now ends
    def reset_counters(self) -> None: ...


@dataclass(frozen=True, eq=False)
class Forward:
    """What one role runs, decided once when its family loads (`models.runtime.plan_role`), held by the triplet and read
    by every run and every report of it."""

    kind: str  # "compiled" | "eager" | "hf" | "feature" | "lookup"
    why: str = ""  # in words, for the family box, the CLI and the Statistics tab
    runner: Any | None = None  # kind "compiled": its loaded packages (`compiled.Runner`)
    weights: Any | None = None  # kinds "compiled", "eager": the core's view of its weights, built once (`weights`)
    stem: str = ""  # a core forward's package name here (its weights' fingerprint): what its records are keyed by
    trees: bool = True  # it takes a tree of candidates (prompt lookup proposes one chain; HF's only where none slides)
    model: Any | None = None  # the module it runs: a model swapped in later is described again

    def __post_init__(self) -> None:
        if self.kind in ("eager", "compiled") and self.weights is None:
            raise ValueError(f"a {self.kind} forward needs the core's view of its model's weights (`described`)")


@dataclass
class ModelTriplet:
    """Three loaded causal LMs that share one tokenizer, ready for the engine."""

    draft: torch.nn.Module
    qualifier: torch.nn.Module
    target: torch.nn.Module
    tokenizer: Any  # the target's tokenizer (all three agree on ids)
    vocab_size: int  # shared tokenizer length: every model's logits are sliced to it
    eos_ids: tuple[int, ...]
    names: tuple[str, str, str]  # draft, qualifier, target references
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32
    preset: str = "custom"
    note: str = ""  # shown to users, e.g. "draft and qualifier are the target itself"
    gguf: Path | None = None  # the GGUF file the target was loaded from: what llama.cpp's peer decodes
    plan: dict[str, Forward] = field(default_factory=dict)  # role -> what it runs (`models.loading.planned`)
    exact: bool | None = None  # a k-token pass equals k one-token steps bitwise here (None: not measured)
    exact_note: str = ""  # what that means for the lossless methods, from the measured record (`models.checks`)
    tree_exact: bool | None = None  # a tree pass equals one-token steps along every path here (None: not measured)
    machine: str = ""  # the CPU class its plan was made on, as every figure names it (`models.runtime.cpu_class`)

    def __post_init__(self) -> None:
        # every role has its entry: the load's decision (`models.loading.planned`), else (a family not yet planned,
        # or a model swapped in since) the forward its model's kind names, uncompiled
        self.plan = {r: self._entry(r) for r in ("draft", "qualifier", "target")}

    def _entry(self, role: str) -> Forward:
        got, model = self.plan.get(role), self.model(role)
        return got if got is not None and got.model is model else described(model)

    def model(self, role: str) -> torch.nn.Module:
        return {"draft": self.draft, "qualifier": self.qualifier, "target": self.target}[role]

    @property
    def forwards(self) -> dict[str, str]:
        """role -> the forward it runs."""
        return {r: f.kind for r, f in self.plan.items()}

    @property
    def runners(self) -> dict[str, Any]:
        """role -> its compiled packages (None: not compiled), for helpers that open models by role."""
        return {r: f.runner for r, f in self.plan.items()}

    @property
    def runs(self) -> str:
        """What each role runs and why, one line."""
        return "; ".join(f"{r}: {f.why}" for r, f in self.plan.items())

    def forward(self, role: str) -> Forward:
        """What `role` runs: its plan's entry."""
        return self.plan[role]

    def open(self, role: str, as_role: str | None = None) -> LM:
        """A fresh LM over `role`'s model on the forward its plan names (`as_role`: the name its counters carry)."""
        return opened(self.plan[role], self.vocab_size, as_role or role)


def _hf_takes_trees(config: Any) -> bool:
    """HF's forward takes a tree as a 4-D mask (`tree_seen`), which carries no sliding window: only where its cache
    is plain layers alone (none slides)."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)


class HFLM(CachedModel):
    """The Hugging Face adapter: one run's decoding state over a causal LM the core does not cover (another
    architecture or rotary scheme, or a model spread over devices), on HF's own forward and cache."""

    def __init__(self, model: Any, vocab_size: int, role: str):
        super().__init__(role)
        self.model: Any = model  # a Hugging Face causal LM (duck-typed)
        self.vocab_size = vocab_size
        # inputs go to the token embedding's device (accelerate moves activations of a spread model)
        emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        self.device = emb.weight.device if emb is not None else next(model.parameters()).device
        if self.device.type == "meta":  # an offloaded embedding: its hook moves inputs where they run
            self.device = torch.device("cpu")
        # every sliding-window layer keeps all positions: a sliding layer cannot be cropped, yet SD rolls back; the
        # window stays in the mask (built from positions), so the logits are the same
        self.cache = DynamicCache(config=model.config)
        self.cache.layers = [
            DynamicLayer() if isinstance(layer, DynamicSlidingWindowLayer) else layer for layer in self.cache.layers
        ]
        self.trees = _hf_takes_trees(model.config)
        # transformers 5 renamed `past_key_values` to `cache`; accept either generation
        self.cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        base = getattr(model, "base_model", None)  # its decoder, called directly when the states are handed out
        self.base_kw = (
            "cache" if base is not None and "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        )

    @torch.inference_mode()
    def _run(self, tokens: list[int], pos: int, keep: int) -> torch.Tensor:
        return self._forward(torch.tensor([tokens], dtype=torch.long, device=self.device), keep)  # x [1, n]

    def _forward(self, x: torch.Tensor, keep: int, **kw: Any) -> torch.Tensor:
        """Logits [keep, V] fp32 CPU of x [1, n]'s last `keep` rows (0: all); publishing, every row's states too."""
        if self.publish is None:
            out = self.model(input_ids=x, use_cache=True, logits_to_keep=keep, **{self.cache_kw: self.cache}, **kw)
            z = out.logits[0, -keep:, : self.vocab_size]
        else:
            taps = self.publish.taps  # the tapped layers' outputs (hidden_states[i + 1]: layer i), normalised, first
            out = self.model.base_model(
                input_ids=x, use_cache=True, output_hidden_states=bool(taps), **{self.base_kw: self.cache}, **kw
            )
            eps = float(getattr(self.model.config, "rms_norm_eps", 1e-6))
            tapped = [tap_norm(out.hidden_states[i + 1][0], eps) for i in taps]
            self.feats = torch.cat([*tapped, out.last_hidden_state[0]], -1).detach()  # [n, d·(taps + 1)]
            z = self.model.get_output_embeddings()(out.last_hidden_state[0, -keep:])[:, : self.vocab_size]
        z = z.float().cpu()
        if self.device.type != "cpu":
            torch.accelerator.synchronize(self.device)
        return z

    def _crop(self, pos: int) -> None:
        self.cache.crop(pos - self.cache.get_seq_length())  # a negative count: drop that many from the end

    @torch.inference_mode()
    def _run_tree(self, rows: list[tuple[int, int, int]], base: int, pos: int) -> torch.Tensor:
        """Tree rows through HF's forward: position ids per row and a custom 4-D mask (`tree_seen`)."""
        if not self.trees:
            return super()._run_tree(rows, base, pos)
        new, seen = rows[base:], tree_seen(rows, base, pos)  # [n, total]
        dtype = self.model.get_input_embeddings().weight.dtype
        mask = torch.zeros(1, 1, *seen.shape, dtype=dtype).masked_fill_(~seen[None, None], torch.finfo(dtype).min)
        x = torch.tensor([[r[0] for r in new]], dtype=torch.long, device=self.device)
        at = torch.tensor([[r[2] for r in new]], dtype=torch.long, device=self.device)
        return self._forward(x, 0, attention_mask=mask.to(self.device), position_ids=at)  # [n, V]

    @torch.inference_mode()
    def _compact(self, pos: int, slots: list[int]) -> None:
        idx = torch.tensor(slots, device=self.device)
        for layer in self.cache.layers:  # transformers 5's DynamicLayer: keys/values [B, H, T, D]
            layer.keys[:, :, pos : pos + len(slots)] = layer.keys[:, :, idx]
            layer.values[:, :, pos : pos + len(slots)] = layer.values[:, :, idx]


def forward_of(model: torch.nn.Module, runner: Any | None = None) -> str:
    """The forward an LM over `model` runs: "lookup" (prompt lookup, no model), "feature" (a proposer that reads its
    verifier), "compiled" (the core pass on `runner`, its loaded package), "eager" (the core pass), or "hf" (Hugging
    Face's forward, for architectures the core does not cover)."""
    if isinstance(model, PromptLookup):
        return "lookup"
    if getattr(model, "reads_verifier", False):
        return "feature"
    return ("compiled" if runner is not None else "eager") if covered(model) else "hf"


def described(model: torch.nn.Module, runner: Any | None = None, why: str = "") -> Forward:
    """The forward `forward_of` names for `model` (`runner`: its compiled packages), with what an LM over it needs
    and whether it takes a tree: a plan's entry (`models.runtime.plan_role` adds what it measured)."""
    kind = forward_of(model, runner)
    if kind in ("eager", "compiled"):
        return Forward(kind, why, runner=runner, weights=weights(model), model=model)
    return Forward(kind, why, trees=kind == "feature" or kind == "hf" and _hf_takes_trees(model.config), model=model)


def open_lm(model: torch.nn.Module, vocab_size: int, role: str, runner: Any | None = None) -> LM:
    """A fresh per-run LM over a loaded model outside a family's plan, on the forward `described` names."""
    return opened(described(model, runner), vocab_size, role)


def opened(fwd: Forward, vocab_size: int, role: str) -> LM:
    """A fresh per-run LM (its own cache, never shared) over `fwd`'s model, on the forward `fwd` names."""
    if fwd.kind == "hf":
        return HFLM(fwd.model, vocab_size, role)
    if fwd.kind == "lookup":
        return LookupLM(fwd.model, vocab_size, role)
    if fwd.kind == "feature":
        return FeatureLM(fwd.model, vocab_size, role)
    return CoreLM(fwd.weights, vocab_size, role, fwd.runner)
