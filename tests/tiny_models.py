"""Tiny LLaMA checkpoints built in the tests: real Hugging Face directories with random weights."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a little model that predicted the next token.",
    "今天天气真好，我们去公园散步吧。",
    "我喜欢学习语言模型。天气很好。",
    "Emoji are fun 😀 🎉 🚀 and so is text.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Paris is the capital of France. London is the capital of England.",
    "Numbers 0123456789 and symbols !?@#$%^&*() appear too.",
] * 20

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

BASE = dict(vocab_size=384, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=2, model_type="llama", hidden_act="silu")

CONFIGS = {
    "mha": {},
    "gqa_tied": dict(num_key_value_heads=2, tie_word_embeddings=True),
    "llama3_rope": dict(num_key_value_heads=1, rope_theta=500000.0, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64)),
    "linear_headdim": dict(num_key_value_heads=2, head_dim=24,
                           rope_scaling=dict(type="linear", factor=2.0)),
}


def train_sentencepiece(vocab_size: int) -> bytes:
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAIN_TEXT), model_writer=out, vocab_size=vocab_size,
        model_type="bpe", byte_fallback=True, character_coverage=0.9995,
        user_defined_symbols=["<|im_start|>", "<|im_end|>"],
        bos_id=1, eos_id=2, unk_id=0, pad_id=-1, hard_vocab_limit=False, minloglevel=2,
        normalization_rule_name="identity", remove_extra_whitespaces=False)  # as LLaMA's
    return out.getvalue()


def random_hf_weights(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh

    def w(*shape, scale=0.08):
        return torch.randn(*shape, generator=g) * scale

    sd = {"model.embed_tokens.weight": w(v, h, scale=0.2), "model.norm.weight": 1 + w(h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd.update({
            p + "input_layernorm.weight": 1 + w(h), p + "post_attention_layernorm.weight": 1 + w(h),
            p + "self_attn.q_proj.weight": w(nh * hd, h), p + "self_attn.k_proj.weight": w(nkv * hd, h),
            p + "self_attn.v_proj.weight": w(nkv * hd, h), p + "self_attn.o_proj.weight": w(h, nh * hd),
            p + "mlp.gate_proj.weight": w(f, h), p + "mlp.up_proj.weight": w(f, h),
            p + "mlp.down_proj.weight": w(h, f),
        })
    if not cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = w(v, h)
    return sd


def make_tiny_model(root: Path, name: str = "mha", seed: int = 0, sp_model: bytes | None = None,
                    tokenizer_json: str | None = None, dir_name: str | None = None, **overrides) -> Path:
    """Write a complete Hugging Face directory for config `name` under root/(dir_name or name).

    With tokenizer_json (a byte-level BPE) the directory has tokenizer.json instead of a
    sentencepiece tokenizer.model, and the vocabulary is the BPE's.
    """
    cfg = {**BASE, **CONFIGS[name], **overrides}
    d = Path(root) / (dir_name or name)
    d.mkdir(parents=True, exist_ok=True)
    if tokenizer_json:
        cfg["vocab_size"] = len(json.loads(tokenizer_json)["model"]["vocab"])
    write_tokenizer(d, sp_model or (None if tokenizer_json else train_sentencepiece(cfg["vocab_size"])),
                    tokenizer_json)
    (d / "config.json").write_text(json.dumps(cfg))
    save_file({k: t.contiguous() for k, t in random_hf_weights(cfg, seed).items()},
              str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def write_tokenizer(d: Path, sp_model: bytes | None, tokenizer_json: str | None = None) -> None:
    """A tokenizer (sentencepiece, or a byte-level BPE's tokenizer.json), its config and sampling defaults."""
    if tokenizer_json:
        (d / "tokenizer.json").write_text(tokenizer_json)
        tok_cfg = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False}
    else:
        (d / "tokenizer.model").write_bytes(sp_model)
        tok_cfg = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
                   "added_tokens_decoder": {"3": {"content": "<|im_start|>", "special": True},
                                            "4": {"content": "<|im_end|>", "special": True}}}
    (d / "tokenizer_config.json").write_text(json.dumps({**tok_cfg, "chat_template": CHATML}))
    (d / "generation_config.json").write_text(json.dumps({"temperature": 0.7, "top_p": 0.9}))



def without_chat_template(src: Path, dst: Path) -> Path:
    """A copy of a tiny model's directory whose tokenizer has no chat template (chat mode is
    refused for it)."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


def offered(dirs: dict[str, Path]):
    """inference.serving.models.Models offering these tiny models by label (the first the
    default), each loaded on its first use."""
    from inference.serving.engine import Engine
    from inference.serving.models import Models
    return Models(list(dirs), lambda spec, pool_mib: Engine.from_hf_dir(
        dirs[spec], device="cpu", dtype="float32", kv_pool_mib=pool_mib or 8), needs=lambda spec: 1)
