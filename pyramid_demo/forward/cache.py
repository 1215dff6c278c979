"""The one cache bookkeeping every model shares (copies once drifted apart): a feed not extending the cache raises."""

from __future__ import annotations

import abc
import os
import time
from pathlib import Path

import torch

LONGEST_PASS = 65  # the longest pass a verifier runs (a proposal of at most 64 plus its own token)
FEW_ROWS = 4  # the longest pass a compiled "few" package runs (`compiled.Runner`)
LONGEST_PREFILL = 1024  # the most rows one pass of a prompt runs: a longer one goes in parts (its mask stays small)


def probe_ids(count: int, vocab_size: int, n: int = 0) -> list[int]:
    """Fixed token ids (none of them 0) that the checks and timings feed, the same on every machine; `n`: another."""
    return [(7919 * (i + 131 * n) + 17 * n + 11) % max(2, vocab_size - 1) + 1 for i in range(count)]


def cache_root() -> Path:
    """The project's one folder on disk for what it builds once (converted models, compiled packages, the manifest):
    $PYRAMID_DEMO_CACHE or ~/.cache/pyramid_demo."""
    env = os.environ.get("PYRAMID_DEMO_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pyramid_demo"


def grown(t: torch.Tensor, dim: int, need: int) -> torch.Tensor:
    """The one growth of every static cache: `t` itself when `dim` holds `need` slots, else a copy with that size
    doubled until it does (every slot kept: pending tree rows past the cache's end too, the rest zeros)."""
    cap = t.shape[dim]
    if need <= cap:
        return t
    while cap < need:
        cap *= 2
    out = t.new_zeros(*t.shape[:dim], cap, *t.shape[dim + 1 :])
    out.narrow(dim, 0, t.shape[dim]).copy_(t)
    return out


class CacheError(RuntimeError):
    """A forward that does not start where the cache ends: the caller's bookkeeping is wrong."""


def tap_layers(n_layers: int) -> tuple[int, int]:
    """The layers whose outputs a multi-layer proposer reads beside the final state (EAGLE-3's low and middle
    features): one convention, so every forward publishes them alike (layer 2 and the middle one of 30 layers)."""
    return (min(2, n_layers // 4), n_layers // 2)


def tap_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """A tapped layer's output for a proposer that reads several layers (EAGLE-3): RMS-normalised without a
    weight, so early and late layers reach it at one scale. x [n, d] -> [n, d], x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class VerifierStates:
    """A draft's verifier's final normed hidden state at every scored position [n, d], which a feature proposer
    reads (the qualifier's in a pyramid, else the target's); with `taps` (a reader that wants them, `tap_layers`),
    those layers' normalised outputs first [n, 3·d]."""

    def __init__(self, taps: tuple[int, ...] = ()) -> None:
        self.taps = tuple(taps)
        self.f: torch.Tensor | None = None  # [capacity, d·(len(taps) + 1)]
        self.n = 0  # positions 0 .. n-1 hold the verifier's own states

    def write(self, pos: int, feats: torch.Tensor) -> None:
        """feats [k, d]: the states at positions pos .. pos+k-1 (pos ≤ n: a pass may overwrite its tail)."""
        if pos > self.n:
            raise CacheError(f"verifier states written at {pos} but only {self.n} are known")
        end = pos + feats.shape[0]
        if self.f is None:
            self.f = feats.new_zeros(256, feats.shape[1])
        self.f = grown(self.f, 0, end)
        self.f[pos:end] = feats
        self.n = end


class CachedModel(abc.ABC):
    """One model's per-run cache bookkeeping: the tokens it holds (`ids`). The loop feeds sequences (`feed`,
    `keep_along`, `truncate`); probes feed rows at a stated position (`forward`), the cache's end."""

    role: str
    trees: bool = False  # whether its forward attends over a tree of candidates (`forward` with parents)
    feeds_chains: bool = True  # pending rows that form a chain run as a feed's (`_run`: its slots, no tree mask)

    def __init__(self, role: str) -> None:
        self.role = role
        self.ids: list[int] = []  # the tokens whose keys/values are cached, in order
        self.n_forward = 0
        self.time_s = 0.0
        self.fed: list[int] = []  # new tokens of each forward since the counters were reset (cost profile)
        self.publish: VerifierStates | None = None  # where this model hands out its states (a draft's verifier)
        self.feats: torch.Tensor | None = None  # [n, d] states of the last forward's rows (when publishing)
        # tree rows (token, parent row or -1, position) in slots len(ids) + j until `keep_path` or a truncation
        self.pending: list[tuple[int, int, int]] = []
        self.pending_feats: list[torch.Tensor] = []  # [n_j, d] per tree forward (when publishing)

    @property
    def cache_len(self) -> int:
        return len(self.ids)

    def forward(
        self, tokens: list[int], pos: int, keep: int | None = None, parents: list[int] | None = None
    ) -> torch.Tensor:
        """The one pass: rows at the cache's end `pos`, each with a parent. `parents` None: a chain that joins the
        cache now (a prefill, a step). Else each row's parent (−1: the cache's end; an earlier pending row): the
        rows stay pending, each seeing the cache, its ancestors and itself, until `keep_path` keeps a path of them
        (a chain's: a length move). Logits of the last `keep` rows (None: all) [keep, V] fp32, CPU."""
        if pos != len(self.ids):
            raise CacheError(
                f"{self.role}: tokens fed at position {pos}, but its cache ends at {len(self.ids)} "
                "(a rollback was missed)"
            )
        keep = len(tokens) if keep is None else keep
        if not tokens or not 1 <= keep <= len(tokens) or parents is not None and len(parents) != len(tokens):
            raise ValueError(f"{self.role}: asked for {keep} logits of {len(tokens)} rows ({parents=})")
        if parents is not None:
            return self._pend(tokens, parents, pos)[-keep:]
        self._drop_pending()  # a plain feed overwrites the pending rows' slots
        z = self._timed(len(tokens), self._run, tokens, pos, keep)
        self.ids.extend(tokens)
        if self.publish is not None:
            assert self.feats is not None and self.feats.shape[0] == len(tokens), f"{self.role}: no states"
            self.publish.write(pos, self.feats)
        return z

    def _timed(self, n: int, run, *args) -> torch.Tensor:  # type: ignore[no-untyped-def]
        """One forward of n new rows, counted and timed (the cost profile reads them)."""
        t0 = time.perf_counter()
        z = run(*args)
        self.time_s += time.perf_counter() - t0
        self.n_forward += 1
        self.fed.append(n)
        return z

    def _pend(self, tokens: list[int], parents: list[int], pos: int) -> torch.Tensor:
        """Rows after the pending ones, held pending; a chain from the cache's end runs the chain pass."""
        base = len(self.pending)
        rows = list(self.pending)
        for t, p in zip(tokens, parents):
            if not -1 <= p < len(rows):
                raise ValueError(f"{self.role}: row {len(rows)}'s parent {p} is not an earlier row")
            rows.append((t, p, pos if p < 0 else rows[p][2] + 1))
        if self.feeds_chains and not base and parents == list(range(-1, len(tokens) - 1)):
            z = self._timed(len(tokens), self._run, tokens, pos, len(tokens))  # a chain: slots pos … as a feed's
        else:
            z = self._timed(len(tokens), self._run_tree, rows, base, pos)
        self.pending = rows
        if self.publish is not None:
            assert self.feats is not None and self.feats.shape[0] == len(tokens), f"{self.role}: no states"
            self.pending_feats.append(self.feats)
        return z

    def keep_path(self, rows: list[int]) -> int:
        """Move pending rows forming a path from the cache's end into it in place, drop the others; the new end."""
        prev = -1
        for r in rows:
            if not 0 <= r < len(self.pending) or self.pending[r][1] != prev:
                raise CacheError(f"{self.role}: tree rows {rows} are not a path from the cache's end")
            prev = r
        pos = len(self.ids)
        if rows:
            in_place = rows == list(range(len(rows)))  # a chain's path is where it was written: a length move
            if not in_place:
                self._compact(pos, [pos + r for r in rows])
            self.ids.extend(self.pending[r][0] for r in rows)
            if self.publish is not None:
                feats = torch.cat(self.pending_feats)  # [pending, d]
                self.publish.write(pos, feats[: len(rows)] if in_place else feats[torch.tensor(rows)])
        self._drop_pending()
        return len(self.ids)

    def _drop_pending(self) -> None:
        """Forget the pending tree rows (a model whose cache holds them drops them: `_crop` to the cache's end)."""
        if self.pending:
            self.pending, self.pending_feats = [], []
            self._crop(len(self.ids))

    def truncate(self, pos: int) -> int:
        """Keep at most the first `pos` cached positions (pending rows dropped); returns the cache's end."""
        self._drop_pending()
        if pos < len(self.ids):
            self._crop(pos)
            del self.ids[pos:]
        if self.publish is not None:
            self.publish.n = min(self.publish.n, len(self.ids))
        return len(self.ids)

    # ---------------------------------------------------------------- the loop's side: sequences, not positions
    def feed(self, seq: list[int], keep: int) -> torch.Tensor:
        """Feed what `seq` holds past the cache; logits of its last `keep` positions [keep, V] fp32, CPU."""
        return self.forward(self.unfed(seq), len(self.ids), keep)

    def unfed(self, seq: list[int]) -> list[int]:
        """seq's tokens past the cache; a missed cut (cached tokens not seq's first) raises CacheError."""
        n = len(self.ids)
        if seq[:n] != self.ids:
            bad = next((i for i, (a, b) in enumerate(zip(seq, self.ids)) if a != b), min(n, len(seq)))
            raise CacheError(
                f"{self.role}: its cache holds {n} tokens, but the sequence differs from them at "
                f"position {bad} (a cut was missed)"
            )
        return seq[n:]

    def keep_along(self, seq: list[int]) -> int:
        """After a tree forward: keep the pending rows spelling the longest prefix of seq past the cache."""
        rows: list[int] = []
        for t in seq[len(self.ids) :] if self.pending else ():
            r = next(
                (j for j, (tok, par, _) in enumerate(self.pending) if tok == t and par == (rows[-1] if rows else -1)),
                None,
            )
            if r is None:
                break
            rows.append(r)
        return self.keep_path(rows)

    def rollback(self, seq: list[int]) -> None:
        """Crop to the longest prefix shared with `seq`, less its last token (fed next)."""
        n = min(len(self.ids), len(seq) - 1)
        self.truncate(next((j for j in range(n) if self.ids[j] != seq[j]), n))

    def reset_counters(self) -> None:
        """Start counting forward passes and time afresh (prefill is reported apart)."""
        self.n_forward, self.time_s, self.fed = 0, 0.0, []

    # ---------------------------------------------------------------- subclass hooks
    @abc.abstractmethod
    def _run(self, tokens: list[int], pos: int, keep: int) -> torch.Tensor:
        """Logits of the last `keep` rows [keep, V] fp32 CPU; sets `self.feats` [n, d] when publishing."""

    @abc.abstractmethod
    def _crop(self, pos: int) -> None:
        """Drop the cached keys/values at positions ≥ pos."""

    def _run_tree(self, rows: list[tuple[int, int, int]], base: int, pos: int) -> torch.Tensor:
        """Logits [n, V] of pending rows base … (token, parent, position), keys/values into slots pos + j."""
        raise RuntimeError(
            f"the {self.role} model's forward ({type(self).__name__}) cannot verify a tree "
            "of candidates; tree methods need the core forward (Llama, Qwen2, Mistral)"
        )

    def _compact(self, pos: int, slots: list[int]) -> None:
        """Move the keys/values in `slots` (ascending) to pos, pos + 1, …"""
        raise RuntimeError(f"the {self.role} model keeps no tree rows")


def tree_seen(rows: list[tuple[int, int, int]], base: int, pos: int) -> torch.Tensor:
    """[n, pos + len(rows)] bool: each new row (base …) sees the cache, its ancestors and itself."""
    seen = torch.zeros(len(rows) - base, pos + len(rows), dtype=torch.bool)
    seen[:, :pos] = True
    for i in range(len(rows) - base):
        k = base + i
        while k >= 0:
            seen[i, pos + k] = True
            k = rows[k][1]
    return seen
