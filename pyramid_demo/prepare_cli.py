"""`python -m pyramid_demo prepare`, setup's once-per-machine step: compiled passes, the family's checks and costs."""
from __future__ import annotations

import argparse
import sys

from .models import runtime
from .models.errors import LoadError
from .models.loading import decided, load_triplet


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default="smollm2-offline", help="a preset or draft,qualifier,target")
    p.add_argument("--no-compile", action="store_true", help="build no compiled pass (every role runs eager)")


def run(args: argparse.Namespace) -> int:
    try:
        t = load_triplet(args.models, device="cpu")
    except (ValueError, LoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"machine: {runtime.cpu_class()}, torch {runtime.machine()['torch']}, {runtime.machine()['threads']} threads")
    if not args.no_compile:
        seen: set[int] = set()
        for role in ("target", "qualifier", "draft"):  # the package a run loads: one per distinct model
            m = t.model(role)
            if id(m) not in seen:
                seen.add(id(m))
                print(f"{role}: {runtime.ensure_package(m)}")
        t = decided(t)  # the same decision a run makes, now that the packages exist
    print(f"runs: {t.runs}")
    rec = runtime.measure_family(t)
    for role, r in rec["checks"].items():
        trees = r.get("trees")
        print(f"{role}: {r['bitwise_passes']}/{r['passes']} passes bitwise equal to one-token steps, max |Δlogit| "
              f"{r['max_abs_diff']:.2g}, top-1 {'always' if r['top1'] else 'not always'} equal"
              + (f"; trees {trees['bitwise_passes']}/{trees['passes']}" if trees else ""))
    ms = rec["profile"]["ms"]
    print("ms per forward (k=1 / 5 / 9): " + "; ".join(
        f"{r} {ms[r]['1']:.1f} / {ms[r]['5']:.1f} / {ms[r]['9']:.1f}" for r in ("draft", "qualifier", "target")))
    print(f"recorded in {runtime.manifest_path()} ({rec['measure_s']:.0f} s)")
    return 0
