#!/usr/bin/env bash
# The scripted page session of tests/page/test_session_console_browser.py, the lesson of
# tests/page/test_lesson_browser.py, the first screen and glossary of
# tests/page/test_glossary_browser.py and the constrained output and compare A/B of
# tests/page/test_constrain_compare_browser.py on the real models:
# serves the page on SmolLM2 and Gemma 3 270M (each fetched once into the cache), runs the
# session and the lesson (the page's prompt, then 今天天气真) at 1400 and 420 px on each model,
# and stops the page. The session checks no console error, no page error, no Vega warning and
# no HTTP response >= 400; screenshots land under test-results/shots/<the test's module>/.
# Chinese text needs a CJK font in the browser's machine (Debian: fonts-wqy-zenhei).
#
#   PYTHON=.venv/bin/python bash scripts/page_session.sh [PYTEST ARGS]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
LOG=$(mktemp -t token-lab-page.XXXXXX.log)
"$PY" app.py --model default --model gemma3-270m --port "$PORT" >"$LOG" 2>&1 &
APP=$!
trap 'kill "$APP" 2>/dev/null; wait "$APP" 2>/dev/null; rm -f "$LOG"' EXIT
until "$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/', timeout=2)" 2>/dev/null; do
  kill -0 "$APP" 2>/dev/null || { echo "error: the page exited while starting:" >&2; tail -n 30 "$LOG" >&2; exit 1; }
  sleep 1
done
TOKENLAB_SESSION_URL="http://127.0.0.1:$PORT" TOKENLAB_SESSION_MODELS=default,gemma3-270m \
  "$PY" -m pytest -q -n 0 -rs tests/page/test_session_console_browser.py tests/page/test_lesson_browser.py \
  tests/page/test_glossary_browser.py tests/page/test_constrain_compare_browser.py "$@"
