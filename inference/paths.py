"""Where Token Lab keeps what it makes once: imported models, compiled kernels."""

from __future__ import annotations

import os
from pathlib import Path

APP_DIR = "token-lab"


def cache_root() -> Path:
    """$XDG_CACHE_HOME/token-lab, else ~/.cache/token-lab."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / APP_DIR
