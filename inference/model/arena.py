"""One block of memory for a model's weights, asked of the operating system in 2 MiB pages.

A decode step reads every weight once, from DRAM. With 4 KiB pages that stream crosses a page,
and misses the TLB, every 4 KiB: on a 2-vCPU Xeon (Linux, transparent huge pages on "madvise")
two threads summing 540 MB read 22-24 GB/s in 4 KiB pages and 37-40 GB/s in 2 MiB pages
(bench/measured/cpu-quant-smollm2-135m.md). The weights are copied into the arena in the order a
step reads them; where the system has no huge pages (another OS, THP "never") the arena is
plain memory and nothing else changes.
"""

from __future__ import annotations

import ctypes
import sys

import torch

HUGE_PAGE = 2 << 20
ALIGN = 64  # each tensor starts on a cache line (and a float's or an int64's boundary)
MADV_DONTNEED, MADV_HUGEPAGE = 4, 14  # Linux's <sys/mman.h>
PAGE = 4096


def advise_huge_pages(address: int, nbytes: int) -> bool:
    """Ask Linux to back [address, address + nbytes) with huge pages when first touched.
    False where it cannot (not Linux, or the kernel refuses): the memory works the same."""
    if not sys.platform.startswith("linux") or nbytes <= 0:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(nbytes), MADV_HUGEPAGE) == 0
    except (OSError, AttributeError):
        return False


def release_pages(address: int, nbytes: int) -> bool:
    """Give back the pages wholly inside [address, address + nbytes) of a private mapping of a
    file never written to: they leave the process's resident memory, and a later read maps them
    from the file again (the same bytes). False where it cannot (not Linux)."""
    start, end = -(-address // PAGE) * PAGE, (address + nbytes) // PAGE * PAGE
    if not sys.platform.startswith("linux") or end <= start:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_DONTNEED) == 0
    except (OSError, AttributeError):
        return False


def stored_size(t: torch.Tensor) -> int:
    """The bytes t takes in an arena: its own, to the next cache line."""
    return -(-t.numel() * t.element_size() // ALIGN) * ALIGN


class Arena:
    """nbytes of memory, 2 MiB-aligned and advised into huge pages before any page is touched;
    `put` copies tensors in one after another."""

    def __init__(self, nbytes: int):
        size = -(-max(nbytes, 1) // HUGE_PAGE) * HUGE_PAGE  # whole huge pages
        self._buf = torch.empty(size + HUGE_PAGE, dtype=torch.uint8)  # untouched: no page in memory yet
        self._next = self._start = (-self._buf.data_ptr()) % HUGE_PAGE  # the first 2 MiB boundary
        self._end = self._start + nbytes
        self.huge_pages = advise_huge_pages(self._buf.data_ptr() + self._start, size)

    @property
    def address(self) -> int:
        return self._buf.data_ptr() + self._start

    def empty(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """The arena's next bytes as an uninitialized contiguous tensor; it keeps the arena alive."""
        n = dtype.itemsize * torch.Size(shape).numel()
        if self._next + n > self._end:
            raise ValueError(f"the arena has {self._end - self._next} bytes left, not {n}")
        view = self._buf[self._next:self._next + n].view(dtype).view(shape)
        self._next += stored_size(view)
        return view

    def put(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of t in the arena: same shape and dtype, contiguous."""
        return self.empty(t.shape, t.dtype).copy_(t)
