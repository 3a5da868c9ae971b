"""Reading a GGUF file's metadata with the gguf package, nothing trusted before it is checked:
counts, dims, types and every tensor's byte range are validated first, so a malformed file gives a
clear ModelError instead of a crash deep inside numpy."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from inference.errors import ModelError

MAX_DIMS = 4
# Types we read: F32, and those the kernels compute on their blocks (model/quant.BLOCK_TYPES). Any
# other (IQ1-IQ3, TQ, MXFP4, Q8_K, ...) is refused, naming the tensor and its type.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")


def check_type(file_name: str, tensor: str, type_id: int):
    """The tensor's gguf.GGMLQuantizationType, or a one-line refusal naming the tensor and type."""
    import gguf

    try:
        qtype = gguf.GGMLQuantizationType(int(type_id))
    except ValueError:
        raise ModelError(f"{file_name}: tensor {tensor} has unknown type id {int(type_id)}") from None
    if qtype.name not in SUPPORTED_TYPES:
        raise ModelError(f"{file_name}: tensor {tensor} has type {qtype.name}, which Token Lab does not "
                         f"compute (supported: {', '.join(SUPPORTED_TYPES)})")
    return qtype


def check_extent(file_name: str, name: str, dims: list[int], qtype, start: int, file_size: int) -> int:
    """The end byte of a tensor of `dims` (ne0 first) and `qtype` starting at `start`, checked."""
    import gguf

    if not 1 <= len(dims) <= MAX_DIMS:
        raise ModelError(f"{file_name}: tensor {name} has {len(dims)} dims (1 to {MAX_DIMS})")
    if any(d <= 0 for d in dims):
        raise ModelError(f"{file_name}: tensor {name} has a zero or negative dim {dims}")
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if dims[0] % block:
        raise ModelError(f"{file_name}: tensor {name} row length {dims[0]} is not a multiple of "
                         f"the {qtype.name} block size {block}")
    end = start + math.prod(dims) * type_size // block
    if end > file_size:
        raise ModelError(f"{file_name}: tensor {name} data ends at byte {end}, past the end of "
                         f"the file ({file_size} bytes): the file is truncated or corrupt")
    return end


def checked_reader(path: Path):
    """A GGUFReader that validates tensor infos before the gguf package maps any data."""
    import gguf

    file_size = path.stat().st_size

    class CheckedReader(gguf.GGUFReader):
        def _build_fields(self, offs, count):
            if int(count) > file_size // 16:  # each key/value needs well over 16 bytes
                raise ModelError(f"{path.name}: header claims {int(count)} metadata keys, "
                                 "more than the file can hold")
            return super()._build_fields(offs, count)

        def _get_field_parts(self, orig_offs, raw_type):
            # An array needs at least one byte per item: a larger count would loop for ever.
            if raw_type == gguf.GGUFValueType.ARRAY:
                count = self._get(orig_offs + 4, np.uint64)
                if len(count) != 1 or int(count[0]) > file_size - orig_offs:
                    raise ModelError(f"{path.name}: a metadata array at byte {orig_offs} claims more "
                                     "items than the file can hold")
            return super()._get_field_parts(orig_offs, raw_type)

        def _build_tensor_info(self, offs, count):
            if int(count) > file_size // 24:  # each tensor info needs at least 24 bytes
                raise ModelError(f"{path.name}: header claims {int(count)} tensors, "
                                 "more than the file can hold")
            return super()._build_tensor_info(offs, count)

        def _build_tensors(self, start_offs, fields):
            for field in fields:
                _check_tensor_info(path.name, field, start_offs, file_size)
            return super()._build_tensors(start_offs, fields)

    try:
        return CheckedReader(str(path))
    except ModelError:
        raise
    except Exception as e:  # the reader raises ValueError, IndexError, KeyError... on bad bytes
        raise ModelError(f"{path.name}: not a valid GGUF file ({type(e).__name__}: {e})") from None


def _check_tensor_info(file_name: str, field, start_offs: int, file_size: int) -> None:
    _, name_data, n_dims, dims, raw_type, offset = field.parts
    name = bytes(name_data).decode("utf-8", errors="replace")
    if int(n_dims[0]) > MAX_DIMS:
        raise ModelError(f"{file_name}: tensor {name} has {int(n_dims[0])} dims (at most {MAX_DIMS})")
    qtype = check_type(file_name, name, int(raw_type[0]))
    check_extent(file_name, name, [int(d) for d in dims], qtype, start_offs + int(offset[0]), file_size)


# ---------------------------------------------------------------- metadata

class Meta:
    def __init__(self, reader, file_name: str):
        self.reader, self.file_name = reader, file_name

    def get(self, key: str, default=None, kind: type | None = None):
        field = self.reader.get_field(key)
        if field is None:
            return default
        try:
            value = field.contents()
        except Exception as e:
            raise ModelError(f"{self.file_name}: metadata {key} is unreadable ({e})") from None
        if kind is not None and not isinstance(value, kind):
            raise ModelError(f"{self.file_name}: metadata {key} should be {kind.__name__}, "
                             f"got {type(value).__name__}")
        return value

    def require(self, key: str, kind: type):
        value = self.get(key, kind=kind)
        if value is None:
            raise ModelError(f"{self.file_name}: required metadata {key} is missing")
        return value

    def array(self, key: str, item: type, n: int | None = None) -> list | None:
        value = self.get(key, kind=list)
        if value is None:
            return None
        if not all(isinstance(v, item) and (item is bool or not isinstance(v, bool)) for v in value):
            raise ModelError(f"{self.file_name}: metadata {key} should be an array of "
                             f"{item.__name__}")
        if n is not None and len(value) != n:
            raise ModelError(f"{self.file_name}: metadata {key} has {len(value)} entries, "
                             f"expected {n}")
        return value
