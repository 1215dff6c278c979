"""The bench's variants: every method (once per shape), HF peers last, --grid's sweep; parses --methods and --shapes."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import generate_cli
from ..clock import Run
from ..core.methods import METHODS, SOLO_LANES, DecodeConfig, lane_label, lossless, method_spec, retired
from ..core.settings import SHAPES
from . import peers

GRID_TAUS = (0.2, 0.3, 0.4, 0.5)
GRID_NAMES = {"tau_t": "tauT", "tau_q": "tauQ", "l_d": "lD", "l_q": "lQ"}  # in variant labels


@dataclass(frozen=True)
class Variant(Run):
    """One benchmarked setting: an engine method with its config, an HF peer, or a reference (`solo`: one member)."""

    lookup: tuple[int, int] | None = None  # hf_prompt_lookup's (tokens proposed, longest n-gram): not a DecodeConfig's

    @property
    def kind(self) -> str:
        """ "peer", "reference" (a member alone: no method of the table, so never AR's baseline) or "engine"."""
        return "peer" if self.method in peers.PEERS else "reference" if self.solo else "engine"

    @property
    def lossless(self) -> bool:
        """Output distribution equals the target's; a reference run's never does (another model decodes)."""
        return self.kind == "peer" or (self.kind == "engine" and lossless(self.method, self.cfg.stage2))


def _numbers(s: str, kind: type) -> list:
    return [kind(x) for x in s.split(",") if x.strip()]


def parse_methods(methods: str, peer_list: str) -> list[str]:
    ms = [m.strip().lower() for m in methods.split(",") if m.strip()]
    ps = [] if peer_list.strip().lower() == "none" else [m.strip().lower() for m in peer_list.split(",") if m.strip()]
    for m in ms:
        if retired(m):
            raise ValueError(retired(m))
    bad = [m for m in ms if m not in METHODS] + [m for m in ps if m not in peers.PEERS]
    if bad:
        raise ValueError(f"unknown method(s) {', '.join(bad)}; choose from {', '.join(METHODS + peers.PEERS)}")
    if not ms and not ps:
        raise ValueError("no methods to benchmark")
    return list(dict.fromkeys(ms + ps))


def parse_shapes(shapes: str | None, default: str) -> list[str]:
    """--shapes as a list (default: the one --shape names); a ValueError naming the choices."""
    out = [x.strip().lower() for x in (shapes or default).split(",") if x.strip()]
    bad = [x for x in out if x not in SHAPES]
    if bad or not out:
        raise ValueError(f"unknown shape(s) {', '.join(bad) or '(none)'}; choose from {', '.join(SHAPES)}")
    return list(dict.fromkeys(out))


def build_variants(args: argparse.Namespace) -> list[Variant]:
    """The settings to run: AR, then --solo's reference rows, each method once per shape (or --grid's sweep), peers."""
    suite_peers = peers.DEFAULT_PEERS + ",hf_prompt_lookup" if args.suite else peers.DEFAULT_PEERS
    methods = parse_methods(args.methods, suite_peers if args.peers is None else args.peers)
    if args.pld_tokens < 1 or args.pld_ngram < 1:  # checked whether or not the peer runs
        raise ValueError(f"--pld-tokens and --pld-ngram must be at least 1, got {args.pld_tokens} and {args.pld_ngram}")
    methods.sort(key=lambda m: (m != "ar",))
    shapes = parse_shapes(args.shapes, args.shape)

    def cfg(m: str, **kw) -> DecodeConfig:
        ns = argparse.Namespace(**{**vars(args), "method": m if m in METHODS else "ar"})
        return dataclasses.replace(generate_cli.config_from_args(ns), **kw)

    out: list[Variant] = []
    taus, lds, lqs = _numbers(args.grid_taus, float), _numbers(args.grid_l_d, int), _numbers(args.grid_l_q, int)
    pairs = [(d, q) for q in lqs for d in lds if d <= q]
    for m in methods:
        spec = method_spec(m) if m in METHODS else None
        for shape in shapes if spec is not None and spec.shaped else [None]:
            sk = {"shape": shape} if shape else {}
            tag = [shape] if shape and len(shapes) > 1 else []  # the label names the shape when several run
            if not args.grid or spec is None or not spec.thresholds:  # nothing to sweep
                lookup = (args.pld_tokens, args.pld_ngram) if m == "hf_prompt_lookup" else None
                out.append(Variant(" ".join([m, *tag]), m, cfg(m, **sk), lookup=lookup))
                continue
            for t in taus:  # τ_T, then τ_Q ≤ τ_T (stage 1 fuzzy), then ℓ_D ≤ ℓ_Q (pyramids)
                for u in [u for u in taus if u <= t] if "tau_q" in spec.thresholds else [None]:
                    for d, q in pairs if spec.pyramid else [(None, None)]:
                        kw = {k: v for k, v in (("tau_t", t), ("tau_q", u), ("l_d", d), ("l_q", q)) if v is not None}
                        label = " ".join([m, *tag] + [f"{GRID_NAMES[k]}={v:g}" for k, v in kw.items()])
                        out.append(Variant(label, m, cfg(m, **kw, **sk)))
    after_ar = sum(1 for v in out if v.method == "ar")  # AR is never swept: its one variant, first
    out[after_ar:after_ar] = solo_variants(args.solo, cfg)
    return out


def largest(variants: Sequence[Variant]) -> DecodeConfig:
    """The largest budget and drafts of `variants`: what a prompt (or a later turn's context) must leave room for."""
    most = {k: max(getattr(v.cfg, k) for v in variants) for k in ("max_new_tokens", "gamma", "l_q", "tree_nodes")}
    return DecodeConfig(l_d=1, **most)


def solo_variants(roles: str | None, cfg: Callable[..., DecodeConfig]) -> list[Variant]:
    """The reference rows of --solo (comma-separated roles), each decoding alone with AR's config, labelled as lanes."""
    asked = [r.strip().lower() for r in (roles or "").split(",") if r.strip()]
    by_role = {lane.solo: lane for lane in SOLO_LANES}
    bad = [r for r in asked if r not in by_role]
    if bad:
        raise ValueError(f"--solo {', '.join(bad)}: choose from {', '.join(by_role)}")
    return [Variant(by_role[r].label, "ar", cfg("ar"), solo=r) for r in dict.fromkeys(asked)]


def name_models(variants: list[Variant], models: tuple[str, ...]) -> list[Variant]:
    """The variants with each reference row labelled after the loaded family (`methods.lane_label`)."""
    keys = {lane.solo: lane.key for lane in SOLO_LANES}
    return [dataclasses.replace(v, label=lane_label(keys[v.solo], models)) if v.solo in keys else v for v in variants]
