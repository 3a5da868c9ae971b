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
