"""The kernels compiled for another instruction set than this machine's: TOKEN_LAB_KERNELS_MARCH
sets their -march (inference/model/kernels), here x86-64-v2 (SSE4.2, no AVX: 4 floats a vector
where this CPU likely has 8 or 16). The kernel tests and the tests against transformers run
again in a subprocess with it set, so that a number that holds only for this machine's vector
width fails here, not on someone else's machine."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from inference.model import kernels

ROOT = Path(__file__).resolve().parents[2]
OTHER = "x86-64-v2"
# The tests that pin numbers: the kernels against float64 and torch, a decode step through them
# against the layers one by one, and the model and the page against transformers.
FILES = ["tests/model/test_kernels.py", "tests/model/test_decode_step.py", "tests/model/test_quant.py",
         "tests/model/test_model_reference.py", "tests/page/test_faithful.py"]

pytestmark = [
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason=f"{OTHER} is an x86 instruction set"),
    pytest.mark.skipif(not kernels.available(), reason="no C compiler here: torch's operators serve"),
]


def env_for(march: str) -> dict[str, str]:
    """This process's environment with the kernels' -march set, and none of pytest-xdist's
    worker variables (the subprocess is a pytest of its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    return {**env, "TOKEN_LAB_KERNELS_MARCH": march}


def built_for(march: str) -> tuple[str, Path]:
    """(the -march the kernels say they compiled for, their file), from a fresh process."""
    code = "from inference.model import kernels; print(kernels.march()); print(kernels.library_path())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env_for(march), capture_output=True,
                         text=True, timeout=300, check=True).stdout.split("\n")
    return out[0], Path(out[1])


def test_another_instruction_set_is_built_to_a_file_of_its_own():
    """Each -march is its own cached library: neither is taken for the other."""
    (native, here), (other, there) = built_for("native"), built_for(OTHER)
    assert (native, other) == ("native", OTHER)
    assert here.is_file() and there.is_file() and here != there
    if "avx2" in Path("/proc/cpuinfo").read_text():  # this CPU has wider vectors than x86-64-v2
        assert here.read_bytes() != there.read_bytes()


@pytest.mark.slow
def test_the_kernel_and_faithfulness_tests_pass_with_the_kernels_built_for_x86_64_v2(tmp_path):
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-n", "0", "-p", "no:cacheprovider",
                          f"--basetemp={tmp_path / 'basetemp'}", *FILES],
                         cwd=ROOT, env=env_for(OTHER), capture_output=True, text=True, timeout=1200)
    report = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, report
    # The kernel tests ran (they skip themselves where no kernels are built).
    assert "test_kernels.py" not in "".join(ln for ln in run.stdout.splitlines() if ln.startswith("SKIPPED")), report
    assert " passed" in run.stdout.splitlines()[-1], report


PRODUCTS = """
import sys, torch
sys.path[:0] = ["tests", "tests/model"]
from test_quant import weight
out = {}
for name in ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"]:
    w, _ = weight(name, 37, 2, seed=5)
    x = torch.randn(8, w.in_features, generator=torch.Generator().manual_seed(6))
    out[name] = [w.matmul(x[:n], kernel_rows=16) for n in (1, 2, 5, 8)]  # alone, a pair, fours
from inference.model.quant import QuantWeight
w = torch.randn(37, 96, generator=torch.Generator().manual_seed(7))
out["BF16"] = [QuantWeight.bfloat16(w).matmul(x[:n, :96].contiguous(), kernel_rows=16) for n in (1, 2, 5, 8)]
torch.save(out, sys.argv[1])
"""


def test_products_on_the_blocks_are_the_same_bits_with_avx2_and_with_this_cpus_vectors(tmp_path):
    """Each block type's fused products (8-lane AVX2 forms, and 16-lane AVX-512 ones where this
    CPU has them) give the same bits: lanes 0-15 of a 16-lane form hold what two 8-lane
    accumulators hold, each lane the same multiply-adds."""
    import torch
    if "avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU has no AVX2")
    got = {}
    for march in ("native", "x86-64-v3"):
        subprocess.run([sys.executable, "-c", PRODUCTS, str(tmp_path / march)], cwd=ROOT, env=env_for(march),
                       check=True, timeout=300)
        got[march] = torch.load(tmp_path / march)
    for name, products in got["native"].items():
        assert all(torch.equal(a, b) for a, b in zip(products, got["x86-64-v3"][name])), name


INT_PRODUCTS = """
import sys, torch
sys.path[:0] = ["tests", "tests/model"]
from test_quant import weight
from inference.model import kernels
out = {"simd": kernels.int_products()}
for name in ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]:
    w, _ = weight(name, 37, 2, seed=5)
    x = torch.randn(9, w.in_features, generator=torch.Generator().manual_seed(6)) * 3
    r = w.repacked()
    out[name] = [r.matmul(x[:n], kernel_rows=16) for n in (1, 2, 5, 9)] + [r.dequantize()]
torch.save(out, sys.argv[1])
"""


def test_integer_products_are_the_same_bits_in_plain_c_and_with_avx512_vnni(tmp_path):
    """The integer products' plain C form (a CPU without AVX-512 VNNI) and this CPU's: the same
    integers and the same float32 operations, lane by lane, so the same bits."""
    import torch
    if kernels.int_products() != "avx512-vnni":
        pytest.skip("this CPU has no AVX-512 VNNI: only the plain C form is built here")
    got = {}
    for march in ("native", "x86-64-v3"):
        subprocess.run([sys.executable, "-c", INT_PRODUCTS, str(tmp_path / march)], cwd=ROOT, env=env_for(march),
                       check=True, timeout=300)
        got[march] = torch.load(tmp_path / march)
    assert (got["native"].pop("simd"), got["x86-64-v3"].pop("simd")) == ("avx512-vnni", "portable C")
    for name, products in got["native"].items():
        assert all(torch.equal(a, b) for a, b in zip(products, got["x86-64-v3"][name])), name
