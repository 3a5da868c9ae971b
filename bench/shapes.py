"""Published model shapes with random weights: speed measurements of models we cannot download
(bench.run --random, bench.users --random, bench/gpu_check.sh, and bench.gguf_shape's files)."""

from __future__ import annotations

import torch

from inference.serving.engine import Engine

RANDOM_SHAPES = {  # Hugging Face config fields of models measured with random weights
    "llama-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096),
    # Llama-3.2-1B without its llama3 RoPE scaling (a speed measurement: the scaling changes no shape).
    "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                         rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0, tie_word_embeddings=True),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024),
}


def random_engine(name: str, device: str, dtype: str) -> Engine:
    """An engine with random weights of a published shape, built on the device (no checkpoint)
    and a byte tokenizer: for speed measurements of models we cannot download."""
    from inference.model.config import ModelConfig
    from inference.device import resolve_device, resolve_dtype
    from inference.model.transformer import Transformer
    from inference.loading.tokenizer import Tokenizer

    cfg = ModelConfig.from_hf_dict(RANDOM_SHAPES[name])
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    g = torch.Generator(device=dev).manual_seed(0)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in Transformer(cfg).state_dict().items()}
    state = {k: (torch.randn(shape, generator=g, device=dev, dtype=dt) * 0.02 if len(shape) == 2
                 else torch.ones(shape, device=dev, dtype=dt))
             for k, shape in shapes.items() if not (cfg.tie_word_embeddings and k == "output.weight")}
    model = Transformer.from_state_dict(cfg, state, dev, dt)
    table = [bytes([i % 256]) for i in range(cfg.vocab_size)]
    tok = Tokenizer(encode_fn=lambda text: list(text.encode("utf-8")), token_bytes=table,
                    raw_pieces=[t.decode("latin-1") for t in table], bos_id=None, eos_ids=(),
                    add_bos=False, special_tokens={}, chat_template=None, kind="bytes")
    return Engine(model, tok, f"{name} (random weights)")
