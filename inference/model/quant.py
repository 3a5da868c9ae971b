"""A weight kept in a GGUF file's own quantized blocks (kernels/quant.c reads them).

The numbers are still the file's model: a product on the blocks dequantizes each row exactly as
gguf's `dequantize` does and sums it in the float32 kernels' order, so it gives the float32
product of the dequantized matrix. Without the compiled kernels the same blocks are dequantized
by gguf's numpy code, a tile at a time, and multiplied by torch (slower; the same numbers within
float32 rounding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from inference.model import kernels

# ggml's type ids (gguf.GGMLQuantizationType) the kernels read in their blocks; any other type
# is expanded to float32 at load (a float32 part of the weight).
F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 8, 12, 13, 14, 30
BLOCK_TYPES = {F16: "F16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q8_0: "Q8_0",
               Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K", BF16: "BF16"}
PART_FIELDS = 4  # type, rows, address, bytes per row: quant.c's P_* order
TILE_BYTES = 8 << 20  # float32 rows dequantized at a time for a product of many rows (a prefill)


@dataclass
class Part:
    """Consecutive rows of a weight in one type: (rows, row_bytes) uint8 blocks, or (rows, in) float32.
    `release`, where the data lies in a mapped file, gives its pages back once they are copied."""
    type: int
    data: torch.Tensor
    release: Callable[[], object] | None = None

    def copied(self) -> None:
        """The data has been copied elsewhere: a mapped file's pages go back to the system."""
        if self.release is not None:
            self.release()

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


class QuantWeight:
    """An (out, in) weight as parts stacked by rows, each in the file's blocks or float32; `desc`
    is the int64 table quant.c reads (out, in, parts, then each part's type, rows, address,
    bytes per row)."""

    def __init__(self, parts: list[Part], in_features: int):
        for p in parts:
            if p.type != F32 and p.type not in BLOCK_TYPES:
                raise ValueError(f"type {p.type} is not read in its blocks")
            if p.type == F32 and (p.data.dtype != torch.float32 or p.data.shape[1] != in_features):
                raise ValueError("a float32 part must be (rows, in) float32")
            if not p.data.is_contiguous():
                raise ValueError("a part's data must be contiguous")
        self.parts, self.in_features = parts, in_features
        self.out_features = sum(p.rows for p in parts)
        fields = [self.out_features, in_features, len(parts)]
        for p in parts:
            fields += [p.type, p.rows, p.data.data_ptr(), p.nbytes // p.rows]
        self.desc = torch.tensor(fields, dtype=torch.int64)

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    @property
    def nbytes(self) -> int:
        """The bytes a product reads: what the blocks take."""
        return sum(p.nbytes for p in self.parts)

    def types(self) -> list[str]:
        return [BLOCK_TYPES.get(p.type, "F32") for p in self.parts]

    @classmethod
    def of_float(cls, w: torch.Tensor) -> "QuantWeight":
        """A float32 matrix as one part: stacked with blocks where a fused weight mixes them."""
        return cls([Part(F32, w.to(torch.float32).contiguous())], w.shape[1])

    @classmethod
    def bfloat16(cls, w: torch.Tensor) -> "QuantWeight":
        """w (out, in) rounded to bfloat16, read by the kernels as 2-byte rows: a decode copy."""
        return cls([Part(BF16, w.to(torch.bfloat16).contiguous().view(torch.uint8))], w.shape[1])

    def moved(self, put) -> "QuantWeight":
        """The same weight with each part's data replaced by put(data) (a copy elsewhere)."""
        parts = []
        for p in self.parts:
            parts.append(Part(p.type, put(p.data)))
            p.copied()
        return QuantWeight(parts, self.in_features)

    @classmethod
    def cat(cls, weights: list["QuantWeight"]) -> "QuantWeight":
        """Weights stacked by rows (a fused q/k/v or gate/up), neighbouring parts of one type merged."""
        parts: list[Part] = []
        for w in weights:
            for p in w.parts:
                if parts and parts[-1].type == p.type:
                    parts[-1], first = Part(p.type, torch.cat([parts[-1].data, p.data])), parts[-1]
                    first.copied()
                    p.copied()
                else:
                    parts.append(p)
        return cls(parts, weights[0].in_features)

    # ---------------------------------------------------------------- reading
    def rows(self, begin: int, end: int) -> torch.Tensor:
        """Rows begin..end-1 dequantized: float32 (end - begin, in)."""
        y = kernels.dequant(self.desc, begin, end, self.in_features)
        return y if y is not None else self._rows_numpy(begin, end)

    def _rows_numpy(self, begin: int, end: int) -> torch.Tensor:
        """What the kernels do without them: gguf's own dequantization."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        out, first = [], 0
        for p in self.parts:
            lo, hi = max(begin, first) - first, min(end, first + p.rows) - first
            if lo < hi:
                block = p.data[lo:hi]
                if p.type == F32:
                    out.append(block)
                else:
                    w = dequantize(block.numpy(), GGMLQuantizationType(p.type))  # (hi - lo, in)
                    out.append(torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)))
            first += p.rows
        return torch.cat(out) if len(out) > 1 else out[0].clone()

    def dequantize(self) -> torch.Tensor:
        """The whole weight in float32 (out, in)."""
        return self.rows(0, self.out_features)

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ids (...) dequantized: float32 (..., in); an embedding's lookup."""
        flat = ids.reshape(-1)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.out_features):
            raise IndexError(f"index out of range for {self.out_features} rows")
        y = kernels.gather(self.desc, flat, self.in_features)
        if y is None:
            y = torch.stack([self._rows_numpy(i, i + 1)[0] for i in flat.tolist()]) if flat.numel() \
                else torch.empty(0, self.in_features)
        return y.view(*ids.shape, self.in_features)

    def matmul(self, x: torch.Tensor, kernel_rows: int) -> torch.Tensor:
        """x (..., in) float32 -> (..., out) = x @ W^T. Up to kernel_rows rows on the blocks (each
        row the same bits as alone); more (a prefill) as float32 tiles of dequantized rows times
        torch's matmul: the tiles cost a dequantization of the weight per call, and the product
        runs at float32 matmul speed."""
        x2 = x.reshape(-1, self.in_features)  # (rows, in)
        y = kernels.qrows(self.desc, x2, self.out_features) if x2.shape[0] <= kernel_rows else None
        if y is None:
            y = torch.empty(x2.shape[0], self.out_features, dtype=torch.float32)
            step = max(1, TILE_BYTES // (4 * self.in_features))
            for o in range(0, self.out_features, step):
                end = min(o + step, self.out_features)
                y[:, o:end] = x2 @ self.rows(o, end).t()  # (rows, end - o)
        return y.view(*x.shape[:-1], self.out_features)  # (..., out)
