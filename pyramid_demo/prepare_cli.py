"""`python -m pyramid_demo prepare`, setup's once-per-machine step: compiled passes, the family's checks and costs."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from .models import runtime
from .models.errors import LoadError
from .models.loading import load_triplet, planned


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default="smollm2-offline", help="a preset or draft,qualifier,target")
    p.add_argument("--no-compile", action="store_true", help="build no compiled pass (every role runs eager)")
    p.add_argument("--build", help=argparse.SUPPRESS)  # ROLE:PLAN: build that one package and stop (a worker)


def run(args: argparse.Namespace) -> int:
    try:
        t = load_triplet(args.models, device="cpu")
    except (ValueError, LoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.build:
        role, plan = args.build.split(":")
        runtime.build_package(t.model(role), plan)
        return 0
    print(f"machine: {runtime.cpu_class()}, torch {runtime.machine()['torch']}, {runtime.machine()['threads']} threads")
    if not args.no_compile:
        roles: list[str] = []  # the packages a run loads: per distinct model
        for r in ("target", "qualifier", "draft"):
            if all(t.model(r) is not t.model(o) for o in roles):
                roles.append(r)
        built = _build_missing(args.models, [(r, p) for r in roles for p in runtime.missing_packages(t.model(r))])
        for role in roles:
            print(f"{role}: {runtime.ensure_package(t.model(role))}{built.get(role, '')}")
        t = planned(t)  # the same decision a run makes, now that the packages exist
    print(f"runs: {t.runs}")
    rec = runtime.measure_family(t)
    for role, r in rec["checks"].items():
        trees = r.get("trees")
        print(
            f"{role}: {r['bitwise_passes']}/{r['passes']} passes bitwise equal to one-token steps, max |Δlogit| "
            f"{r['max_abs_diff']:.2g}, top-1 {'always' if r['top1'] else 'not always'} equal"
            + (f"; trees {trees['bitwise_passes']}/{trees['passes']}" if trees else "")
        )
    ms = rec["profile"]["ms"]
    print(
        "ms per forward (k=1 / 5 / 9): "
        + "; ".join(
            f"{r} {ms[r]['1']:.1f} / {ms[r]['5']:.1f} / {ms[r]['9']:.1f}" for r in ("draft", "qualifier", "target")
        )
    )
    print(f"recorded in {runtime.manifest_path()} ({rec['measure_s']:.0f} s)")
    return 0


def _build_missing(spec: str, jobs: list[tuple[str, str]]) -> dict[str, str]:
    """Build each (role, plan) package in its own worker process, one per core (a compile runs on one); per role, what
    the builds took. Workers keep the threads a run uses: inductor writes that count into the kernels."""

    def one(job: tuple[str, str]) -> tuple[str, str]:
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "pyramid_demo", "prepare", "--models", spec, "--build", ":".join(job)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        ok = "" if done.returncode == 0 else f", failed: {last[:160]}"
        return job[0], f"{job[1]} {time.perf_counter() - t0:.0f} s{ok}"

    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    out: dict[str, list[str]] = {}
    with ThreadPoolExecutor(workers) as pool:
        for role, note in pool.map(one, sorted(jobs, key=lambda j: j[1] != "few")):  # the slowest first
            out.setdefault(role, []).append(note)
    return {role: f" (built: {', '.join(notes)})" for role, notes in out.items()}
