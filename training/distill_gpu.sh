#!/usr/bin/env bash
# The proposers on one CUDA GPU in about 10 minutes: the draft that reads the target (EAGLE-style: fresh
# on-policy answers with the target's states, trained with the training-time test over 3 draft positions),
# then the qualifier student (fresh answers, trained further from the shipped weights); each is evaluated on
# the held-out prompts against the shipped one and exported over it only where held-out top-1 agreement
# rose. Resumable: the work folder keeps data and checkpoints, so a second run continues.
#   training/distill_gpu.sh            on a CUDA machine (exits 1 without CUDA)
#   training/distill_gpu.sh --dry-run  the same steps on the CPU with a tiny budget, exporting into the work
#                                     folder (never over the shipped files); part of the test suite
# Env: PYTHON (default .venv/bin/python, else python3), WORK (default distill_gpu_work), SEED (default 3),
# FMIN (the feature draft's minutes of generation, then of training; default 3),
# GEN_MIN / TRAIN_MIN (the qualifier's generation / training minutes; default 1.5 / 1.5).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
WORK=${WORK:-distill_gpu_work}
SEED=${SEED:-3}
export HF_HUB_OFFLINE=1
if [ "${1:-}" = "--dry-run" ]; then
  DEV=cpu; OUT="$WORK/weights"
  HELD=(--heldout-batches 1 --gen-batch 2 --max-new 8)
  GEN=(--max-batches 1 --gen-batch 2 --max-new 8 --minutes 1)
  TRAIN=(--batch 2 --minutes 0.1 --eval-every 2 --ckpt-every 2 --warmup 1)
  EVAL=(--eval-seqs 2)
  FEAT=(--gen-batch 2 --heldout-batches 1 --max-batches 1 --max-new 8 --batch 2 --eval-every 2 --corpus none)  # not the committed corpus: its states take CPU-hours
  FMIN=0.05
else
  DEV=cuda; OUT=pyramid_demo/models/weights
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "error: CUDA is not available to $PY's torch; use --dry-run on a CPU machine" >&2
    exit 1
  fi
  HELD=(--heldout-batches 2 --gen-batch 64)
  GEN=(--gen-batch 256 --rounds 4 --minutes "${GEN_MIN:-1.5}")
  TRAIN=(--batch 32 --minutes "${TRAIN_MIN:-1.5}" --eval-every 50 --ckpt-every 25)
  EVAL=()
  FEAT=(--gen-batch 256 --rounds 6 --batch 64 --eval-every 100)
  FMIN=${FMIN:-3}
fi
F=("$PY" -m training draft-feature --work "$WORK/feature" --device "$DEV" "${FEAT[@]}")
echo "== F. the draft that reads the target: held-out answers and states (seed 0), on-policy ones (seed $SEED,"
echo "     $FMIN min), training over 3 draft positions ($FMIN min), evaluation, export where agreement rose"
"${F[@]}" heldout gen train export --seed "$SEED" --minutes "$FMIN" --weights-dir "$OUT" | grep -E "^(heldout|train|export|EVAL)"
D=("$PY" -m training distill --work "$WORK" --device "$DEV")
echo "== 1. held-out answers (the same held-out prompts as every run: seed 0)"
"${D[@]}" heldout --seed 0 "${HELD[@]}"
echo "== 2. on-policy training answers (seed $SEED)"
"${D[@]}" gen --seed "$SEED" "${GEN[@]}"
for role in qualifier; do  # the draft that reads the target (above) replaces the independent draft
  echo "== 3. train the $role from the shipped weights"
  "${D[@]}" train --role "$role" --init shipped --seed "$SEED" --lr 3e-4 --lr-min 2e-5 --loss kl+js \
    --kl-frac 0.5 --mse 3 "${TRAIN[@]}"
done
echo "== 4. held-out agreement: the new checkpoints and the shipped students"
"${D[@]}" eval --ckpt best "${EVAL[@]}" > "$WORK/eval_ckpt.log"
"${D[@]}" eval --shipped "${EVAL[@]}" > "$WORK/eval_shipped.log"
echo "== 5. export where agreement rose (into $OUT)"
for role in $("$PY" - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
new, old = (json.load(open(f"{w}/eval_{k}.json")) for k in ("ckpt", "shipped"))
for role in ("qualifier",):
    a, b = new[f"{role}_vs_target"]["top1_match"], old[f"{role}_vs_target"]["top1_match"]
    print(f"{role}: held-out top-1 agreement {b:.4f} shipped -> {a:.4f} new", file=sys.stderr)
    if a > b:
        print(role)
PY
); do
  "${D[@]}" export --role "$role" --ckpt best --weights-dir "$OUT"
done
echo "done: work folder $WORK (learning curves in $WORK/ckpt/*_last.pt, state['evals'])"
