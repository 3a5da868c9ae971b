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

# ggml's type ids (gguf.GGMLQuantizationType) the kernels read in their blocks (a file's tensor of
# any other type is refused at its reading: loading/gguf_reader.check_type).
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16 = 0, 1, 2, 3, 6, 7, 8, 30
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS = 10, 11, 12, 13, 14, 20, 23
BLOCK_TYPES = {F16: "F16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q8_0: "Q8_0",
               Q2_K: "Q2_K", Q3_K: "Q3_K", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K",
               IQ4_NL: "IQ4_NL", IQ4_XS: "IQ4_XS", BF16: "BF16"}
BLOCKS_OF_256 = (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS)  # the others' blocks hold 32 weights
# A file type's integers repacked 16 rows at a time for the integer products (kernels/islices.c):
# its id there (1000 + the file's).
INT_OF = {t: 1000 + t for t in BLOCK_TYPES if t not in (F16, BF16)}
FILE_OF = {v: k for k, v in INT_OF.items()}
GROUP = 16  # rows repacked together: one output a lane of a 16-lane register
PART_FIELDS = 4  # type, rows, address, bytes per row (a repacked part's: per group): quant.c's P_* order
TILE_BYTES = 8 << 20  # float32 rows dequantized at a time for a product of many rows (a prefill)


@dataclass
class Part:
    """Consecutive rows of a weight in one type: (rows, row_bytes) uint8 blocks, (rows, in)
    float32, or a repacked type's (groups, group_bytes) uint8 for `n_rows` rows. `release`, where
    the data lies in a mapped file, gives its pages back once they are copied."""
    type: int
    data: torch.Tensor
    n_rows: int | None = None  # a repacked part's rows (its data holds whole groups of 16)
    release: Callable[[], object] | None = None

    def copied(self) -> None:
        """The data has been copied elsewhere: a mapped file's pages go back to the system."""
        if self.release is not None:
            self.release()

    @property
    def rows(self) -> int:
        return self.data.shape[0] if self.n_rows is None else self.n_rows

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    @property
    def stride(self) -> int:
        """The bytes from one row to the next (a repacked part's: from one group to the next)."""
        return self.nbytes // self.data.shape[0]

    @property
    def name(self) -> str:
        """The file's type name ("Q4_K"), a repacked one's too."""
        return BLOCK_TYPES.get(FILE_OF.get(self.type, self.type), "F32")


class QuantWeight:
    """An (out, in) weight as parts stacked by rows, each in the file's blocks or float32; `desc`
    is the int64 table quant.c reads (out, in, parts, then each part's type, rows, address,
    bytes per row)."""

    def __init__(self, parts: list[Part], in_features: int):
        for p in parts:
            if p.type != F32 and p.type not in BLOCK_TYPES and p.type not in FILE_OF:
                raise ValueError(f"type {p.type} is not read in its blocks")
            if p.type == F32 and (p.data.dtype != torch.float32 or p.data.shape[1] != in_features):
                raise ValueError("a float32 part must be (rows, in) float32")
            if not p.data.is_contiguous():
                raise ValueError("a part's data must be contiguous")
        self.parts, self.in_features = parts, in_features
        self.out_features = sum(p.rows for p in parts)
        fields = [self.out_features, in_features, len(parts)]
        for p in parts:
            fields += [p.type, p.rows, p.data.data_ptr(), p.stride]
        self.desc = torch.tensor(fields, dtype=torch.int64)

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    @property
    def nbytes(self) -> int:
        """The bytes a product reads: what the blocks take."""
        return sum(p.nbytes for p in self.parts)

    def types(self) -> list[str]:
        return [p.name for p in self.parts]

    @property
    def integer(self) -> bool:
        """Whether its products are the integer ones (a part repacked for kernels/islices.c)."""
        return any(p.type in FILE_OF for p in self.parts)

    # ---------------------------------------------------------------- the integer products' layout
    def _repackable(self) -> list[bool]:
        """Which parts repack: a type the integer products read, whole blocks of inputs, and a
        first row on a group's boundary (the products hand out rows in groups of 16)."""
        out, first = [], 0
        for p in self.parts:
            block = 256 if p.type in BLOCKS_OF_256 else 32
            out.append(p.type in INT_OF and self.in_features % block == 0 and first % GROUP == 0)
            first += p.rows
        return out

    def repacked_sizes(self) -> list[int]:
        """The bytes each part takes once repacked (repacked())."""
        return [kernels.int_bytes(p.type, p.rows, self.in_features) if r else p.nbytes
                for p, r in zip(self.parts, self._repackable())]

    def repacked(self, empty=None, put=None) -> "QuantWeight":
        """The same weight with every part the integer products read repacked for them, each in
        empty((groups, group_bytes), uint8) (an arena's; default: new memory), the other parts
        put(data) (default: as they are). The numbers the blocks hold are unchanged:
        dequantize() gives the same bits."""
        empty = empty or (lambda shape, dtype: torch.empty(shape, dtype=dtype))
        parts = []
        for p, repack in zip(self.parts, self._repackable()):
            if not repack:
                parts.append(Part(p.type, put(p.data), p.n_rows) if put else p)
                if put:
                    p.copied()
                continue
            groups = -(-p.rows // GROUP)
            data = empty((groups, kernels.int_bytes(p.type, p.rows, self.in_features) // groups), torch.uint8)
            kernels.int_repack(p.type, p.data, p.rows, self.in_features, p.stride, data)
            p.copied()  # a mapped file's pages go back as each part is repacked
            parts.append(Part(INT_OF[p.type], data, p.rows))
        return QuantWeight(parts, self.in_features)

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
            parts.append(Part(p.type, put(p.data), p.n_rows))
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
                if p.type in FILE_OF:
                    raise RuntimeError("a repacked weight is read by the compiled kernels only")
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

    def matmul(self, x: torch.Tensor, kernel_rows: int | None = None) -> torch.Tensor:
        """x (..., in) float32 -> (..., out) = x @ W^T. On the blocks through the kernels, each row
        the same bits as alone (kernel_rows: at most that many rows there); more rows, or no
        kernels, as float32 tiles of dequantized rows times torch's matmul: the tiles cost a
        dequantization of the weight per call, and the product runs at float32 matmul speed."""
        x2 = x.reshape(-1, self.in_features)  # (rows, in)
        through = self.integer or kernel_rows is None or x2.shape[0] <= kernel_rows
        y = kernels.qrows(self.desc, x2, self.out_features) if through else None
        if y is None:
            y = torch.empty(x2.shape[0], self.out_features, dtype=torch.float32)
            step = max(1, TILE_BYTES // (4 * self.in_features))
            for o in range(0, self.out_features, step):
                end = min(o + step, self.out_features)
                y[:, o:end] = x2 @ self.rows(o, end).t()  # (rows, end - o)
        return y.view(*x.shape[:-1], self.out_features)  # (..., out)
