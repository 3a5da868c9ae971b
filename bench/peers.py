"""The peers bench.run and bench.users measure against, each in a process of its own, asked for
one round at a time so that rounds alternate with ours: transformers generate() on the same
weights, and llama.cpp (llama-cpp-python) on the same GGUF file in the builds at hand.

llama.cpp's builds: "native" (-march=native, what `pip install llama-cpp-python` compiles) at
$TOKEN_LAB_LLAMA_PYTHON or ~/.cache/token-lab/llama-venv/bin/python, and "portable" (built with
CMAKE_ARGS="-DGGML_NATIVE=OFF") at $TOKEN_LAB_LLAMA_PORTABLE_PYTHON where given. The native build
crashed evaluating a multi-token batch on an Intel Xeon with AMX: where its batched prompt dies of
a signal, it is started again feeding its prompt one token at a time, and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class PeerDied(RuntimeError):
    def __init__(self, message: str, status: int | None):
        super().__init__(message)
        self.status = status


class PeerProcess:
    """A peer in a process of its own, asked for one round at a time (so rounds alternate with
    ours): measured as it runs best, not beside our loaded engine. It prints one JSON line when
    ready, then one per "round" line it reads (bench/peer_protocol.py)."""

    def __init__(self, cmd: list[str], what: str):
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = json.loads(self.proc.stdout.readline() or "null")  # after its own warm-up
        if not self.ready:
            self.close()
            # A status below 0 is the signal that ended it (-11: a segmentation fault, as of the
            # native llama.cpp build on an Intel VM with AMX: bench/measured/cpu-quant-smollm2-135m.md).
            raise PeerDied(f"the {what} peer did not start (it exited with status {self.proc.returncode}: "
                           f"run {' '.join(cmd)} to see why)", self.proc.returncode)

    def measure(self, *args) -> dict:
        self.proc.stdin.write(" ".join(["round", *map(str, args)]) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def transformers_peer(model_dir: Path | None, tokens: int) -> PeerProcess | None:
    """transformers generate() on the same weights, float32 (bench/peer_transformers.py), or
    None without a checkpoint or without transformers installed."""
    if model_dir is None:
        return None
    import importlib.util
    if not importlib.util.find_spec("transformers"):
        return None
    return PeerProcess([sys.executable, "-m", "bench.peer_transformers", str(model_dir), str(tokens)], "transformers")


def llama_builds() -> dict[str, Path]:
    """The llama.cpp builds at hand, native first: build name -> its virtual environment's Python."""
    native = os.environ.get("TOKEN_LAB_LLAMA_PYTHON") or Path.home() / ".cache/token-lab/llama-venv/bin/python"
    paths = {"native": Path(native), "portable": Path(os.environ.get("TOKEN_LAB_LLAMA_PORTABLE_PYTHON") or "/nonexistent")}
    return {build: path for build, path in paths.items() if path.exists()}


def start_llama(python: Path, script: str, args: list, build: str) -> PeerProcess:
    """A llama.cpp peer (bench/<script>) of one build; where it dies of a signal with its prompt
    batched, again with the prompt one token at a time (its ready line says which, and why)."""
    cmd = [str(python), str(ROOT / "bench" / script), *map(str, args), "--build", build]
    try:
        return PeerProcess(cmd, f"llama.cpp ({build})")
    except PeerDied as died:
        if died.status is None or died.status >= 0:
            raise
        peer = PeerProcess(cmd + ["--one-token"], f"llama.cpp ({build}, prompt one token at a time)")
        peer.ready["batched_prompt_died"] = died.status
        return peer


def start_llama_builds(script: str, args: list, builds: dict[str, Path] | None = None) -> tuple[dict, dict]:
    """Every build at hand: ({build: its peer}, {build: why it did not start}). A build that runs
    on neither way is told, not fatal, while another runs."""
    peers, failed = {}, {}
    for build, python in (llama_builds() if builds is None else builds).items():
        try:
            peers[build] = start_llama(python, script, args, build)
        except PeerDied as died:
            failed[build] = str(died)
    if failed and not peers:
        raise RuntimeError("; ".join(failed.values()))
    return peers, failed


def describe(ready: dict) -> str:
    """A build in words, for a table row: version, native or not, how it fed its prompt."""
    how = "prompt one token at a time" if ready["prompt"] != "batched" else "prompt batched"
    if "batched_prompt_died" in ready:
        how += f" (its batched prompt died of signal {-ready['batched_prompt_died']})"
    return f"llama.cpp {ready['build']} (llama-cpp-python {ready['version']}, {how})"
