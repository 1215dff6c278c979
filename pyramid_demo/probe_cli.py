"""`python -m pyramid_demo probe`: run the dtype/backend/forward probe now, print its table and cache the choice."""
from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default="smollm2-offline", help="a preset or draft,qualifier,target")
    p.add_argument("--all", action="store_true",
                   help="check every candidate's exactness (default: from the fastest until one is exact)")
    p.add_argument("--floor", action="store_true", help="also print the target's memory floor per candidate dtype")
    p.add_argument("--compile", action="store_true",
                   help="also build each model's compiled forward where missing (minutes; cached, loaded by every run)")


def run(args: argparse.Namespace) -> int:
    from .models import kernels, probe
    from .models.errors import LoadError
    from .models.loading import load_triplet, parse_spec
    from .predict import measure

    kernels.BUILD["on"] = args.compile
    try:
        preset, refs = parse_spec(args.models)
        t = load_triplet(args.models, device="cpu", dtype="float32", backend="default")
    except (ValueError, LoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    family = preset.name if preset else ",".join(refs)
    publish = probe.reads_target({r: t.model(r) for r in ("draft", "qualifier", "target")})
    got = probe.remember(family, probe.probe_target(t.target, t.vocab_size, check_all=args.all, publish=publish))
    print(f"machine: {probe.machine_key()}; probe {got.probe_s:.1f} s; weighted = "
          + " + ".join(f"{w:g}×(k={k})" for k, w in probe.SCORE_WEIGHTS.items()))
    print(probe.table(got))
    print(f"\nchosen: {got.summary}")
    print(f"kernels: {t.kernels}")
    ran = load_triplet(args.models, device="cpu")  # under this choice: every role checked on the forward it runs
    roles = (probe.cached_choice(family) or got).roles
    for role, rec in roles.items():
        print(f"{role} ({ran.path} forward): {rec['bitwise_passes']}/{rec['passes']} passes bitwise equal to its "
              f"one-token steps, max logit difference {rec['max_abs_diff']:.2g}, top-1 "
              f"{'always' if rec['top1'] else 'not always'} equal")
    prof = probe.cost_profile(ran)  # measured now, so that the first race does not pay for it
    print(f"cost profile: {prof['how']} ({prof['probe_s']:.1f} s), target step {prof['ms']['target']['1']:.1f} ms")
    if args.floor:
        for dt, backend in probe.candidates():
            model, _ = probe.candidate_model(t.target, dt, backend)
            f = measure.memory_floor_ms(model, backend)
            print(f"memory floor, {dt}/{backend}: {f['floor_ms']:.1f} ms ({f['mb']:.0f} MB of weights at "
                  f"{f['gb_per_s']:.1f} GB/s, the largest matrix's one-row product {f['gemv_ms']:.2f} ms)")
    return 0
