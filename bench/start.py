"""How long the page takes to answer when `./tokenlab` starts it a second time (.venv set up: the
launcher checks its stamp and installs nothing) against `python app.py` in the same .venv, the two
alternated round by round, each timed from the command's start until `GET /` answers 200.

  python -m bench.start [--clone DIR] [--rounds 5]

DIR: a clone in which `./tokenlab install` has run; by default a fresh clone of HEAD in a temporary
folder, set up before any timing. Both load the default model from the machine's cache (imported
before the first round). Writes bench/results/start.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import save  # noqa: E402

START_LIMIT_S = 1800  # a hang guard: a fresh install and model import on a busy 2-core machine take minutes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # this machine's pages: never a proxy


def answers(url: str) -> bool:
    try:
        with LOCAL.open(url, timeout=30) as response:
            return response.status == 200
    except OSError:
        return False


class Page:
    """`command --port PORT` run in cwd until each of `paths` answers 200 (`seconds` after its start;
    the API at /v1 is mounted a moment after the page answers); `stop()` sends SIGTERM, as Ctrl-C
    stops the page (app.py), and returns the exit status."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str], log: Path, paths=("/",),
                 limit_s: float = START_LIMIT_S):
        self.port, self.log = free_port(), log
        self.url = f"http://127.0.0.1:{self.port}"
        t0 = time.perf_counter()
        with open(log, "w") as out:
            self.proc = subprocess.Popen([*command, "--port", str(self.port)], cwd=cwd, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        while not all(answers(self.url + path) for path in paths):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{command[0]} exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            if time.perf_counter() - t0 > limit_s:
                self.stop()
                raise RuntimeError(f"the page did not answer within {limit_s} s:\n{self.output()[-4000:]}")
            time.sleep(0.05)
        self.seconds = time.perf_counter() - t0

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:  # (a stop beside a CI machine's other jobs took over 120 s: only a hang waits 300)
                self.proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


def clone_head(dest: Path) -> Path:
    """A clone of this checkout's HEAD (what is committed) at dest."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(dest)], check=True, capture_output=True)
    subprocess.run(["git", "checkout", "-q", head.stdout.strip()], cwd=dest, check=True, capture_output=True)
    return dest


def cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.processor())


def check_seconds(clone: Path, env: dict[str, str], n: int) -> list[float]:
    """What `./tokenlab` does before it starts the page, alone: `./tokenlab install` finding its stamp
    current (bash, the stamp's digest, nothing installed)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        proc = subprocess.run([str(clone / "tokenlab"), "install"], env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0 or "nothing to install" not in proc.stderr:
            raise RuntimeError(f"./tokenlab install did not find .venv current:\n{proc.stderr[-2000:]}")
    return times


def measure(clone: Path, rounds: int, work: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    commands = {"./tokenlab": [str(clone / "tokenlab")],
                "python app.py": [str(clone / ".venv" / "bin" / "python"), str(clone / "app.py")]}
    Page(commands["python app.py"], clone, env, work / "warm.log").stop()  # the model imported, the kernels built
    times: dict[str, list[float]] = {name: [] for name in commands}
    for r in range(rounds):
        order = list(commands) if r % 2 == 0 else list(commands)[::-1]  # each goes first in half the rounds
        for name in order:
            page = Page(commands[name], clone, env, work / f"{r}-{name.strip('./').split()[0]}.log")
            times[name].append(page.seconds)
            if page.stop() != 0:
                raise RuntimeError(f"{name} did not stop cleanly:\n{page.output()[-2000:]}")
            if name == "./tokenlab" and "nothing to install" not in page.output():
                raise RuntimeError(f"./tokenlab installed something:\n{page.output()[-2000:]}")
    check = check_seconds(clone, env, 4 * rounds)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True)
    stats = {name: {"seconds": t, "median_s": statistics.median(t), "min_s": min(t), "max_s": max(t)}
             for name, t in times.items()}
    return {"rounds": rounds, "commit": commit.stdout.strip(), "cpu": cpu_name(), "cores": os.cpu_count(),
            "python": platform.python_version(), "load_average": os.getloadavg(), "systems": stats,
            "check_s": check, "check_median_s": statistics.median(check),
            "ratio_median": stats["./tokenlab"]["median_s"] / stats["python app.py"]["median_s"],
            "extra_median_s": stats["./tokenlab"]["median_s"] - stats["python app.py"]["median_s"]}


def to_markdown(r: dict) -> str:
    lines = [f"# The page's start: `./tokenlab` (second start) against `python app.py`, {r['rounds']} rounds each",
             "", f"{r['cpu']}, {r['cores']} cores (load average after the run: "
             f"{', '.join(f'{x:.1f}' for x in r['load_average'])}), Python {r['python']}, commit {r['commit']}; "
             "alternated, each timed from its start until `GET /` answers 200.", "",
             "| command | median | min | max | every round (s) |", "|---|---|---|---|---|"]
    for name, s in r["systems"].items():
        lines.append(f"| `{name}` | {s['median_s']:.2f} s | {s['min_s']:.2f} s | {s['max_s']:.2f} s | "
                     f"{', '.join(f'{t:.2f}' for t in s['seconds'])} |")
    lines += ["", f"- `./tokenlab` / `python app.py`, medians: {r['ratio_median']:.3f}x "
                  f"({r['extra_median_s'] * 1000:+.0f} ms)",
              f"- what `./tokenlab` does before the page's own start (`./tokenlab install` finding its stamp current), "
              f"{len(r['check_s'])} times alone: median {r['check_median_s'] * 1000:.0f} ms "
              f"(min {min(r['check_s']) * 1000:.0f}, max {max(r['check_s']) * 1000:.0f})"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clone", type=Path, default=None,
                   help="a clone set up by ./tokenlab install (default: a fresh clone of HEAD)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        clone = args.clone
        if clone is None:
            clone = clone_head(Path(tmp) / "clone")
            subprocess.run([str(clone / "tokenlab"), "install"], check=True)
        result = measure(clone.resolve(), args.rounds, Path(tmp))
    save(args.out, "start", result, to_markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
