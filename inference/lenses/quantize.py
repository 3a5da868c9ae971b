"""A float32 model's weights quantized on request, as llama.cpp's `quantize --pure` does: every
2-D weight matrix (the embedding and the LM head included) into one type's blocks, each row on
its own, exactly the bytes gguf's numpy quantizer writes; norms and biases stay float32. The
quantized model is a Transformer on those blocks (model/quant.py's QuantWeight), computing with
the default products (model/products.py), as a GGUF file in that type would.

Row by row quantization makes a fused matrix (q/k/v, gate/up) the blocks of its parts stacked,
so the blocks are the ones each Hugging Face tensor would get (tests check every block).
"""

from __future__ import annotations

import numpy as np
import torch

from inference.errors import InputError
from inference.model.config import ModelConfig
from inference.model.layers import Embedding, Linear
from inference.model.products import resolve_products
from inference.model.quant import Q4_0, Q4_1, Q5_0, Q8_0, Part, QuantWeight
from inference.model.transformer import Transformer

# The types the engine quantizes to on request: name -> ggml's type id. (gguf's numpy code
# quantizes these; the K-quants it does not.)
TYPES = {"q8_0": Q8_0, "q5_0": Q5_0, "q4_1": Q4_1, "q4_0": Q4_0}
BLOCK = 32  # weights a block, for each of TYPES


def block_bytes(qtype: int) -> int:
    """The bytes of one block of 32 weights in the type (gguf's table)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    return GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]


def quantize_matrix(w: torch.Tensor, qtype: int) -> QuantWeight:
    """w (out, in) float32 as `qtype`'s blocks, each row alone, as gguf's quantize writes them."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    rows, cols = w.shape
    if cols % BLOCK:
        raise InputError(f"a weight's rows hold {cols} values, not whole blocks of {BLOCK}: this model cannot be "
                         "quantized to these types")
    blocks = quantize(w.detach().to(torch.float32).contiguous().numpy(), GGMLQuantizationType(qtype))
    data = torch.from_numpy(np.ascontiguousarray(blocks.view(np.uint8).reshape(rows, -1)))  # (rows, row bytes)
    return QuantWeight([Part(qtype, data)], cols)


def quantized_state(model: Transformer, qtype: int) -> dict[str, torch.Tensor | QuantWeight]:
    """The model's weights under its own names: each matrix of a Linear or the Embedding in
    `qtype`'s blocks (a tied LM head once, as the embedding), every other tensor a float32 copy."""
    if model.quantized:
        raise ValueError("quantize a float32 model: this one computes on blocks already")
    matrices = {name + ".weight" for name, m in model.named_modules() if isinstance(m, (Linear, Embedding))}
    out: dict[str, torch.Tensor | QuantWeight] = {}
    for name, t in model.state_dict().items():
        if name == "output.weight" and model.cfg.tie_word_embeddings:
            continue  # from_state_dict ties it to the embedding's blocks
        out[name] = quantize_matrix(t, qtype) if name in matrices and t.dim() == 2 else \
            t.detach().to(torch.float32).clone()
    return out


def quantized_model(model: Transformer, qtype: int, products: str = "auto") -> Transformer:
    """A Transformer on `qtype`'s blocks of a float32 model's weights (on the CPU, float32
    activations), with `products` (model/products.py: "auto", "integer" or "float32")."""
    cpu = torch.device("cpu")
    return Transformer.from_state_dict(model.cfg, quantized_state(model, qtype), cpu, torch.float32,
                                       products=resolve_products(products, cpu))


def quantized_bytes(cfg: ModelConfig, qtype: int) -> int:
    """What a model quantized to `qtype` holds: its matrices in blocks, the rest float32."""
    n, h = cfg.param_counts(), cfg.hidden_size
    attention = cfg.n_layers * (h * (cfg.q_dim + 2 * cfg.kv_dim) + cfg.q_dim * h)  # (its biases stay float32)
    matrices = attention + n["ffn"] + n["embedding"] + n["lm_head"]
    return matrices // BLOCK * block_bytes(qtype) + (n["total"] - matrices) * 4


def largest_matrix(cfg: ModelConfig) -> int:
    """The values of the model's largest matrix (the embedding, mostly): one float32 copy of it
    is made while it is quantized."""
    return max(cfg.vocab_size * cfg.hidden_size, 2 * cfg.intermediate_size * cfg.hidden_size,
               (cfg.q_dim + 2 * cfg.kv_dim) * cfg.hidden_size)
