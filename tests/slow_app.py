"""Runs app.py with each forward pass of the model (the scheduler's one pass a step for all
runs, and the direct ones) made TOKENLAB_TEST_STEP_S seconds longer (a sleep: it holds no
core), so that a tiny model's runs last long enough to overlap as a real model's do; and, where
TOKENLAB_TEST_TOKENIZED names a file, the length of every text the tokenizer is given written
to it, a line each, before the tokenizer reads it. Usage:
TOKENLAB_TEST_STEP_S=0.02 TOKENLAB_TEST_TOKENIZED=PATH python slow_app.py APP_ARGS..."""

import os
import runpy
import sys
import threading
import time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, root)

from inference.loading.tokenizer import Tokenizer  # noqa: E402
from inference.serving import engine as _engine  # noqa: E402

STEP_S = float(os.environ.get("TOKENLAB_TEST_STEP_S", "0"))
TOKENIZED = os.environ.get("TOKENLAB_TEST_TOKENIZED")
_init = _engine.Engine.__init__
_lock = threading.Lock()


def _slowed(forward):
    def slow(*a, **k):
        time.sleep(STEP_S)
        return forward(*a, **k)
    return slow


def _slow_init(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    for name in ("forward", "forward_paged"):  # direct passes, and the scheduler's batched one
        setattr(self.model, name, _slowed(getattr(self.model, name)))


def _logged(encode):
    def logged(self, text, *args, **kwargs):
        with _lock, open(TOKENIZED, "a", encoding="utf-8") as f:
            f.write(f"{len(text)}\n")
        return encode(self, text, *args, **kwargs)
    return logged


_engine.Engine.__init__ = _slow_init
if TOKENIZED:
    for _name in ("encode", "encode_continuation", "encode_template"):
        setattr(Tokenizer, _name, _logged(getattr(Tokenizer, _name)))
sys.argv = [os.path.join(root, "app.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
