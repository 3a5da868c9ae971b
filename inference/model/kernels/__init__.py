"""Hand-written CPU kernels for a decode step's few rows, compiled on first use with the
machine's C compiler and cached (kernels.c).

`decode` runs a whole decode step, every layer and the LM head, in one call
(decode_step.py says when).

Only where torch's own operators are measurably short of the hardware on a decode step's few rows
of float32 activations: `gemv` and `gemm_rows` (MKL runs SmolLM2's matrix-vector products at
50-80% of the read bandwidth), `attend` (SDPA costs ~100 us a call for one query), and where a
row takes several small operators: `rms_norm` (five), `rope_store` (seven), `glu` (three).
Each returns None where it does not apply (another dtype, device or layout), and every one of
them where there is no C compiler or TOKEN_LAB_KERNELS=0: callers then use torch's operators,
the same float32 arithmetic in another order, only slower.

They compile for this machine's CPU (-march=native); TOKEN_LAB_KERNELS_MARCH sets another
-march (x86-64-v2, say: the instruction set of an older CPU), each built and cached apart, so
the tests can check that no result depends on the vector width (tests/model/test_kernels_isa.py).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from functools import cache
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("kernels.c")
# #included by kernels.c: part of its cache key
INCLUDED = [Path(__file__).with_name(f) for f in ("tiles.c", "attention.c", "stats.c", "quant.c", "quant_simd.c", "ipack.c", "islices.c", "products.c", "step.c")]
_lock = threading.Lock()


def cache_dir() -> Path:
    from inference.paths import cache_root
    return cache_root() / "kernels"


def march() -> str:
    """The -march the kernels compile for: TOKEN_LAB_KERNELS_MARCH, else native (this CPU's)."""
    return os.environ.get("TOKEN_LAB_KERNELS_MARCH", "").strip() or "native"


def _cpu_flags() -> str:
    """What -march=native compiles for: a library built on another CPU is not reused."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))


def _build(compiler: str, target: Path) -> None:
    """Compile the source into `target`, atomically: processes starting together each build their
    own temporary file and the last rename wins, with identical contents."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        # -fopenmp links libgomp.so.1, which resolves to the one torch has loaded: one thread pool.
        subprocess.run([compiler, "-O3", f"-march={march()}", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC",
                        str(SOURCE), "-o", tmp], check=True, capture_output=True, timeout=120)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _built() -> Path | None:
    """The compiled kernels' file, built where it is not cached yet (one per source, compiler,
    CPU and -march); None where they cannot be built or are switched off."""
    if os.environ.get("TOKEN_LAB_KERNELS", "1") == "0" or platform.machine() not in ("x86_64", "AMD64", "aarch64"):
        return None
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        return None
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
        key = hashlib.sha256("\0".join([SOURCE.read_text(), *(p.read_text() for p in INCLUDED), version, _cpu_flags(), march()]).encode()).hexdigest()[:16]
        target = cache_dir() / f"kernels-{key}.so"
        with _lock:
            if not target.exists():
                _build(compiler, target)
    except (OSError, subprocess.SubprocessError):
        return None
    return target


@cache
def _library() -> ctypes.CDLL | None:
    """The compiled kernels, or None where they cannot be built or are switched off."""
    target = _built()
    if target is None:
        return None
    try:
        lib = ctypes.CDLL(str(target))  # CDLL: the GIL is released during each call
    except OSError:
        return None
    i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    signatures = {
        "token_lab_gemv": [ptr, ptr, ptr, i64, i64, i64, ctypes.c_int],
        "token_lab_gemm_rows": [ptr, ptr, ptr, i64, i64, i64, i64, i64, ctypes.c_int],
        "token_lab_gemm_tiles": [ptr, ptr, ptr, i64, i64, i64, i64, i64, ctypes.c_int],
        "token_lab_attend": [ptr, ptr, ptr, ptr, i64, ptr, i64, i64, ptr, ptr, i64,
                             i64, i64, i64, i64, i64, i64, i64, f32, f32, ctypes.c_int],
        "token_lab_rms_norm": [ptr, ptr, ptr, i64, i64, f32],
        "token_lab_rope_store": [ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64],
        "token_lab_glu": [ptr, ptr, i64, i64, ctypes.c_int, ctypes.c_int],
        "token_lab_decode": [ptr, ptr, ptr, f32, f32, i64, ctypes.c_int],
        "token_lab_top_k": [ptr, i64, i64, i64, ptr, ptr, ptr],
        "token_lab_row_sums": [ptr, ptr, i64, i64, ptr, ptr, ptr, ptr],
        "token_lab_row_stats": [ptr, i64, i64, i64, ptr, ptr, ptr, ptr, ptr, ctypes.c_int],
        "token_lab_masked_exp_sum": [ptr, i64, f32, ptr, ptr],
        "token_lab_draw_rows": [ptr, i64, i64, ptr, ptr, i64, ptr, ptr, ptr, ctypes.c_int],
        "token_lab_qrows": [ptr, ptr, ptr, i64, i64, ctypes.c_int],
        "token_lab_dequant": [ptr, i64, i64, ptr],
        "token_lab_gather": [ptr, ptr, i64, ptr],
        "token_lab_int_repack": [i64, ptr, i64, i64, i64, ptr],
        "token_lab_set_slices": [ctypes.c_int],
    }
    for name, args in signatures.items():
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = None
    lib.token_lab_int_bytes.argtypes, lib.token_lab_int_bytes.restype = [i64, i64, i64], i64
    lib.token_lab_int_simd.argtypes, lib.token_lab_int_simd.restype = [], ctypes.c_char_p
    return lib


def library_path() -> Path | None:
    """The file the kernels are loaded from (built on the first call); None where there are none."""
    lib = _library()
    return None if lib is None else Path(lib._name)


def available() -> bool:
    """Whether the kernels are built and loaded (builds them on the first call)."""
    return _library() is not None


def gemv(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
    """weight (out, in) float32 on the CPU with unit column stride, x (in,) -> (out,) = weight @ x;
    None where the kernel does not apply (another dtype or layout, or no kernel)."""
    lib = _library()
    if lib is None or not _f32_cpu(weight, x) or weight.dim() != 2 or weight.stride(1) != 1:
        return None
    x = x.contiguous()
    y = torch.empty(weight.shape[0], dtype=torch.float32)
    lib.token_lab_gemv(weight.data_ptr(), x.data_ptr(), y.data_ptr(), weight.shape[0], weight.shape[1],
                       weight.stride(0), torch.get_num_threads())
    return y


def _f32_cpu(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)


def gemm_rows(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
    """weight (out, in), x (rows, in) -> (rows, out) = x @ weight^T, each row the same bits as
    gemv gives it alone; None where the kernel does not apply."""
    lib = _library()
    if (lib is None or not _f32_cpu(weight, x) or weight.dim() != 2 or weight.stride(1) != 1
            or x.dim() != 2 or x.stride(1) != 1):
        return None
    y = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    lib.token_lab_gemm_rows(weight.data_ptr(), x.data_ptr(), y.data_ptr(), x.shape[0], weight.shape[0],
                            weight.shape[1], weight.stride(0), x.stride(0), torch.get_num_threads())
    return y


def gemm_tiles(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
    """weight (out, in), x (rows, in) -> (rows, out) = x @ weight^T for any number of rows, each
    output the same bits as gemm_rows gives it (dot()'s order): a prompt's rows through the same
    sums as a decode row's. None where the kernel does not apply."""
    lib = _library()
    if (lib is None or not _f32_cpu(weight, x) or weight.dim() != 2 or weight.stride(1) != 1
            or x.dim() != 2 or x.stride(1) != 1):
        return None
    y = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    lib.token_lab_gemm_tiles(weight.data_ptr(), x.data_ptr(), y.data_ptr(), x.shape[0], weight.shape[0],
                             weight.shape[1], weight.stride(0), x.stride(0), torch.get_num_threads())
    return y


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, first: torch.Tensor,
           lengths: torch.Tensor, blocks: torch.Tensor | None = None, block_size: int = 1,
           max_length: int | None = None, softcap: float | None = None) -> torch.Tensor | None:
    """One query per row: q (B, heads, d) -> (B, heads, d), softmax(q k^T * scale) v with row b
    seeing its keys first[b] .. lengths[b] - 1 (int64 (B,) each). Keys and values: with `blocks`
    (B, nb) int64, each row's blocks of the pool k, v (slots, kv_heads, d) in position order (a
    1-D (nb,) table: one for every row, as a prompt's rows share their run's); without, one row's
    keys (L, kv_heads, d) read in place (any strides but unit over d). A row's output is the same
    bits either way. max_length: lengths.max(), if the caller knows it; softcap: scores capped
    softcap tanh(s / softcap) (Gemma 2). None where the kernel does not apply."""
    lib = _library()
    if lib is None or not _f32_cpu(q, k, v) or k.stride(-1) != 1 or v.stride(-1) != 1:
        return None
    if blocks is not None and blocks.dtype != torch.int64:
        return None
    shared = blocks is not None and blocks.dim() == 1  # every row reads the same table: its stride 0
    q, first, lengths = q.contiguous(), first.contiguous(), lengths.contiguous()
    blocks = None if blocks is None else blocks.contiguous()
    rows, heads, d = q.shape
    out = torch.empty_like(q)
    lib.token_lab_attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), rows,
                         None if blocks is None else blocks.data_ptr(),
                         0 if blocks is None or shared else blocks.shape[1], block_size,
                         first.data_ptr(), lengths.data_ptr(), int(lengths.max()) if max_length is None else max_length,
                         k.stride(0), k.stride(1), v.stride(0), v.stride(1), heads, k.shape[1], d,
                         scale, softcap or 0.0, torch.get_num_threads())
    return out


def attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor | None:
    """q (heads, d) over every key of k, v (L, kv_heads, d) read in place -> (heads, d)."""
    bounds = torch.tensor([0, k.shape[0]], dtype=torch.int64)
    out = attend(q.unsqueeze(0), k, v, scale, bounds[:1], bounds[1:])
    return None if out is None else out[0]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """RMSNorm over the last dimension of x (..., d) with weight (d,); None where it does not apply."""
    lib = _library()
    if lib is None or not _f32_cpu(x, weight) or not x.is_contiguous() or not weight.is_contiguous():
        return None
    y = torch.empty_like(x)
    d = x.shape[-1]
    lib.token_lab_rms_norm(x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.numel() // d, d, eps)
    return y


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, k_pool: torch.Tensor,
               v_pool: torch.Tensor, slots: torch.Tensor, heads: int) -> torch.Tensor | None:
    """qkv (n, (heads + 2 kv_heads) * d) -> q (n, heads, d) rotated; k rotated and v written to
    the pool (slots, kv_heads, d) at slots (n,) int64. cos, signed_sin: (n, r) tables, r <= d:
    the first r dims of each head are turned, the rest copied (partial rotary)."""
    lib = _library()
    if (lib is None or not _f32_cpu(qkv, cos, signed_sin, k_pool, v_pool) or slots.dtype != torch.int64
            or not all(t.is_contiguous() for t in (qkv, cos, signed_sin, k_pool, v_pool, slots))):
        return None
    n, (kv_heads, d) = qkv.shape[0], k_pool.shape[1:]
    q = torch.empty(n, heads, d, dtype=torch.float32)
    lib.token_lab_rope_store(qkv.data_ptr(), cos.data_ptr(), signed_sin.data_ptr(), q.data_ptr(),
                             k_pool.data_ptr(), v_pool.data_ptr(), slots.data_ptr(), n, heads, kv_heads, d,
                             cos.shape[-1])
    return q


def glu(x: torch.Tensor, gelu: bool) -> torch.Tensor | None:
    """x (..., 2f) = [gate | up] -> (..., f) = act(gate) * up (SiLU, or tanh GELU with gelu)."""
    lib = _library()
    if lib is None or not _f32_cpu(x) or not x.is_contiguous():
        return None
    f = x.shape[-1] // 2
    y = torch.empty(*x.shape[:-1], f, dtype=torch.float32)
    lib.token_lab_glu(x.data_ptr(), y.data_ptr(), x.numel() // (2 * f), f, int(gelu), torch.get_num_threads())
    return y


def top_k(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The k largest of each row of x (rows, V), largest first, equal values by index (so column
    0 is argmax's choice): (values, ids) as torch.topk gives them. None where the kernel does not
    apply, or a row has a NaN (torch.topk ranks NaNs first)."""
    lib = _library()
    if lib is None or not _f32_cpu(x) or x.dim() != 2 or not x.is_contiguous() or not 0 < k <= x.shape[1]:
        return None
    vals = torch.empty(x.shape[0], k, dtype=torch.float32)  # (rows, k)
    ids = torch.empty(x.shape[0], k, dtype=torch.int64)  # (rows, k)
    found = torch.empty(x.shape[0], dtype=torch.int64)  # (rows,)
    lib.token_lab_top_k(x.data_ptr(), x.shape[0], x.shape[1], k, ids.data_ptr(), vals.data_ptr(), found.data_ptr())
    return (vals, ids) if bool((found == k).all()) else None


def row_stats(x: torch.Tensor, k: int) -> tuple[torch.Tensor, ...] | None:
    """Every row of x (rows, V) at once, each row alone (the same numbers in a batch of any size):
    its k largest (values, ids) as top_k gives them, and with e = exp(x - max) in float32,
    z = sum(e) and m = sum(e * x) summed in float64. None where the kernel does not apply or a
    row has a NaN."""
    lib = _library()
    if lib is None or not _f32_cpu(x) or x.dim() != 2 or not x.is_contiguous() or not 0 < k <= x.shape[1]:
        return None
    rows = x.shape[0]
    vals = torch.empty(rows, k, dtype=torch.float32)  # (rows, k)
    ids = torch.empty(rows, k, dtype=torch.int64)  # (rows, k)
    found = torch.empty(rows, dtype=torch.int64)  # (rows,)
    z = torch.empty(rows, dtype=torch.float64)  # (rows,)
    m = torch.empty(rows, dtype=torch.float64)  # (rows,)
    lib.token_lab_row_stats(x.data_ptr(), rows, x.shape[1], k, ids.data_ptr(), vals.data_ptr(), found.data_ptr(),
                            z.data_ptr(), m.data_ptr(), torch.get_num_threads())
    return (vals, ids, z, m) if bool((found == k).all()) else None


def draw_rows(probs: list[torch.Tensor], u: torch.Tensor, skip: torch.Tensor,
              forced: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rows of probabilities (each (V,), read where they are), each with its uniform u (rows,)
    float64: each row's token as sampling.stages.sample() draws it for that u (the same running
    float64 sums, no copies of the row; V: none), and its probability outside `skip` (rows, k) and
    its token (forced (rows,) where >= 0, else the drawn one), summed in float64 in a fixed order
    (stats.c). None where the kernel does not apply."""
    lib = _library()
    rows = len(probs)
    if (lib is None or not rows or not _f32_cpu(*probs) or any(p.dim() != 1 or not p.is_contiguous() for p in probs)
            or len({p.shape[0] for p in probs}) != 1 or u.dtype != torch.float64 or u.shape != (rows,)
            or skip.dtype != torch.int64 or skip.dim() != 2 or skip.shape[0] != rows
            or forced.dtype != torch.int64 or forced.shape != (rows,)):
        return None
    u, skip, forced = u.contiguous(), skip.contiguous(), forced.contiguous()
    token = torch.empty(rows, dtype=torch.int64)  # (rows,)
    rest = torch.empty(rows, dtype=torch.float64)  # (rows,)
    ptrs = (ctypes.c_void_p * rows)(*(p.data_ptr() for p in probs))
    lib.token_lab_draw_rows(ptrs, rows, probs[0].shape[0], u.data_ptr(), skip.data_ptr(), skip.shape[1],
                            forced.data_ptr(), token.data_ptr(), rest.data_ptr(), torch.get_num_threads())
    return token, rest


def masked_exp_sum(x: torch.Tensor, top: float, where: torch.Tensor) -> float | None:
    """sum(exp(x - top)) over a row x (V,) where `where` (V,) bool: row_stats' z over those
    entries alone (never more than z). None where the kernel does not apply."""
    lib = _library()
    if lib is None or not _f32_cpu(x) or x.dim() != 1 or not x.is_contiguous() or where.shape != x.shape:
        return None
    mask = where.to(torch.uint8).contiguous()
    out = ctypes.c_double()
    lib.token_lab_masked_exp_sum(x.data_ptr(), x.shape[0], top, mask.data_ptr(), ctypes.byref(out))
    return out.value


def row_sums(x: torch.Tensor, e: torch.Tensor, chosen: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """For each row of x (rows, V) with e = exp(x - max) (rows, V) and a chosen id (rows,): sum(e)
    and sum(e * x) (float32 products summed in float64), and how many of x exceed x[chosen].
    None where the kernel does not apply."""
    lib = _library()
    if (lib is None or not _f32_cpu(x, e) or x.dim() != 2 or e.shape != x.shape or not x.is_contiguous()
            or not e.is_contiguous() or chosen.dtype != torch.int64 or chosen.shape != x.shape[:1]):
        return None
    chosen = chosen.contiguous()
    z = torch.empty(x.shape[0], dtype=torch.float64)  # (rows,)
    m = torch.empty(x.shape[0], dtype=torch.float64)  # (rows,)
    above = torch.empty(x.shape[0], dtype=torch.int64)  # (rows,)
    lib.token_lab_row_sums(x.data_ptr(), e.data_ptr(), x.shape[0], x.shape[1], chosen.data_ptr(),
                           z.data_ptr(), m.data_ptr(), above.data_ptr())
    return z, m, above


def decode(dims: list[int], layers: torch.Tensor, pointers: list[int], eps: float, scale: float,
           bytes_read: int) -> bool:
    """A whole decode step (kernels.c's token_lab_decode): dims, the (layers, fields) table of
    each layer's addresses and the step's tensors' addresses, as that file's enums order them.
    False where there are no kernels."""
    lib = _library()
    if lib is None:
        return False
    dims_t = torch.tensor(dims, dtype=torch.int64)
    ptrs = (ctypes.c_void_p * len(pointers))(*pointers)
    lib.token_lab_decode(dims_t.data_ptr(), layers.data_ptr(), ptrs, eps, scale, bytes_read, torch.get_num_threads())
    return True


def qrows(desc: torch.Tensor, x: torch.Tensor, out_features: int) -> torch.Tensor | None:
    """x (rows, in) float32 -> (rows, out) = x @ W^T for the weight whose table (quant.py's
    QuantWeight.desc) is desc, read in its blocks; each row the same bits as alone. None where
    there are no kernels."""
    lib = _library()
    if lib is None or not _f32_cpu(x) or x.dim() != 2 or x.stride(1) != 1:
        return None
    y = torch.empty(x.shape[0], out_features, dtype=torch.float32)
    lib.token_lab_qrows(desc.data_ptr(), x.data_ptr(), y.data_ptr(), x.shape[0], x.stride(0), torch.get_num_threads())
    return y


def int_products() -> str | None:
    """The integer products' kernels this build has ("avx512-vnni", or "portable C": the same bits,
    slower), or None where there are no kernels."""
    lib = _library()
    return None if lib is None else lib.token_lab_int_simd().decode()


def int_bytes(gguf_type: int, rows: int, in_features: int) -> int:
    """The bytes `rows` rows of a GGUF type take repacked for the integer products (islices.c)."""
    return _library().token_lab_int_bytes(gguf_type, rows, in_features)


def int_repack(gguf_type: int, src: torch.Tensor, rows: int, in_features: int, row_bytes: int,
               dst: torch.Tensor) -> None:
    """A file part's rows (rows, row_bytes) uint8 into dst (int_bytes of them, uint8), repacked."""
    assert src.is_contiguous() and dst.is_contiguous() and dst.numel() == int_bytes(gguf_type, rows, in_features)
    _library().token_lab_int_repack(gguf_type, src.data_ptr(), rows, in_features, row_bytes, dst.data_ptr())


def set_slices(n: int) -> None:
    """Tests only: the activations' slices the integer products keep (3; 2 drops the last)."""
    _library().token_lab_set_slices(n)


def dequant(desc: torch.Tensor, begin: int, end: int, in_features: int) -> torch.Tensor | None:
    """Rows begin..end-1 of the weight whose table is desc, as float32 (end - begin, in)."""
    lib = _library()
    if lib is None:
        return None
    y = torch.empty(end - begin, in_features, dtype=torch.float32)
    lib.token_lab_dequant(desc.data_ptr(), begin, end, y.data_ptr())
    return y


def gather(desc: torch.Tensor, ids: torch.Tensor, in_features: int) -> torch.Tensor | None:
    """Rows ids (n,) int64 of the weight whose table is desc, as float32 (n, in): an embedding's lookup."""
    lib = _library()
    if lib is None:
        return None
    ids = ids.to(torch.int64).contiguous()
    y = torch.empty(ids.numel(), in_features, dtype=torch.float32)
    lib.token_lab_gather(desc.data_ptr(), ids.data_ptr(), ids.numel(), y.data_ptr())
    return y
