#!/usr/bin/env bash
# Grow the committed token-id corpus (pyramid_demo/models/weights/corpus/) in the background, and train on it.
#   training/corpus_grow.sh start [MINUTES] [more draft-feature args]   on-policy generation (nice 19, one thread)
#   training/corpus_grow.sh train [MINUTES] [more draft-feature args]   train the feature draft on every shard,
#                                                                      from the shipped weights (CPU-minutes);
#                                     the held-out set (128 fp32 answers) is made first where feature_work lacks it
#   training/corpus_grow.sh pause | resume | stop | status
# Each job writes its pid file under ~/.cache/pyramid_demo/background/ (PYRAMID_DEMO_CACHE moves it) and removes
# it at exit; a benchmark (`models.background.paused`) stops every live job with SIGSTOP while it times.
# stop sends SIGTERM: the generator first writes the answers it has finished as one more shard.
# A restart continues with a fresh seed (`corpus_gen.next_seed`). PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DIR=${PYRAMID_DEMO_CACHE:-$HOME/.cache/pyramid_demo}/background
LOGS=${CORPUS_LOGS:-feature_work}
mkdir -p "$LOGS"
cmd=${1:-status}; shift || true
pids() { for f in "$DIR"/*.pid; do [ -e "$f" ] && cat "$f"; done; }
case "$cmd" in
  start)
    min=${1:-600}; shift || true
    OMP_NUM_THREADS=1 nohup nice -n 19 "$PY" -m training draft-feature grow --threads 1 --gen-batch 64 \
      --mix 1.0 --minutes "$min" "$@" >> "$LOGS/corpus_grow.log" 2>&1 &
    echo "generator started (log $LOGS/corpus_grow.log, pid file $DIR/corpus_grow-PID.pid)";;
  train)
    min=${1:-60}; shift || true
    OMP_NUM_THREADS=1 nohup nice -n 19 "$PY" -m training draft-feature heldout train --threads 1 --init shipped \
      --passes 6 --deep-frac 0.25 --batch 16 --lr 5e-4 --lr-min 2e-5 --eval-every 100 \
      --minutes "$min" "$@" >> "$LOGS/corpus_train.log" 2>&1 &
    echo "training started (log $LOGS/corpus_train.log, pid file $DIR/corpus_train-PID.pid)";;
  pause) for p in $(pids); do kill -STOP "$p" && echo "paused $p"; done;;
  resume) for p in $(pids); do kill -CONT "$p" && echo "resumed $p"; done;;
  stop) for p in $(pids); do kill -CONT "$p"; kill -TERM "$p" && echo "stopping $p"; done;;
  status) for f in "$DIR"/*.pid; do [ -e "$f" ] && echo "$(basename "$f" .pid): pid $(cat "$f") $(ps -o stat= -p "$(cat "$f")" || echo gone)"; done
          "$PY" -m training draft-feature corpus 2>/dev/null | tail -n +1 || true;;
  *) echo "usage: $0 start|train|pause|resume|stop|status"; exit 2;;
esac
