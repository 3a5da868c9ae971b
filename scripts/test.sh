#!/usr/bin/env bash
# Install everything the test suite needs, then run it. Used by the README and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install -q --disable-pip-version-check -r requirements-test.txt
# The browser tests drive Debian's chromium through Playwright (no browser download); the
# compiled decode step's test needs a C++ compiler for torch.compile's CPU code.
if { ! command -v chromium || ! command -v g++; } >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium g++ >/dev/null) \
    || echo "warning: could not install chromium and g++; their tests will be skipped" >&2
fi
exec "$PY" -m pytest -q -rs "$@"  # -rs: say why any test was skipped
