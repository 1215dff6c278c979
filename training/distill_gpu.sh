#!/usr/bin/env bash
# The draft on one CUDA GPU in a few minutes: the draft that reads the target (EAGLE-style: fresh on-policy
# answers with the target's states, trained with the training-time test over 3 draft positions), evaluated on
# the held-out prompts against the shipped one and exported over it only where held-out top-1 agreement rose.
# Resumable: the work folder keeps data and checkpoints, so a second run continues.
#   training/distill_gpu.sh            on a CUDA machine (exits 1 without CUDA)
#   training/distill_gpu.sh --dry-run  the same steps on the CPU with a tiny budget, exporting into the work
#                                     folder (never over the shipped files); part of the test suite
# Env: PYTHON (default .venv/bin/python, else python3), WORK (default distill_gpu_work), SEED (default 3),
# FMIN (minutes of generation, then of training; default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
WORK=${WORK:-distill_gpu_work}
SEED=${SEED:-3}
export HF_HUB_OFFLINE=1
if [ "${1:-}" = "--dry-run" ]; then
  DEV=cpu; OUT="$WORK/weights"
  FEAT=(--gen-batch 2 --heldout-batches 1 --max-batches 1 --max-new 8 --batch 2 --eval-every 2 --corpus none)  # not the committed corpus: its states take CPU-hours
  FMIN=0.05
else
  DEV=cuda; OUT=pyramid_demo/models/weights
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "error: CUDA is not available to $PY's torch; use --dry-run on a CPU machine" >&2
    exit 1
  fi
  FEAT=(--gen-batch 256 --rounds 6 --batch 64 --eval-every 100)
  FMIN=${FMIN:-3}
fi
F=("$PY" -m training draft-feature --work "$WORK/feature" --device "$DEV" "${FEAT[@]}")
echo "== the draft that reads the target: held-out answers and states (seed 0), on-policy ones (seed $SEED,"
echo "   $FMIN min), training over 3 draft positions ($FMIN min), evaluation, export where agreement rose"
"${F[@]}" heldout gen train export --seed "$SEED" --minutes "$FMIN" --weights-dir "$OUT" | grep -E "^(heldout|train|export|EVAL)"
echo "done: work folder $WORK/feature (learning curve in $WORK/feature/eval.json)"
