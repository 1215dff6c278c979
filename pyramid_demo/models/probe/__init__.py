"""The dtype, CPU backend and forward for this machine, chosen by a probe of several seconds, and the family's
measured cost profile (see `predict.costs`); both cached as JSON under `bundled.cache_root()`.

On a CPU each candidate — fp32; bf16 with packed oneDNN linears (or plain oneDNN where packing is not
offered); bf16 with oneDNN off (bf16 only where the CPU has native bf16 instructions) — under each forward
the target's architecture allows (lean, HF's) is timed and checked for exactness on the real target; packed
linears are first padded to the smallest row count that makes them batch-invariant on this CPU
(`forward.packed.invariant_pad`). The fastest exact candidate wins; if none is exact, the fastest whose top-1
always matched, and every place that reports the choice says that lossless methods may then differ from AR
at near-ties. The choice (a typed `Choice`) is cached per machine (CPU model and instruction sets, torch, threads) ×
family; a cached choice of an older format, or without an exactness record, is probed again. On CUDA:
bf16 where supported, else fp16; on MPS: fp16 (not probed here: `scripts/gpu_check.sh` checks exactness
there). `--dtype` and `--backend` override the choice (its exactness then comes from the cached record, if
any). PYRAMID_DEMO_PROBE=0 turns the probe off (fp32, torch's default backend, as before the probe).

One concern a module: `machine` (which machine a cache entry is for), `store` (the JSON files), `record`
(the `Choice` and its display), `build` (the candidates), `search` (timing, exactness, the pick), `policy`
(which choice a load gets, and which forward then runs), `warm` (the cost profile and the race warm-up).
"""
from __future__ import annotations

from .build import CANDIDATES, candidate_model, candidates
from .machine import cpu_flags, cpu_name, machine_key, native_bf16, numerics, probe_wanted
from .policy import MAX_PROBE_PARAMS, cached_choice, check_roles, choose, device_dtype, forward_for, remember
from .record import FORMAT, Choice
from .search import (
                     EXACT_PLAN,
                     REPS,
                     SCORE_WEIGHTS,
                     TREE_PLAN,
                     VERIFY_K,
                     check_family,
                     check_triplet,
                     choose_attention,
                     pick,
                     probe_target,
                     reads_target,
                     role_opener,
                     score,
                     table,
)
from .store import CHOICE_FILE, PROFILE_FILE, probe_root
from .warm import cost_profile, prepare

__all__ = ["CANDIDATES", "CHOICE_FILE", "EXACT_PLAN", "FORMAT", "MAX_PROBE_PARAMS", "PROFILE_FILE", "REPS",
           "SCORE_WEIGHTS", "TREE_PLAN", "VERIFY_K", "Choice", "cached_choice", "candidate_model", "candidates",
           "check_family", "check_roles", "check_triplet", "choose", "choose_attention", "cost_profile", "cpu_flags",
           "cpu_name", "device_dtype", "forward_for", "machine_key", "native_bf16", "numerics", "pick", "prepare",
           "probe_root", "probe_target", "probe_wanted", "reads_target", "remember", "role_opener", "score", "table"]
