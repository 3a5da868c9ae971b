"""The tensors of a GGUF file (or of its split parts), where they lie: each one's name, type,
dims and bytes, memory-mapped, read in well under a second whatever the vocabulary.

gguf's GGUFReader builds an object for every metadata value: a 262,144-token vocabulary takes
~40 s. A model's load needs only the tensor infos, so this walks the header itself, skipping each
value by its length (every count and extent checked against the file), and maps the data: no
tensor is copied until a caller copies it.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inference.errors import ModelError
from inference.loading.gguf_reader import MAX_DIMS, check_extent, check_type

# GGUF value types -> their size in bytes (8: string, 9: array)
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
SPLIT = re.compile(r"^(?P<stem>.*)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")


def split_parts(path: Path) -> list[Path]:
    """A GGUF file's parts, in order: [path] for a whole file; every -0000i-of-0000N.gguf file
    beside it for a split one (each must be there)."""
    m = SPLIT.match(path.name)
    if not m:
        return [path]
    n = int(m["n"])
    parts = [path.with_name(f"{m['stem']}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
    absent = [p.name for p in parts if not p.is_file()]
    if absent:
        raise ModelError(f"{path.name}: split GGUF file part {absent[0]} is missing")
    return parts


@dataclass
class TensorInfo:
    name: str
    qtype: object  # gguf.GGMLQuantizationType
    dims: tuple[int, ...]  # ne0 (the row length) first, as the file lists them
    data: np.ndarray  # the tensor's bytes, uint8, memory-mapped

    @property
    def shape(self) -> tuple[int, ...]:
        """Rows first, as torch lays the tensor out."""
        return tuple(reversed(self.dims))


_U64 = struct.Struct("<Q")


class _Cursor:
    def __init__(self, buf, name: str):
        self.buf, self.pos, self.name = buf, 0, name

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise ModelError(f"{self.name}: not a valid GGUF file: its header runs past the end of the file "
                             f"(at byte {self.pos}): it is truncated or corrupt")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return bytes(self.take(self.unpack("<Q"))).decode("utf-8", errors="replace")

    def value(self, kind: int):
        """A value of `kind`; arrays are skipped (None), scalars and strings returned."""
        if kind in SCALAR_FORMATS:
            return self.unpack(SCALAR_FORMATS[kind])
        if kind == 8:
            return self.string()
        if kind != 9:
            raise ModelError(f"{self.name}: metadata value of unknown type {kind} at byte {self.pos}")
        item, count = self.unpack("<I"), self.unpack("<Q")
        if count > len(self.buf) - self.pos:
            raise ModelError(f"{self.name}: a metadata array at byte {self.pos} claims more items than the file can hold")
        if item in SCALAR_SIZES:
            self.take(count * SCALAR_SIZES[item])
        elif item == 8:  # strings (a vocabulary's: ~10^5), skipped length by length in one tight loop
            buf, pos, end = self.buf, self.pos, len(self.buf)
            for _ in range(count):
                if pos + 8 > end:
                    pos = end + 1  # past the end: refused below
                    break
                pos += 8 + _U64.unpack_from(buf, pos)[0]
            self.take(pos - self.pos)  # refuses an array that runs past the end of the file
        else:  # arrays of arrays: walked one by one
            for _ in range(count):
                self.value(item)
        return None


def read_index(path: Path) -> tuple[dict[str, object], dict[str, TensorInfo]]:
    """(scalar metadata, tensors by name) of one GGUF file; the tensors' bytes memory-mapped."""
    size = path.stat().st_size
    if size < 24:  # the magic, version and two counts; numpy cannot map an empty file
        raise ModelError(f"{path.name}: not a valid GGUF file: {size} bytes, shorter than a GGUF header")
    data = np.memmap(path, dtype=np.uint8, mode="c")  # copy-on-write: torch takes it, nothing is written
    cur = _Cursor(memoryview(data), path.name)
    if bytes(cur.take(4)) != b"GGUF":
        raise ModelError(f"{path.name}: not a valid GGUF file (its magic is not 'GGUF')")
    version, n_tensors, n_kv = cur.unpack("<I"), cur.unpack("<Q"), cur.unpack("<Q")
    if version not in (2, 3):
        raise ModelError(f"{path.name}: not a valid GGUF file: version {version} (we read versions 2 and 3)")
    if n_kv > size // 16 or n_tensors > size // 24:
        raise ModelError(f"{path.name}: not a valid GGUF file: its header claims {n_kv} keys and {n_tensors} "
                         f"tensors, more than the file's {size} bytes can hold")
    meta = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.unpack("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.unpack("<I")
        if n_dims > MAX_DIMS:
            raise ModelError(f"{path.name}: tensor {name} has {n_dims} dims (at most {MAX_DIMS})")
        dims = tuple(cur.unpack("<Q") for _ in range(n_dims))
        infos.append((name, dims, check_type(path.name, name, cur.unpack("<I")), cur.unpack("<Q")))
    align = int(meta.get("general.alignment") or 32)
    start = -(-cur.pos // align) * align
    tensors = {}
    for name, dims, qtype, offset in infos:
        end = check_extent(path.name, name, list(dims), qtype, start + offset, size)
        tensors[name] = TensorInfo(name, qtype, dims, data[start + offset:end])
    return meta, tensors


def read_tensors(path: Path) -> dict[str, TensorInfo]:
    """Every tensor of a GGUF file and of the other parts of a split one, by name."""
    out: dict[str, TensorInfo] = {}
    for part in split_parts(path):
        _, tensors = read_index(part)
        twice = set(tensors) & set(out)
        if twice:
            raise ModelError(f"{part.name}: tensor {sorted(twice)[0]} is also in another part")
        out.update(tensors)
    return out
