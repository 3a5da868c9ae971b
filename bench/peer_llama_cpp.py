"""llama-cpp-python on a GGUF file, measured in a process of its own, in its own virtual
environment (built from PyPI: `pip install llama-cpp-python` compiles llama.cpp for this machine
in a few minutes; bench/run.py finds it at $TOKEN_LAB_LLAMA_PYTHON or
~/.cache/token-lab/llama-venv/bin/python). It imports nothing of ours: the prompt ids come in a
JSON file, our tokenizer's, so both read the same tokens.

    LLAMA_PYTHON bench/peer_llama_cpp.py FILE.gguf IDS.json TOKENS THREADS   # then "round" lines

Prints one JSON line when ready (after a warm-up round), then one per round: TTFT at 128 and 512
prompt tokens (the prompt's evaluation) and greedy decode tok/s after the 32-token prompt.
"""

from __future__ import annotations

import json
import sys
import time

from peer_protocol import serve  # beside this file (run as a script: bench/ is on the path)


def main() -> int:
    import llama_cpp

    path, ids_file, tokens, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ids = {int(k): v for k, v in json.loads(open(ids_file).read()).items()}  # prompt length -> ids
    llm = llama_cpp.Llama(path, n_ctx=1024, n_threads=threads, n_threads_batch=threads, verbose=False)

    def measure() -> dict:
        out = {}
        for n in (128, 512):
            llm.reset()
            t = time.perf_counter()
            llm.eval(ids[n])
            out[f"ttft_{n}_ms"] = 1000 * (time.perf_counter() - t)
        llm.reset()
        n, t0, step_ms, last = 0, None, [], None
        for _ in llm.generate(ids[32], temp=0.0, top_k=1):
            now = time.perf_counter()
            if t0 is None:  # the prompt is evaluated and the first token out: decode starts here
                t0 = last = now
                continue
            step_ms.append(1000 * (now - last))
            last = now
            n += 1
            if n >= tokens - 1:
                break
        out["decode_tok_s"] = n / (time.perf_counter() - t0)
        step_ms.sort()
        out["p50_ms"], out["p95_ms"] = step_ms[len(step_ms) // 2], step_ms[int(0.95 * (len(step_ms) - 1))]
        return out

    return serve(measure, {"version": llama_cpp.__version__, "threads": threads})


if __name__ == "__main__":
    raise SystemExit(main())
