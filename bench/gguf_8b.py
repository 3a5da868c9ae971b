"""A 7-8B GGUF file on this machine: memory, cache and speed of loading and decoding it.

    .venv/bin/python bench/gguf_8b.py build DIR LLAMA_PYTHON   # random Llama-3.1-8B shapes, F16, then
                                                              # Q4_K_M by llama.cpp's own quantizer
    .venv/bin/python bench/gguf_8b.py measure DIR [TOKENS]     # ours: load, resident memory, cache, tok/s
    LLAMA_PYTHON bench/gguf_8b.py native DIR [TOKENS]          # llama.cpp's tok/s on the same file

The weights are random (no model hub): numbers of memory and speed, not of text. The F16 file is
written a tensor at a time (16 GB never in memory); LLAMA_PYTHON is a virtual environment with
llama-cpp-python (its `llama_model_quantize`).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

# Llama-3.1-8B's shapes
VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 128256, 4096, 14336, 32, 32, 8, 128
THETA, ROPE = 500000.0, dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
HF = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
          num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, max_position_embeddings=131072, rope_theta=THETA, rms_norm_eps=1e-5)


def _rope_factors():
    import math

    import numpy as np
    freqs = 1.0 / (THETA ** (np.arange(0, HEAD_DIM, 2, dtype=np.float32) / HEAD_DIM))
    old, low, high, factor = ROPE["original_max_position_embeddings"], ROPE["low_freq_factor"], ROPE["high_freq_factor"], ROPE["factor"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        smooth = (old / wavelen - low) / (high - low)
        out.append(1 if wavelen < old / high else factor if wavelen > old / low else 1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def build(out_dir: Path, llama_python: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.gguf_shape import quantize, write_f16

    out_dir.mkdir(parents=True, exist_ok=True)
    f16, q4 = out_dir / "llama-3.1-8b-random-F16.gguf", out_dir / "llama-3.1-8b-random-Q4_K_M.gguf"
    if not f16.exists():
        write_f16(f16, HF, _rope_factors(), log=lambda name: print(f"wrote {name}", file=sys.stderr, flush=True))
    if not q4.exists():
        quantize(llama_python, f16, q4, "Q4_K_M")
    print(json.dumps({"f16_bytes": f16.stat().st_size, "q4_k_m_bytes": q4.stat().st_size}))


def _status(key: str) -> int:
    """A /proc/self/status figure in bytes (VmRSS: resident now, VmHWM: the peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def measure(out_dir: Path, tokens: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ["XDG_CACHE_HOME"] = str(out_dir / "cache")
    from inference.loading import progress
    from inference.sampling.params import SamplingParams
    from inference.serving.engine import Engine

    q4 = out_dir / "llama-3.1-8b-random-Q4_K_M.gguf"
    said = []
    t0 = time.perf_counter()
    with progress.listening(lambda text: said.append((round(time.perf_counter() - t0, 1), text))):
        engine = Engine.load(str(q4), kv_pool_mib=256)
    loaded_s = time.perf_counter() - t0
    rss, peak = _status("VmRSS"), _status("VmHWM")
    pool = engine.scheduler.pool
    pool_bytes = sum(t.numel() * t.element_size() for t in (pool.k, pool.v))
    cache = sum(f.stat().st_size for f in (out_dir / "cache").rglob("*") if f.is_file())
    params = SamplingParams(temperature=0.0, max_new_tokens=tokens)
    engine.eos_ids = set()
    events = list(engine.generate_ids(list(range(100, 132)), params, top_n=5))
    done = events[-1]
    file_bytes = q4.stat().st_size
    print(json.dumps({
        "file_bytes": file_bytes, "load_s": round(loaded_s, 1), "rss_after_load": rss, "peak_rss": peak,
        "kv_pool_bytes": pool_bytes, "rss_over_file_plus_pool": round(rss / (file_bytes + pool_bytes), 3),
        "cache_bytes": cache, "cache_over_file": round(cache / file_bytes, 4), "quantized": engine.model.quantized,
        "one_call_step": engine.model.decode_step is not None, "decode_tok_s": round(done.decode_tokens_per_s, 3),
        "generated": done.generated_tokens, "progress_lines": len(said), "first_progress": said[:3], "last_progress": said[-2:],
        "max_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
    engine.close()


def native(out_dir: Path, tokens: int) -> None:
    import llama_cpp

    q4 = out_dir / "llama-3.1-8b-random-Q4_K_M.gguf"
    llm = llama_cpp.Llama(str(q4), n_ctx=512, n_threads=2, n_threads_batch=2, verbose=False)
    n, t0 = 0, None
    for _ in llm.generate(list(range(100, 132)), temp=0.0, top_k=1):
        if t0 is None:
            t0 = time.perf_counter()
            continue
        n += 1
        if n >= tokens - 1:
            break
    print(json.dumps({"llama_cpp": llama_cpp.__version__, "decode_tok_s": round(n / (time.perf_counter() - t0), 3)}))


if __name__ == "__main__":
    cmd, where = sys.argv[1], Path(sys.argv[2])
    if cmd == "build":
        build(where, sys.argv[3])
    elif cmd == "measure":
        measure(where, int(sys.argv[3]) if len(sys.argv) > 3 else 8)
    else:
        native(where, int(sys.argv[3]) if len(sys.argv) > 3 else 8)
