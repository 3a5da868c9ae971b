#!/usr/bin/env bash
# Install everything the test suite needs, then run it: `./tokenlab test` (the README's and CI's) runs it
# in .venv, with the test tools installed already; PYTHON=.venv/bin/python bash scripts/test.sh, in a venv of yours.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# uv where this Python has it (several times faster), else pip; TOKENLAB_INSTALLED=1: ./tokenlab test
# installed them already (and its stamp says they are current).
if [ "${TOKENLAB_INSTALLED:-0}" = 1 ]; then
  :
elif "$PY" -m uv --version >/dev/null 2>&1; then
  "$PY" -m uv pip install -q --python "$PY" -r requirements-test.txt
else
  "$PY" -m pip install -q --disable-pip-version-check -r requirements-test.txt
fi
# The browser tests drive Debian's chromium through Playwright (no browser download), its
# headless build where installed (tests/browser.py: less CPU a page). No test here compiles; g++
# is for vLLM's compiled mode (VLLM_COMPILE=1 in scripts/test_vllm.sh).
if { ! command -v chromium || ! command -v chromium-headless-shell || ! command -v g++; } >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-headless-shell g++ \
       >/dev/null) || echo "warning: could not install chromium and g++; the browser tests will be skipped" >&2
  elif ! command -v chromium >/dev/null 2>&1; then
    echo "note: no chromium, and installing it takes root and apt-get: the browser tests will be skipped" >&2
  fi
fi
# Two workers, each taking whole files (a file's fixtures, such as a served page, are built once):
# many tests wait on a browser or a server, so two overlap even on two cores. -n 0: one process.
# -rs: say why any test was skipped; --durations=20: the 20 slowest, to tell where the time goes.
# The fast part alone, for the edit-test loop: bash scripts/test.sh -m "not browser and not slow".
exec "$PY" -m pytest -q -rs -n 2 --dist loadfile --durations=20 "$@"
