"""llama-cpp-python on a GGUF file, measured in a process of its own, in its own virtual
environment (built from PyPI: `pip install llama-cpp-python` compiles llama.cpp for this machine,
-march=native, in a few minutes; bench/peers.py finds it at $TOKEN_LAB_LLAMA_PYTHON or
~/.cache/token-lab/llama-venv/bin/python, and a build without -march=native at
$TOKEN_LAB_LLAMA_PORTABLE_PYTHON). It imports nothing of ours: the prompt ids come in a JSON file,
our tokenizer's, so both read the same tokens.

    LLAMA_PYTHON bench/peer_llama_cpp.py FILE.gguf IDS.json TOKENS THREADS [--build native] [--one-token]

Prints one JSON line when ready (after a warm-up round: the build, its CPU features, how it feeds
a prompt), then one per "round" line: TTFT at 128 and 512 prompt tokens (the prompt's evaluation)
and greedy decode tok/s after the 32-token prompt. --one-token feeds every prompt one token at a
time (n_batch = n_ubatch = 1): the native build crashed evaluating a multi-token batch on an Intel
Xeon with AMX; decoding does not depend on how the prompt was fed.
"""

from __future__ import annotations

import argparse
import json
import time

from peer_protocol import serve  # beside this file (run as a script: bench/ is on the path)


def args_of(argv=None, extra=()) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    for name in ("gguf", "ids", "tokens", "threads", *extra):
        p.add_argument(name)
    p.add_argument("--build", default="native", help="which build this is, as bench/peers.py names it")
    p.add_argument("--one-token", action="store_true", help="feed a prompt one token at a time")
    a = p.parse_args(argv)
    a.tokens, a.threads = int(a.tokens), int(a.threads)
    return a


def build_info(a: argparse.Namespace) -> dict:
    """Which llama.cpp answers: what every figure of it records."""
    import llama_cpp
    return {"version": llama_cpp.__version__, "build": a.build, "native": a.build == "native",
            "system_info": llama_cpp.llama_print_system_info().decode().strip(),
            "prompt": "one token at a time" if a.one_token else "batched", "threads": a.threads}


def main() -> int:
    import llama_cpp

    a = args_of()
    ids = {int(k): v for k, v in json.loads(open(a.ids).read()).items()}  # prompt length -> ids
    batch = dict(n_batch=1, n_ubatch=1) if a.one_token else {}
    llm = llama_cpp.Llama(a.gguf, n_ctx=1024, n_threads=a.threads, n_threads_batch=a.threads, verbose=False, **batch)

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
            if n >= a.tokens - 1:
                break
        out["decode_tok_s"] = n / (time.perf_counter() - t0)
        step_ms.sort()
        out["p50_ms"], out["p95_ms"] = step_ms[len(step_ms) // 2], step_ms[int(0.95 * (len(step_ms) - 1))]
        return out

    return serve(measure, build_info(a))


if __name__ == "__main__":
    raise SystemExit(main())
