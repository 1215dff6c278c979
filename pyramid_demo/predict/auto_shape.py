"""Shape "auto", settled before a run: the faster of the best tree and chain on the profile (the loop only runs it)."""

from __future__ import annotations

from dataclasses import replace

from ..core.config import DecodeConfig
from ..core.methods import method_spec
from ..core.run import shape_to_run
from .tree_costs import best_tree


def resolve_shape(cfg: DecodeConfig, profile: dict | None, trees: bool = True) -> tuple[DecodeConfig, str]:
    """The config to run (shape "chain" or "tree") and why; without trees or a usable profile `shape_to_run` decides."""
    spec = method_spec(cfg.method)
    st = next((s for s in spec.stages if s.shaped), None)  # the stage whose proposal takes the shape
    usable = bool(profile) and "ms" in profile and st is not None and {st.proposer, st.verifier} <= set(profile["ms"])
    if cfg.shape != "auto" or st is None or not trees or not usable:
        return shape_to_run(cfg, trees)
    # the predictor prices a proposer → verifier stage by the roles "draft" and "target": hand it this stage's
    b = best_tree({**profile, "ms": {"draft": profile["ms"][st.proposer], "target": profile["ms"][st.verifier]}}, None)
    tree_s, chain_s = float(b["tokens_per_s"]), float(b["chain_tokens_per_s"])
    where = f" (the {st.proposer} → {st.verifier} stage)" if spec.pyramid else ""
    if tree_s > chain_s:
        budget = {k: int(b[k]) for k in ("tree_nodes", "tree_depth", "tree_k")}
        return replace(cfg, shape="tree", **budget), (
            f"auto: a tree of {budget['tree_nodes']} nodes (depth {budget['tree_depth']}, {budget['tree_k']} "
            f"children), predicted {tree_s:.1f} tok/s against the best chain's {chain_s:.1f} on this machine's "
            f"profile{where}"
        )
    return replace(cfg, shape="chain"), (
        f"auto: the chain, predicted {chain_s:.1f} tok/s against the best tree's "
        f"{tree_s:.1f} on this machine's profile{where}"
    )
