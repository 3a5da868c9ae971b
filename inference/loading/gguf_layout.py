"""A GGUF file's layout checked from its header alone: the magic and version, the metadata's keys
and values walked (strings and arrays skipped by their lengths, never decoded), the tensor table
and where each tensor's data lies, against the file's size. It reads the header and the tables
(a few megabytes for a 262,144-token vocabulary) and not a byte of tensor data: a truncated or
lying file is refused before the gguf package parses its metadata (for a large vocabulary, tens
of seconds) or anything reads its tensors.

Layout (gguf's spec): "GGUF", version (uint32, 2 or 3), tensor count and key count (uint64); each
key a string (uint64 length, bytes), its type (uint32) and value; each tensor its name, dims
(uint32 count, uint64 each), type (uint32) and offset (uint64) from the data's start, which is
the end of the table rounded up to general.alignment (32 unless the metadata says otherwise).
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

from inference.errors import ModelError

READ_AHEAD = 1 << 16  # bytes read from the file at a time
MAX_DIMS = 4
# The size in bytes of each scalar metadata type (gguf.GGUFValueType); 8 is a string, 9 an array.
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
ALIGNMENT_KEY = "general.alignment"


class _Reader:
    """The file read forward, counting what it has read; every read is checked against its size."""

    def __init__(self, f, size: int, name: str):
        self.f, self.size, self.name, self.at = f, size, name, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.at + n > self.size:
            raise ModelError(f"{self.name}: not a valid GGUF file: {what} at byte {self.at} runs past the end of "
                             f"the file ({self.size} bytes): it is truncated or corrupt")
        data = self.f.read(n)
        self.at += n
        return data

    def skip(self, n: int, what: str) -> None:
        if n < 0 or self.at + n > self.size:
            self.take(n, what)  # (raises)
        self.f.seek(n, io.SEEK_CUR)
        self.at += n

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def string(self, what: str) -> bytes:
        return self.take(self.u64(what), what)


def check_layout(path: Path) -> None:
    """ModelError if the file's header, tables or tensor data ranges do not fit it (above)."""
    import gguf

    size = path.stat().st_size
    with open(path, "rb", buffering=0) as raw:
        r = _Reader(io.BufferedReader(raw, READ_AHEAD), size, path.name)
        if r.take(4, "the magic number") != b"GGUF":
            raise ModelError(f"{path.name}: not a valid GGUF file (bad magic: it does not start with GGUF)")
        version = r.u32("the version")
        if version not in (2, 3):
            raise ModelError(f"{path.name}: GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_keys = r.u64("the tensor count"), r.u64("the key count")
        if n_keys > size // 16 or n_tensors > size // 24:  # a key needs > 16 bytes, a tensor's entry > 24
            raise ModelError(f"{path.name}: header claims {n_keys:,} metadata keys and {n_tensors:,} tensors, "
                             "more than the file can hold")
        alignment = 32
        for _ in range(n_keys):
            key = r.string("a metadata key").decode("utf-8", "replace")
            kind = r.u32(f"the type of {key}")
            if key == ALIGNMENT_KEY and kind == 4:
                alignment = r.u32(key)
            else:
                _skip_value(r, kind, key)
        tensors = []
        for _ in range(n_tensors):
            name = r.string("a tensor's name").decode("utf-8", "replace")
            n_dims = r.u32(f"tensor {name}'s dims")
            if n_dims > MAX_DIMS:
                raise ModelError(f"{path.name}: tensor {name} has {n_dims} dims (at most {MAX_DIMS})")
            dims = [r.u64(f"tensor {name}'s dims") for _ in range(n_dims)]
            tensors.append((name, dims, r.u32(f"tensor {name}'s type"), r.u64(f"tensor {name}'s offset")))
    if alignment == 0 or alignment & (alignment - 1):
        raise ModelError(f"{path.name}: {ALIGNMENT_KEY} {alignment} is not a power of two")
    start = -(-r.at // alignment) * alignment  # the tensor data's start
    for name, dims, kind, offset in tensors:
        try:
            block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise ModelError(f"{path.name}: tensor {name} has unknown type id {kind}") from None
        if any(d <= 0 for d in dims):
            raise ModelError(f"{path.name}: tensor {name} has a zero or negative dim {dims}")
        if dims[0] % block:
            raise ModelError(f"{path.name}: tensor {name} row length {dims[0]} is not a multiple of the block "
                             f"size {block}")
        n = 1
        for d in dims:
            n *= d
        end = start + offset + n // block * type_size
        if end > size:
            raise ModelError(f"{path.name}: tensor {name} data ends at byte {end}, past the end of the file "
                             f"({size} bytes): the file is truncated or corrupt")


def _skip_value(r: _Reader, kind: int, key: str) -> None:
    if kind in SCALAR:
        r.skip(SCALAR[kind], key)
    elif kind == STRING:
        r.skip(r.u64(key), key)
    elif kind == ARRAY:
        item, count = r.u32(key), r.u64(key)
        if item in SCALAR:
            r.skip(count * SCALAR[item], key)
        elif item == STRING:
            if count > (r.size - r.at) // 8:
                r.take(count * 8, key)  # (raises: each string needs its 8-byte length)
            for _ in range(count):
                r.skip(r.u64(key), key)
        else:
            raise ModelError(f"{r.name}: metadata {key} is an array of type {item}, which GGUF does not have")
    else:
        raise ModelError(f"{r.name}: metadata {key} has type {kind}, which GGUF does not have")
