"""Writing GGUF files from tiny Hugging Face directories, as llama.cpp's converter does."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import sentencepiece as spm
from gguf.quants import quantize
from safetensors.numpy import load_file

HF_TO_GGUF = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}
BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down"}


GEMMA_BLOCK = {**BLOCK, "post_attention_layernorm": "post_attention_norm",
               "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
OLMO2_BLOCK = {**BLOCK, "post_attention_layernorm": "post_attention_norm", "post_feedforward_layernorm": "post_ffw_norm"}
EXTRA = {"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}  # Phi-3's fused, as llama.cpp names them
# HF model_type -> GGUF architecture, as llama.cpp's converter writes them (Mistral: llama)
ARCH = {"qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3", "gemma2": "gemma2", "phi3": "phi3",
        "smollm3": "smollm3", "olmo2": "olmo2", "granite": "granite"}
PERMUTED = ("llama", "granite", "smollm3")  # LlamaModel's converters interleave Q/K rows
GEMMAS = ("gemma2", "gemma3")  # llama.cpp stores their norms as 1 + w


def gguf_name(hf: str, arch: str = "llama") -> str:
    if hf in HF_TO_GGUF:
        return HF_TO_GGUF[hf]
    _, _, i, *rest = hf.split(".")
    block = {**(GEMMA_BLOCK if arch in GEMMAS else OLMO2_BLOCK if arch == "olmo2" else BLOCK), **EXTRA}
    return f"blk.{i}.{block['.'.join(rest[:-1])]}.{rest[-1]}"


def llama3_rope_factors(cfg: dict) -> np.ndarray:
    """llama.cpp's converter's rope_freqs.weight for a llama3 rope_scaling (LlamaModel)."""
    import math
    rs = cfg.get("rope_scaling") or cfg["rope_parameters"]
    base, dim = cfg.get("rope_theta") or rs["rope_theta"], cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high, old = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of Q/K rows (rotate-half -> interleaved)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# gguf cannot quantize these in numpy: random blocks, each float16 scale (at these bytes of a
# block) set so that the weights stay a model's size.
RANDOM_BLOCKS = {"Q4_K": {0: 0.01, 2: 0.01}, "Q5_K": {0: 0.01, 2: 0.01}, "Q6_K": {208: 0.01},
                 "Q2_K": {80: 0.01, 82: 0.01}, "Q3_K": {108: 0.002}, "IQ4_NL": {0: 0.002}, "IQ4_XS": {0: 0.0001}}


def random_kquant_bytes(qtype, rows: int, cols: int, rng) -> np.ndarray:
    """Random blocks of a type in RANDOM_BLOCKS (any bits are valid weights, scales and mins)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for at, scale in RANDOM_BLOCKS[qtype.name].items():
        raw[..., at:at + 2] = np.frombuffer(np.float16(scale).tobytes(), dtype=np.uint8)
    return raw.reshape(rows, cols // block * size)


def write_gguf(hf_dir: Path, out: Path, qtype: str = "F32", tokenizer: str = "llama",
               kquant: str | None = None, rng_seed: int = 0, pre: str = "gpt2", specials: dict | None = None,
               split_max_tensors: int = 0) -> dict[str, np.ndarray]:
    """Convert hf_dir to a GGUF file; return the float32 weights the file really holds (HF names).
    pre: tokenizer.ggml.pre; specials: {"bos"|"eos"|"eot"|"eom": token text} for a BPE vocabulary;
    split_max_tensors: write -0000i-of-0000N.gguf parts of at most that many tensors."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    weights = load_file(str(hf_dir / "model.safetensors"))
    rng = np.random.default_rng(rng_seed)
    arch = ARCH.get(cfg.get("model_type"), "llama")
    w = gguf.GGUFWriter(str(out), arch, split_max_tensors=split_max_tensors)
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)
    if cfg.get("head_dim"):
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    if arch in GEMMAS:
        w.add_sliding_window(cfg["sliding_window"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if arch == "granite":
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_embedding_scale(cfg["embedding_multiplier"])
        w.add_residual_scale(cfg["residual_multiplier"])
        w.add_logit_scale(cfg["logits_scaling"])
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if rs.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
    elif rs.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg))
    if arch == "phi3":  # Phi3MiniModel: the dims RoPE turns; LongRoPE's factors as tensors
        w.add_rope_dimension_count(int(rs.get("partial_rotary_factor", 1.0) * cfg["hidden_size"]) // cfg["num_attention_heads"])
        if rs.get("rope_type") == "longrope":
            import math
            original = cfg["original_max_position_embeddings"]
            w.add_rope_scaling_orig_ctx_len(original)
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(cfg["max_position_embeddings"] / original) / math.log(original)))
            w.add_tensor("rope_factors_long.weight", np.array(rs["long_factor"], dtype=np.float32))
            w.add_tensor("rope_factors_short.weight", np.array(rs["short_factor"], dtype=np.float32))
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg.get("rope_theta") or rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    _add_tokenizer(w, hf_dir, tokenizer, pre, specials)
    held = {}
    for name, t in weights.items():
        t = t.astype(np.float32)
        if arch in PERMUTED and name.endswith("q_proj.weight"):  # llama.cpp permutes LlamaModel's only
            t = permute(t, cfg["num_attention_heads"])
        elif arch in PERMUTED and name.endswith("k_proj.weight"):
            t = permute(t, cfg["num_key_value_heads"])
        elif arch in GEMMAS and name.endswith("norm.weight"):
            t = t + 1  # llama.cpp stores Gemma's (1 + w)
        kind = qtype if t.ndim == 2 else "F32"
        if kquant and t.ndim == 2 and t.shape[1] % 256 == 0:
            kind = kquant
        q = gguf.GGMLQuantizationType[kind]
        if kind == "F32":
            data = t
        elif kind in RANDOM_BLOCKS:
            data = random_kquant_bytes(q, *t.shape, rng)
        else:
            data = quantize(t, q)
        w.add_tensor(gguf_name(name, arch), data, raw_dtype=None if kind == "F32" else q)
        real = gguf.quants.dequantize(data, q).reshape(t.shape) if kind != "F32" else t
        # Undo the permutation so `held` is in Hugging Face layout, as the importer must produce.
        if arch in PERMUTED and name.endswith("q_proj.weight"):
            real = _unpermute(real, cfg["num_attention_heads"])
        elif arch in PERMUTED and name.endswith("k_proj.weight"):
            real = _unpermute(real, cfg["num_key_value_heads"])
        elif arch in GEMMAS and name.endswith("norm.weight"):
            real = real - 1
        held[name] = real.astype(np.float32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def _unpermute(w, n_head):
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _add_tokenizer(w: gguf.GGUFWriter, hf_dir: Path, kind: str, pre: str = "gpt2", specials: dict | None = None) -> None:
    tok_cfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    if kind == "llama":
        sp = spm.SentencePieceProcessor(model_file=str(hf_dir / "tokenizer.model"))
        n = sp.GetPieceSize()
        types = [2 if sp.IsUnknown(i) else 3 if sp.IsControl(i) else 6 if sp.IsByte(i)
                 else 5 if sp.IsUnused(i) else 1 for i in range(n)]
        for key, value in tok_cfg.get("added_tokens_decoder", {}).items():
            types[int(key)] = 4  # user-defined
        w.add_tokenizer_model("llama")
        w.add_token_list([sp.IdToPiece(i) for i in range(n)])
        w.add_token_scores([sp.GetScore(i) for i in range(n)])
        w.add_token_types(types)
        w.add_bos_token_id(sp.bos_id())
        w.add_eos_token_id(sp.eos_id())
        w.add_unk_token_id(sp.unk_id())
        w.add_add_bos_token(True)
    else:
        spec = json.loads((hf_dir / "tokenizer.json").read_text())
        vocab = spec["model"]["vocab"]
        tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
        merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
        special = {a["id"] for a in spec["added_tokens"] if a["special"]}
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
        w.add_token_merges(merges)
        ids = {k: vocab[t] for k, t in (specials or {"bos": "<|im_start|>", "eos": "<|im_end|>"}).items()}
        for key, tid in ids.items():
            getattr(w, f"add_{key}_token_id")(tid)
        w.add_add_bos_token("bos" in ids and bool(tok_cfg.get("add_bos_token")))
    if tok_cfg.get("chat_template"):
        w.add_chat_template(tok_cfg["chat_template"])


def train_bpe_tokenizer_json(texts: list[str], vocab_size: int, pre: str = "gpt2",
                             special_tokens: list[str] | None = None) -> str:
    """A byte-level BPE trained with the split of the family whose GGUF files name `pre`: the regex
    transformers' own GGUF loading uses for that name (not ours), or GPT-2's, or digits apart."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    tok = Tokenizer(models.BPE(ignore_merges=pre in ("llama-bpe", "tekken")))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if pre in GGUF_PRE_TOKENIZER_SPLITS:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(GGUF_PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre in ("smollm", "refact"):  # SmolLM's and StarCoder's tokenizer.json: each digit alone
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  special_tokens=special_tokens or ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok.to_str()
