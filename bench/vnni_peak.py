"""How many 512-bit VNNI dot products (`vpdpbusd`, 64 byte products each) this CPU's cores run a
second: twelve independent chains a thread, on every thread at once, nothing read from memory.
The integer products' per-row cost can go no lower than a row's instructions at this rate.

    python -m bench.vnni_peak [--threads N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
int main(void) {
    const long n = 100000000 / 12;
    double best = 0.0;
    for (int round = 0; round < 3; ++round) {
        double t0 = omp_get_wtime(), sink = 0.0;
        #pragma omp parallel reduction(+:sink)
        {
            __m512i a[12], w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
            for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_epi32(i);
            for (long k = 0; k < n; ++k) {
                #pragma GCC unroll 12
                for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbusd_epi32(a[i], w, x);  /* in registers (-O3) */
                __asm__ volatile("" : "+v"(w));
            }
            for (int i = 0; i < 12; ++i) sink += _mm512_reduce_add_epi32(a[i]);
        }
        const double rate = 12.0 * n * omp_get_max_threads() / (omp_get_wtime() - t0);
        if (rate > best) best = rate;
        if (sink == 0.5) puts("");
    }
    printf("%.6e\n", best);
    return 0;
}
"""


def vnni_rate(threads: int) -> float | None:
    """vpdpbusd instructions a second on `threads` threads together (the best of three rounds);
    None where there is no compiler, it cannot build the probe, or the CPU has no AVX-512 VNNI."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if "avx512_vnni" not in flags or compiler is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d, "peak.c"), Path(d, "peak")
        src.write_text(SOURCE)
        if subprocess.run([compiler, "-O3", "-march=native", "-fopenmp", str(src), "-o", str(exe)],
                          capture_output=True, timeout=120).returncode != 0:
            return None  # (an older compiler without these intrinsics: the caller says there is no rate)
        out = subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=300,
                             env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    return float(out.stdout.split()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    rate = vnni_rate(ap.parse_args(argv).threads)
    print("no AVX-512 VNNI (or no C compiler) here" if rate is None else f"{rate / 1e9:.2f} G vpdpbusd a second")


if __name__ == "__main__":
    main()
