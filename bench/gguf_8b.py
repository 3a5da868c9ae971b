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
import subprocess
import sys
import time
from pathlib import Path

# Llama-3.1-8B's shapes
VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 128256, 4096, 14336, 32, 32, 8, 128
THETA, ROPE = 500000.0, dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)


def _tensors():
    """(name, shape rows first) of every tensor, in llama.cpp's order."""
    yield "token_embd.weight", (VOCAB, HIDDEN)
    for i in range(LAYERS):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", (HIDDEN,)
        yield p + "attn_q.weight", (HEADS * HEAD_DIM, HIDDEN)
        yield p + "attn_k.weight", (KV_HEADS * HEAD_DIM, HIDDEN)
        yield p + "attn_v.weight", (KV_HEADS * HEAD_DIM, HIDDEN)
        yield p + "attn_output.weight", (HIDDEN, HEADS * HEAD_DIM)
        yield p + "ffn_norm.weight", (HIDDEN,)
        yield p + "ffn_gate.weight", (FFN, HIDDEN)
        yield p + "ffn_up.weight", (FFN, HIDDEN)
        yield p + "ffn_down.weight", (HIDDEN, FFN)
    yield "output_norm.weight", (HIDDEN,)
    yield "output.weight", (VOCAB, HIDDEN)


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


def _vocabulary():
    """A small trained byte-level BPE (Llama 3's split), filled to Llama 3's 128,256 tokens."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    text = ["The quick brown fox jumps over the lazy dog. Once upon a time, a model predicted the next token."] * 50
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                                      show_progress=False))
    spec = json.loads(tok.to_str())
    tokens = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    tokens += [f"fill{i}" for i in range(VOCAB - len(tokens))]  # never reached by a merge
    return tokens, merges


def build(out_dir: Path, llama_python: str) -> None:
    import gguf
    import numpy as np

    out_dir.mkdir(parents=True, exist_ok=True)
    f16, q4 = out_dir / "llama-3.1-8b-random-F16.gguf", out_dir / "llama-3.1-8b-random-Q4_K_M.gguf"
    if not f16.exists():
        w = gguf.GGUFWriter(str(f16), "llama")
        w.add_block_count(LAYERS), w.add_context_length(131072), w.add_embedding_length(HIDDEN)
        w.add_feed_forward_length(FFN), w.add_head_count(HEADS), w.add_head_count_kv(KV_HEADS)
        w.add_rope_dimension_count(HEAD_DIM), w.add_rope_freq_base(THETA), w.add_layer_norm_rms_eps(1e-5)
        w.add_vocab_size(VOCAB), w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        tokens, merges = _vocabulary()
        w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre("llama-bpe"), w.add_token_list(tokens)
        w.add_token_types([3 if t.startswith("<|") else 1 for t in tokens]), w.add_token_merges(merges)
        w.add_bos_token_id(0), w.add_eos_token_id(1)
        factors = _rope_factors()
        w.add_tensor_info("rope_freqs.weight", factors.shape, np.dtype(np.float32), factors.nbytes)
        for name, shape in _tensors():
            dt = np.float16 if len(shape) == 2 else np.float32
            w.add_tensor_info(name, shape, np.dtype(dt), int(np.prod(shape)) * np.dtype(dt).itemsize)
        w.write_header_to_file(), w.write_kv_data_to_file(), w.write_ti_data_to_file()
        w.write_tensor_data(factors)
        rng = np.random.default_rng(0)
        for name, shape in _tensors():
            if len(shape) == 1:
                w.write_tensor_data((1 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
                continue
            # float16 of random sign and mantissa, exponent 2^-6: |w| in [0.0156, 0.031)
            bits = (rng.integers(0, 1 << 16, size=shape, dtype=np.uint16) & 0x83FF) | (9 << 10)
            w.write_tensor_data(bits.view(np.float16))
            print(f"wrote {name}", file=sys.stderr, flush=True)
        w.close()
    if not q4.exists():
        script = ("import sys, llama_cpp; p = llama_cpp.llama_model_quantize_default_params(); "
                  "p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M; p.nthread = 2; "
                  "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))")
        subprocess.run([llama_python, "-c", script, str(f16), str(q4)], check=True)
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
