"""The page's downloads: a run's steps (the CLI's JSONL) and its settings, written by the page
itself under a random token and served at DOWNLOAD_ROUTE (ui/layout.serve_downloads), outside
gradio's file routes; the oldest deleted once there are more than KEEP_FILES."""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import threading
from collections import deque
from pathlib import Path

from ui.controls import NAMES, Controls
from ui.run_state import RunRecord, run_jsonl

KEEP_FILES = 200
DOWNLOAD_ROUTE = "tokenlab/download"  # the downloads' addresses, relative to the page


def settings_json(rec: RunRecord) -> str:
    """The run's settings, as the page's controls (and the link's query) name them, with the
    seed it used and the model that made it, by name (the picker's "" says nothing in a file:
    a link naming the default model opens it as the default); in chat mode also the earlier
    turns it continued."""
    c = rec.controls or Controls()
    data = {**dict(zip(NAMES, c.values())), "model": rec.model, "seed": "" if rec.seed is None else str(rec.seed)}
    if rec.mode == "chat":
        data["history"] = list(rec.history)
    return json.dumps(data, ensure_ascii=False, indent=1) + "\n"


class Downloads:
    """The files the page offers, by token; written in `files_dir` (a temporary folder of its own
    by default)."""

    def __init__(self, files_dir: str | None = None):
        self._lock = threading.Lock()
        self._files_dir = Path(files_dir or tempfile.mkdtemp(prefix="tokenlab-downloads-"))
        self._files: deque[str] = deque()  # tokens, oldest first
        self._file_paths: dict[str, tuple[Path, str | None]] = {}  # token -> (file, the login that may read it)

    def of_run(self, rec: RunRecord) -> tuple[str, str]:
        """The addresses of an ended run's two downloads: its steps and its settings."""
        return (self.write(f"run-{rec.seed}.jsonl", run_jsonl(rec), rec.owner),
                self.write(f"settings-{rec.seed}.json", settings_json(rec), rec.owner))

    def write(self, name: str, text: str, owner: str | None = None) -> str:
        """Write a download and return its address, relative to the page: DOWNLOAD_ROUTE, a
        random token and the name. Only files written here are served (path), a login's to that
        login only; the oldest are deleted once there are more than KEEP_FILES."""
        token = secrets.token_hex(16)
        d = self._files_dir / token
        d.mkdir(parents=True, exist_ok=True)
        path = d / name
        path.write_text(text, encoding="utf-8")
        with self._lock:
            self._files.append(token)
            self._file_paths[token] = (path, owner)
            old = [self._files.popleft() for _ in range(max(0, len(self._files) - KEEP_FILES))]
            for t in old:
                self._file_paths.pop(t, None)
        for t in old:
            shutil.rmtree(self._files_dir / t, ignore_errors=True)
        return f"{DOWNLOAD_ROUTE}/{token}/{name}"

    def path(self, token: str, name: str, login: str | None = None) -> Path | None:
        """The file a download address names, if this page wrote it (and still keeps it) and,
        for a run made under a login, `login` is that login."""
        with self._lock:
            path, owner = self._file_paths.get(token, (None, None))
        if path is None or (owner is not None and login != owner):
            return None
        return path if path.name == name and path.exists() else None
