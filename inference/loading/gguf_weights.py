"""A GGUF file's tensors under Hugging Face names, read where they lie: each matrix in a type the
kernels compute (model/quant.BLOCK_TYPES) as its own blocks, memory-mapped (no copy is made on
disk, and none in memory until the model lays it out); the rest in float32, tensor by tensor.

No float32 copy of a block-type matrix is made unless one is asked for (`blocks=False`: --dtype
float32, a GPU, or a CPU without the compiled kernels). Every quantized type the file may hold is
such a type: any other (IQ1-IQ3, TQ, MXFP4, Q8_K) is refused at the file's reading, naming the
tensor and its type (gguf_reader.check_type).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import torch

from inference.errors import ModelError
from inference.loading.checkpoint import expected_hf_shapes, layer_tensors
from inference.loading.gguf_config import LONGROPE, ROPE_FREQS
from inference.loading.gguf_index import TensorInfo, read_tensors
from inference.loading.progress import say
from inference.model.arena import release_pages
from inference.model.config import ModelConfig
from inference.model.family_spec import GGUF_ROLES, SPECS
from inference.model.quant import BLOCK_TYPES, Part, QuantWeight

TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
       "output.weight": "lm_head.weight"}
EXTRAS = (ROPE_FREQS, *LONGROPE)  # read into the config at import, not weights


def gguf_names(cfg: ModelConfig) -> dict[str, str]:
    """llama.cpp's tensor name -> the Hugging Face name, for every tensor cfg's family holds."""
    out = dict(TOP)
    per_layer = layer_tensors(cfg)
    for i in range(cfg.n_layers):
        for role, (suffix, _) in per_layer.items():
            kind = "bias" if suffix.endswith(".bias") else "weight"
            gguf_role = GGUF_ROLES[role.removesuffix("_bias") + "_proj" if kind == "bias" else role]
            out[f"blk.{i}.{gguf_role}.{kind}"] = f"model.layers.{i}.{suffix}"
    return out


def unpermute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE pairs -> rotate-half halves)."""
    rows = w.shape[0]
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])  # (heads, head_dim/2, 2, cols)
            .swapaxes(1, 2)  # (heads, 2, head_dim/2, cols)
            .reshape(w.shape))


def _float32(t: TensorInfo) -> np.ndarray:
    """The tensor in float32, rows first: gguf's own dequantization."""
    from gguf.quants import dequantize

    if t.qtype.name == "F32":
        return np.frombuffer(t.data, dtype=np.float32).reshape(t.shape).copy()
    if t.qtype.name == "F16":
        return np.frombuffer(t.data, dtype=np.float16).reshape(t.shape).astype(np.float32)
    rows = int(np.prod(t.shape[:-1]))
    return dequantize(np.asarray(t.data).reshape(rows, -1), t.qtype).reshape(t.shape).astype(np.float32, copy=False)


def check_tensors(tensors: dict[str, TensorInfo], cfg: ModelConfig, file_name: str) -> dict[str, str]:
    """llama.cpp's name -> the Hugging Face name, for each of the file's tensors the model reads;
    a tensor the family has not, of another shape, or missing, refused in one line."""
    names, expected = gguf_names(cfg), expected_hf_shapes(cfg)
    out = {}
    for gname, t in tensors.items():
        if gname in EXTRAS:
            continue
        name = names.get(gname)
        if name is None:
            raise ModelError(f"{file_name}: unexpected tensor {gname!r} for a {cfg.family} model")
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if t.shape != expected[name]:
            raise ModelError(f"{file_name}: tensor {gname} has shape {list(t.shape)}, the metadata "
                             f"implies {list(expected[name])}")
        out[gname] = name
    missing = sorted(set(expected) - set(out.values()))
    if missing:
        raise ModelError(f"{file_name}: tensor for {missing[0]} is missing"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return out


def read_gguf_weights(path: Path, cfg: ModelConfig, blocks: bool) -> dict[str, "torch.Tensor | QuantWeight"]:
    """The file's tensors under Hugging Face names: with `blocks`, each matrix in a type the
    kernels read as a QuantWeight over the file's bytes (Q/K rows permuted as the float32 form's,
    the only ones copied); everything else float32, one tensor at a time."""
    spec = SPECS[cfg.family]
    tensors = read_tensors(path)
    names = check_tensors(tensors, cfg, path.name)
    out: dict[str, torch.Tensor | QuantWeight] = {}
    for i, (gname, name) in enumerate(names.items()):
        say(f"reading the GGUF file's tensors: {i + 1:,} of {len(names):,}")
        t = tensors[gname]
        n_heads = {"q_proj": cfg.n_heads, "k_proj": cfg.n_kv_heads}.get(name.rsplit(".", 2)[-2]) \
            if spec.gguf_permutes_qk else None
        if blocks and len(t.shape) == 2 and int(t.qtype) in BLOCK_TYPES:
            w = np.asarray(t.data).reshape(t.shape[0], -1)  # (rows, bytes per row): a row's blocks stay together
            # The file's pages leave resident memory once the model has copied them (the mapping is
            # private and never written: a later read maps them again).
            release = partial(release_pages, w.ctypes.data, w.nbytes)
            if n_heads:
                w = unpermute_rope(w, n_heads)  # a copy, in blocks
                release()
            out[name] = QuantWeight([Part(int(t.qtype), torch.from_numpy(w), release=None if n_heads else release)], t.shape[1])
            continue
        w = _float32(t)
        release_pages(t.data.ctypes.data, t.data.nbytes)  # read: its pages go back
        if n_heads:
            w = unpermute_rope(w, n_heads)
        if cfg.norm_unit_offset and name.endswith("norm.weight"):
            w = w - 1  # llama.cpp stores Gemma's norms as 1 + w; Hugging Face's hold w
        out[name] = torch.from_numpy(np.ascontiguousarray(w))
    return out


def stored_bytes(path: Path, cfg: ModelConfig, blocks: bool) -> int:
    """What read_gguf_weights' tensors take: the blocks as stored, the rest at float32."""
    total = 0
    for t in read_tensors(path).values():
        kept = blocks and len(t.shape) == 2 and int(t.qtype) in BLOCK_TYPES
        total += t.data.nbytes if kept else 4 * int(np.prod(t.shape))
    return total


def types_held(path: Path) -> dict[str, int]:
    """The file's bytes by type (the card's "types and bytes")."""
    out: dict[str, int] = {}
    for t in read_tensors(path).values():
        out[t.qtype.name] = out.get(t.qtype.name, 0) + t.data.nbytes
    return out
