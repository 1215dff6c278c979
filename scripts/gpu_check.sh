#!/usr/bin/env bash
# One command on a CUDA machine: the tests marked `cuda`, then a short bench of every method on the
# offline family on cuda in fp16 and bf16, printed as one table.
#   scripts/gpu_check.sh            on a machine with CUDA (exits 1 without it)
#   scripts/gpu_check.sh --dry-run  the CPU side: the same steps on tiny-random, cpu, fp32/bf16, 8 tokens
# Env: PYTHON (default .venv/bin/python, else python3), OUT (default gpu_check_out), TOKENS, PROMPTS, DTYPES (dry run).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
OUT=${OUT:-gpu_check_out}
if [ "${1:-}" = "--dry-run" ]; then
  MODELS=tiny-random DEVICE=cpu DTYPES=${DTYPES:-"float32 bfloat16"} TOKENS=${TOKENS:-8} PROMPTS=${PROMPTS:-1}
  TESTS=tests/test_cuda.py  # where the cuda tests live; collecting only it keeps the dry run short
  echo "dry run: the CPU side only (tiny-random on cpu). Without --dry-run on a GPU machine: $PY -m pytest -q -m cuda" \
       "tests/, then bench --models smollm2-offline --device cuda --dtype float16, then bfloat16"
else
  MODELS=smollm2-offline DEVICE=cuda DTYPES="float16 bfloat16" TOKENS=${TOKENS:-64} PROMPTS=${PROMPTS:-3}
  TESTS=tests/
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || { echo "error: CUDA is not available to $PY's torch; use --dry-run on a CPU machine" >&2; exit 1; }
fi
export HF_HUB_OFFLINE=1
mkdir -p "$OUT"
echo "== 1. tests marked cuda (skipped without CUDA)"
echo "+ $PY -m pytest -q -m cuda $TESTS"
"$PY" -m pytest -q -m cuda "$TESTS" -p no:cacheprovider
echo "== 2. exactness: each role's k-token passes against one-token steps (k = 2 … 17), on the forward it runs, per device and dtype"
"$PY" - "$MODELS" "$DEVICE" $DTYPES <<'PY' | tee "$OUT/exactness.md"
import sys, torch
from pyramid_demo.models.checks import check_family, describe
from pyramid_demo.models.loading import load_triplet
models, device, dtypes = sys.argv[1], sys.argv[2], sys.argv[3:]
devices = [device] + (["mps"] if device != "cpu" and torch.backends.mps.is_available() else [])
print("| device | dtype | role | bitwise passes | max abs diff | top-1 always equal | meaning |")
print("|---|---|---|---|---|---|---|")
for dev in devices:
    for dt in dtypes:
        t = load_triplet(models, device=dev, dtype=dt)
        for role, r in check_family({r: t.model(r) for r in ("draft", "qualifier", "target")}, t.vocab_size).items():
            print(f"| {dev} | {dt} | {role} | {r['bitwise_passes']}/{r['passes']} | {r['max_abs_diff']:.3g} | {r['top1']} "
                  f"| {describe(r) if role == 'target' else ''} |")
PY
echo "== 3. bench: every method, $MODELS on $DEVICE, $DTYPES, $TOKENS new tokens, $PROMPTS prompt(s)"
for dt in $DTYPES; do
  cmd=("$PY" -m pyramid_demo bench --models "$MODELS" --device "$DEVICE" --dtype "$dt" --methods ar,sd,fsd,psd_a,psd_f
       --peers "" --limit "$PROMPTS" --max-new-tokens "$TOKENS" --warmup-tokens 4 --no-progress --out "$OUT/$dt")
  echo "+ ${cmd[*]}"
  "${cmd[@]}" > "$OUT/$dt.log" 2>&1 || { tail -20 "$OUT/$dt.log" >&2; exit 1; }
done
echo "== 4. table"
"$PY" - "$OUT" $DTYPES <<'PY'
import json, sys
out, dtypes = sys.argv[1], sys.argv[2:]
print("| dtype | method | tok/s | × AR | acc. Q | acc. T | device |")
print("|---|---|---|---|---|---|---|")
for dt in dtypes:
    d = json.load(open(f"{out}/{dt}/results.json"))
    for row in d["summary"]:
        f = lambda k: "–" if row.get(k) is None else f"{row[k]:.2f}"
        print(f"| {dt} | {row['method']} | {row['tokens_per_s']:.1f} | {f('speedup_vs_ar')} | "
              f"{f('acceptance_qualifier')} | {f('acceptance_target')} | {d['meta']['device']} |")
PY
