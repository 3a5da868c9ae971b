"""The layers every family shares: linear layers that keep per-phase copies of their weight,
RMSNorm, and the gated feed-forward."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from inference.model import kernels
from inference.model.config import ModelConfig
from inference.model.quant import QuantWeight


# ---------------------------------------------------------------- linear layers, per phase
DECODE_ROWS = 16  # inputs of at most this many rows are bound by the bytes of weight read
# Products of at most this many rows go through our kernels (each row the same bits as alone);
# more through oneDNN's copy, which ran 16 rows faster (bench/measured/cpu-kernels-*.md).
KERNEL_ROWS = 8
ROWS_HINT = 8  # the row count oneDNN's blocked layout is chosen for (any count runs on it)
# oneDNN, and ideep above it, keep the kernel compiled for each shape of product run (rows,
# in, out), about 0.7 MiB each on a 2-core AVX-512 Xeon, up to 1,024 of each by default: every
# new row count of a step that mixes runs and prompt chunks added ~3.5 MiB for SmolLM2's 5
# shapes, to several hundred MiB. At most this many are kept (~45 MiB), the least recently used
# dropped; a step whose shape was dropped compiles it again (a few ms a shape).
ONEDNN_CACHED_SHAPES = 64


class Linear(nn.Linear):
    """A bias-free linear layer that may keep a second copy of its weight: a low-precision one
    for few rows, or one laid out for several rows.

    A few rows times every weight matrix (decode steps, the LM head) are bound by the bytes of
    weight read; many rows (a prefill) by arithmetic, which is fastest in float32 on CPUs
    without bf16 units. With `decode_weight` set, inputs of at most DECODE_ROWS rows use it.
    Otherwise every row reads `weight` through our kernels where they are built (kernels/:
    gemv, gemm_rows, and gemm_tiles for more than KERNEL_ROWS, each row the same bits), and
    without them, with `rows_weight` set (oneDNN's layout, Transformer.keep_rows_copies), two or
    more rows use that copy.
    With `qweight` (a GGUF file's quantized blocks, model/quant.py) it holds no float32 weight.
    """

    decode_weight: torch.Tensor | QuantWeight | None = None
    rows_weight: torch.Tensor | None = None
    qweight: QuantWeight | None = None  # the GGUF file's blocks; `weight` is then None

    def reset_parameters(self) -> None:
        """Nothing: every weight comes from a checkpoint (Transformer.from_state_dict). A random
        init on the meta device imported torch's Python meta kernels: 3.8 s of every first load."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if self.qweight is not None:  # on the blocks, every row through the kernels
            return self.qweight.matmul(x)
        w = self.decode_weight
        if rows <= DECODE_ROWS and w is not None:  # a decode step's rows on the decode copy
            if isinstance(w, QuantWeight):  # a bfloat16 copy the kernels read
                return w.matmul(x, DECODE_ROWS)
            return F.linear(x.to(w.dtype), w).to(x.dtype)
        if rows == 1:  # one token: a matrix-vector product, read at the memory's pace
            y = kernels.gemv(self.weight, x.reshape(-1))  # (out_features,); None: no kernel here
            if y is None:
                y = torch.mv(self.weight, x.reshape(-1))
            return y.view(*x.shape[:-1], y.shape[-1])  # (..., out_features)
        # Every row through our kernels, a prompt's too (gemm_tiles: the same bits as gemm_rows):
        # a row's numbers do not depend on how many rows share its step.
        x2 = x.reshape(rows, x.shape[-1])  # (rows, in)
        y = kernels.gemm_rows(self.weight, x2) if rows <= KERNEL_ROWS else kernels.gemm_tiles(self.weight, x2)
        if y is not None:  # (rows, out_features)
            return y.view(*x.shape[:-1], y.shape[-1])
        if self.rows_weight is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.rows_weight, None, "none", [], "")
        return F.linear(x, self.weight)


class Embedding(nn.Embedding):
    """The token embedding table, never initialized at random (as Linear)."""

    def reset_parameters(self) -> None:
        pass


# ---------------------------------------------------------------- RMSNorm
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            # Our kernel for any number of rows: one call, not five ops, and each row's numbers
            # the same whatever rows it comes with (a decode row's alone, in a batch or a prompt).
            y = kernels.rms_norm(x, self.weight, self.eps)
            return y if y is not None else F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # Normalize in float32 whatever the weight dtype, then scale in the model dtype.
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


# ---------------------------------------------------------------- gated feed-forward
class FeedForward(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU with SiLU, GeGLU (Gemma) with tanh-approximated GELU."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ffn_dim = cfg.intermediate_size
        self.gelu = cfg.activation != "silu"
        self.act = partial(F.gelu, approximate="tanh") if self.gelu else F.silu
        # Gate and up projections fused: rows are [gate; up].
        self.w13 = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.w2 = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.w13(x)  # (bsz, T, 2 ffn_dim): [gate | up]
        y = kernels.glu(h, self.gelu)  # each row alone, whatever rows it comes with
        if y is None:
            gate, up = h.split(self.ffn_dim, dim=-1)  # each (bsz, T, ffn_dim)
            y = self.act(gate).mul_(up)
        return self.w2(y)
