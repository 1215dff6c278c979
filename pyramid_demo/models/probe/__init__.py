"""The dtype, CPU backend and forward for this machine, chosen by a probe of several seconds, and the family's
cost profile, both cached as JSON: speed and exactness depend on the CPU, torch and the model."""
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
