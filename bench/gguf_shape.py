"""A published shape (bench/shapes.py) as a GGUF file of random weights, quantized by llama.cpp's
own quantizer, then measured by bench.run: our engine, our command line on the file
(`python -m inference generate --model FILE.gguf`) and llama.cpp on the same file, rounds
alternated, each round's step against the read bandwidth measured beside it.

    TOKEN_LAB_LLAMA_PYTHON=... python -m bench.gguf_shape [--shape llama-3.2-1b] [--type Q4_K_M]
        [--dir bench/results/gguf] [--build-only] [bench.run's options: --tokens 64 --repeats 3 ...]

The F16 file is written a tensor at a time (llama-3.2-1b: 2.5 GB, its Q4_K_M ~0.8 GB; both stay
in --dir, which by default is ignored by git), then quantized by `llama_model_quantize` in the
llama.cpp build's own environment. The weights are random (no model hub): numbers of speed, not
of text. A trained byte-level BPE (Llama 3's split) of 600 tokens, filled to the shape's
vocabulary, gives both engines the same token ids.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.shapes import RANDOM_SHAPES  # noqa: E402


def tensors(hf: dict):
    """(name, shape rows first) of every tensor of a LLaMA-shaped model, in llama.cpp's order."""
    h, ffn, heads, kv = hf["hidden_size"], hf["intermediate_size"], hf["num_attention_heads"], hf["num_key_value_heads"]
    d = hf.get("head_dim") or h // heads
    yield "token_embd.weight", (hf["vocab_size"], h)
    for i in range(hf["num_hidden_layers"]):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", (h,)
        yield p + "attn_q.weight", (heads * d, h)
        yield p + "attn_k.weight", (kv * d, h)
        yield p + "attn_v.weight", (kv * d, h)
        yield p + "attn_output.weight", (h, heads * d)
        yield p + "ffn_norm.weight", (h,)
        yield p + "ffn_gate.weight", (ffn, h)
        yield p + "ffn_up.weight", (ffn, h)
        yield p + "ffn_down.weight", (h, ffn)
    yield "output_norm.weight", (h,)
    if not hf.get("tie_word_embeddings"):
        yield "output.weight", (hf["vocab_size"], h)


def vocabulary(size: int) -> tuple[list[str], list[str]]:
    """A small trained byte-level BPE (Llama 3's split), filled to `size` tokens: (tokens, merges)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    text = ["The quick brown fox jumps over the lazy dog. Once upon a time, a model predicted the next token."] * 50
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=min(600, size), show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      special_tokens=["<|begin_of_text|>", "<|end_of_text|>"]))
    spec = json.loads(tok.to_str())
    tokens = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens + [f"fill{i}" for i in range(size - len(tokens))], merges  # fillers: never reached by a merge


def write_f16(path: Path, hf: dict, rope_factors=None, log=lambda name: None) -> None:
    """An F16 GGUF file ("llama" architecture) of the shape `hf` with random weights, a tensor
    at a time: float16 of random sign and mantissa at exponent 2^-6 (|w| in [0.0156, 0.031)),
    norms near 1. rope_factors: a llama3 scaling's rope_freqs.weight, if any."""
    import gguf
    import numpy as np

    heads, h = hf["num_attention_heads"], hf["hidden_size"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(hf["num_hidden_layers"]), w.add_context_length(hf["max_position_embeddings"])
    w.add_embedding_length(h), w.add_feed_forward_length(hf["intermediate_size"])
    w.add_head_count(heads), w.add_head_count_kv(hf["num_key_value_heads"])
    w.add_rope_dimension_count(hf.get("head_dim") or h // heads)
    w.add_rope_freq_base(hf.get("rope_theta", 10000.0)), w.add_layer_norm_rms_eps(hf.get("rms_norm_eps", 1e-5))
    w.add_vocab_size(hf["vocab_size"]), w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, merges = vocabulary(hf["vocab_size"])
    w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre("llama-bpe"), w.add_token_list(tokens)
    w.add_token_types([3 if t.startswith("<|") else 1 for t in tokens]), w.add_token_merges(merges)
    w.add_bos_token_id(0), w.add_eos_token_id(1)
    if rope_factors is not None:
        w.add_tensor_info("rope_freqs.weight", rope_factors.shape, np.dtype(np.float32), rope_factors.nbytes)
    for name, shape in tensors(hf):
        dt = np.dtype(np.float16 if len(shape) == 2 else np.float32)
        w.add_tensor_info(name, shape, dt, int(np.prod(shape)) * dt.itemsize)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_ti_data_to_file()
    if rope_factors is not None:
        w.write_tensor_data(rope_factors)
    rng = np.random.default_rng(0)
    for name, shape in tensors(hf):
        if len(shape) == 1:
            w.write_tensor_data((1 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
        else:
            bits = (rng.integers(0, 1 << 16, size=shape, dtype=np.uint16) & 0x83FF) | (9 << 10)
            w.write_tensor_data(bits.view(np.float16))
        log(name)
    w.close()


def quantize(llama_python: str | Path, src: Path, dst: Path, qtype: str = "Q4_K_M", threads: int = 2) -> None:
    """llama.cpp's own quantizer (llama_model_quantize), run in the llama.cpp build's environment."""
    script = ("import sys, llama_cpp; p = llama_cpp.llama_model_quantize_default_params(); "
              f"p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_{qtype}; p.nthread = {threads}; "
              "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))")
    subprocess.run([str(llama_python), "-c", script, str(src), str(dst)], check=True)


def build(shape: str, out_dir: Path, qtype: str, llama_python: str | Path) -> Path:
    """The shape's quantized file in out_dir, written and quantized unless already there."""
    out_dir.mkdir(parents=True, exist_ok=True)
    f16, quant = out_dir / f"{shape}-random-F16.gguf", out_dir / f"{shape}-random-{qtype}.gguf"
    if not quant.exists():
        if not f16.exists():
            write_f16(f16.with_suffix(".part"), RANDOM_SHAPES[shape], log=lambda n: print(f"wrote {n}", file=sys.stderr))
            f16.with_suffix(".part").rename(f16)
        quantize(llama_python, f16, quant.with_suffix(".part"), qtype)
        quant.with_suffix(".part").rename(quant)
    return quant


def main(argv=None) -> int:
    from bench import run
    from bench.peers import llama_builds

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(RANDOM_SHAPES), default="llama-3.2-1b")
    p.add_argument("--type", default="Q4_K_M", help="llama.cpp's quantized file type (LLAMA_FTYPE_MOSTLY_...)")
    p.add_argument("--dir", default=str(ROOT / "bench" / "results" / "gguf"), help="where the files are kept")
    p.add_argument("--build-only", action="store_true", help="write and quantize the file, measure nothing")
    args, rest = p.parse_known_args(argv)
    builds = llama_builds()
    if not builds:
        raise SystemExit("no llama.cpp build: set TOKEN_LAB_LLAMA_PYTHON to llama-cpp-python's environment's python")
    quant = build(args.shape, Path(args.dir), args.type, next(iter(builds.values())))
    print(json.dumps({"file": str(quant), "bytes": quant.stat().st_size}))
    if args.build_only:
        return 0
    return run.main(["--model", str(quant), "--no-page", "--no-transformers", *rest])


if __name__ == "__main__":
    raise SystemExit(main())
