#!/usr/bin/env bash
# The benchmark on a CUDA machine: SmolLM2 (the embedded default model if it is cached, else random
# weights of its shape), random weights of Llama-3.2-1B's and LLaMA-7B's shapes, bf16 through the
# scheduler's paged KV cache; one run and 8 runs at once (bench.run --rows 8), then 1, 8 (and 64)
# users at once. Reports tok/s, the fraction of the copy bandwidth (HBM) reached, and each step
# against its read-bound time: the bytes a step of 1 or 8 rows reads at the HBM read bandwidth
# measured beside each round (a sum over 4 GiB), over the step's time; the goal at 1 row is >= 65%.
# First with eager steps (TOKEN_LAB_CUDA_GRAPHS=0), then the fixed-shape step's tests and the same
# benchmarks with its steps replayed as CUDA graphs (the default on a GPU). Run on an H100 on
# 2026-12-06 in two parts (bench/measured/h100-cuda-graphs.md); the 7B and 64-user parts were not run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-bench/results}
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
if "$PY" -c "from inference.loading.default_model import default_model_dir; default_model_dir(fetch=False)" 2>/dev/null; then
  SMOL=() SMOL_STEM=""
else
  SMOL=(--random smollm2-135m) SMOL_STEM="-smollm2-135m"
fi
RUN=(--device cuda --repeats 2 --no-page --rows 8 --read-mib 4096 --out "$OUT")
USERS=(--device cuda --tokens 128 --no-page --read-mib 4096 --out "$OUT")
export TOKEN_LAB_CUDA_GRAPHS=0
"$PY" -m bench.run "${RUN[@]}" "${SMOL[@]}" --tokens 256
"$PY" -m bench.run "${RUN[@]}" --random llama-3.2-1b --tokens 256
"$PY" -m bench.run "${RUN[@]}" --random llama-7b --tokens 128
# Many users at once through the scheduler: one batched forward a step for every run.
"$PY" -m bench.users "${USERS[@]}" "${SMOL[@]}" --users 1 8 64
"$PY" -m bench.users "${USERS[@]}" --random llama-3.2-1b --users 1 8
"$PY" -m bench.users "${USERS[@]}" --random llama-7b --users 1 8 64
# The fraction of the HBM read bandwidth each step reached, at 1 and 8 rows.
"$PY" -m bench.report --goal 0.65 "$OUT/bench$SMOL_STEM.json" "$OUT/bench-llama-3.2-1b.json" \
  "$OUT/users$SMOL_STEM.json" "$OUT/users-llama-3.2-1b.json"
# CUDA graphs: the fixed-shape step's tests on the device, then the benchmarks with graphs on.
unset TOKEN_LAB_CUDA_GRAPHS
"$PY" -m pytest -q -p no:cacheprovider tests/serving/test_static_step.py tests/serving/test_cuda_graphs.py
"$PY" -m bench.run "${RUN[@]}" "${SMOL[@]}" --tokens 256
"$PY" -m bench.run "${RUN[@]}" --random llama-3.2-1b --tokens 256
"$PY" -m bench.run "${RUN[@]}" --random llama-7b --tokens 128
"$PY" -m bench.users "${USERS[@]}" "${SMOL[@]}" --users 1 8 64
"$PY" -m bench.report --goal 0.65 "$OUT/bench$SMOL_STEM.json" "$OUT/bench-llama-3.2-1b.json" "$OUT/users$SMOL_STEM.json"
