"""Runs the CLI or the page as a process with a test's hook on the engine's scheduler, so that
what happens at exit is held where the test wants it, whatever the machine's speed.
Usage: python hooked.py HOOK cli|app ARGS... (the arguments of `python -m inference` or app.py).

Hooks:
  busy-at-exit  after a run's last token the scheduler's thread goes on computing, inside torch,
                until the engine is closed: the moment of exit, held open. An engine not closed
                before exit leaves that thread inside torch while the interpreter finalizes,
                which aborts the process (exit 134, "terminate called without an active
                exception").
  hold          each run is held before its third token until it is cancelled (Ctrl-C, SIGTERM,
                a close); the file named by $TOKENLAB_TEST_MARK is written once one is held.
  none          no hook.
At exit, the tokenlab-* threads still alive are written to stderr: "alive at exit: [...]".
"""

import atexit
import os
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from inference.serving.scheduler import Scheduler  # noqa: E402

TIMEOUT_S = 60.0  # only a broken test waits this long


def busy_at_exit() -> None:
    closing = threading.Event()
    close, step = Scheduler.close, Scheduler._step

    def closing_close(self):
        closing.set()
        close(self)

    def step_then_compute(self, active):
        step(self, active)
        if any(run.released.is_set() for run in active):  # a run ended: its caller may exit now
            x = torch.rand(128, 128)
            while not closing.is_set():
                x = torch.nn.functional.normalize(x @ x, dim=-1)

    Scheduler.close, Scheduler._step = closing_close, step_then_compute


def hold() -> None:
    mark, step = os.environ.get("TOKENLAB_TEST_MARK"), Scheduler._step

    def held(self, active):
        for run in active:
            if len(run.generated) == 2 and not run.cancel.is_set():  # before its third token
                if mark:
                    Path(mark).write_text("held")
                if not run.cancel.wait(TIMEOUT_S):
                    raise TimeoutError(f"a run was held for {TIMEOUT_S:.0f} s")
        return step(self, active)

    Scheduler._step = held


def report_threads() -> None:
    alive = sorted(t.name for t in threading.enumerate() if t.name.startswith("tokenlab-") and t.is_alive())
    print(f"alive at exit: {alive}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    hook, target, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    {"busy-at-exit": busy_at_exit, "hold": hold, "none": lambda: None}[hook]()
    atexit.register(report_threads)
    if target == "cli":
        from inference.cli import main
        raise SystemExit(main(args))
    import runpy
    sys.argv = [str(ROOT / "app.py"), *args]
    runpy.run_path(sys.argv[0], run_name="__main__")
