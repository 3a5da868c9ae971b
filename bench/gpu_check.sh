#!/usr/bin/env bash
# The benchmark on a CUDA machine, in under 5 minutes: SmolLM2 (the embedded default model if it
# is cached, else random weights of its shape) and random weights of LLaMA-7B's shapes, bf16
# through the scheduler's paged KV cache, then 1, 8 and 64 users at once. Reports
# tok/s and the fraction of the copy bandwidth (HBM) reached. Then the fixed-shape step's tests and
# the same benchmarks with it replayed as CUDA graphs (TOKEN_LAB_CUDA_GRAPHS=1).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
if "$PY" -c "from inference.loading.default_model import default_model_dir; default_model_dir(fetch=False)" 2>/dev/null; then
  SMOL=()
else
  SMOL=(--random smollm2-135m)
fi
"$PY" -m bench.run --device cuda "${SMOL[@]}" --tokens 256 --repeats 2 --no-page
"$PY" -m bench.run --device cuda --random llama-7b --tokens 128 --repeats 2 --no-page
# Many users at once through the scheduler: one batched forward a step for every run.
"$PY" -m bench.users --device cuda "${SMOL[@]}" --users 1 8 64 --tokens 128 --no-page
"$PY" -m bench.users --device cuda --random llama-7b --users 1 8 64 --tokens 128 --no-page
# CUDA graphs: the fixed-shape step's tests on the device, then the benchmarks with graphs on.
"$PY" -m pytest -q -p no:cacheprovider tests/serving/test_static_step.py tests/serving/test_cuda_graphs.py
TOKEN_LAB_CUDA_GRAPHS=1 "$PY" -m bench.run --device cuda "${SMOL[@]}" --tokens 256 --repeats 2 --no-page
TOKEN_LAB_CUDA_GRAPHS=1 "$PY" -m bench.run --device cuda --random llama-7b --tokens 128 --repeats 2 --no-page
TOKEN_LAB_CUDA_GRAPHS=1 "$PY" -m bench.users --device cuda "${SMOL[@]}" --users 1 8 64 --tokens 128 --no-page
