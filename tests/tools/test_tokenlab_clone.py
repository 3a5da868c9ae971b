"""The README's first command on a fresh clone: `./tokenlab` makes .venv, installs torch and the
requirements, fetches and imports the default model into a fresh cache, serves the page, and a
generation goes through the API; the second `./tokenlab` installs nothing.

The clone is of HEAD (what is committed). pip's and uv's caches are the machine's, as on a machine
that installed before (CI's `./tokenlab install --test` fills them): the packages are linked or
unpacked from there, the model's package comes from the index again and is imported anew."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from bench.start import LOCAL, Page, clone_head

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def user_env(tmp_path: Path) -> dict[str, str]:
    """A user's shell: no venv active, a fresh model cache; pip's and uv's caches where they were."""
    caches = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHON", "GRADIO_SERVER_PORT")
           and not k.startswith("PYTEST_")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"),
               PIP_CACHE_DIR=os.environ.get("PIP_CACHE_DIR", f"{caches}/pip"),
               UV_CACHE_DIR=os.environ.get("UV_CACHE_DIR", f"{caches}/uv"))
    return env


def ask(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with LOCAL.open(req, timeout=300) as response:
        assert response.status == 200
        return json.loads(response.read())


def installed(clone: Path) -> list[str]:
    """What .venv holds: its packages' names and versions, and its stamp and install log."""
    venv = clone / ".venv"
    (site,) = venv.glob("lib/python3*/site-packages")
    state = venv / ".tokenlab"
    return sorted(p.name for p in site.iterdir()) + [(state / "stamp.json").read_text(),
                                                    (state / "install.log").read_text()]


def test_a_fresh_clone_serves_the_page_and_a_second_start_installs_nothing(tmp_path):
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout: nothing to clone")
    clone = clone_head(tmp_path / "clone")
    env = user_env(tmp_path)
    tokenlab = [str(clone / "tokenlab")]
    assert not (clone / ".venv").exists()
    page = None
    try:
        page = Page(tokenlab, clone, env, tmp_path / "first.log", paths=("/", "/v1/models"))
        model = ask(page.url + "/v1/models")["data"][0]["id"]
        out = ask(page.url + "/v1/completions", {"model": model, "prompt": "The capital of France is",
                                                  "max_tokens": 4, "temperature": 0})
        assert out["usage"]["completion_tokens"] == 4, out
        assert out["choices"][0]["text"].startswith(" Paris"), out  # the README's greedy answer
        assert page.stop() == 0
        first = page.output()
        assert "making .venv" in first and "tokenlab: torch: " in first and "installed in" in first, first
        # the default model was fetched and imported into the fresh cache, not found elsewhere
        assert (tmp_path / "cache" / "token-lab" / "SmolLM2-135M-Instruct" / "source.json").exists()
        before = installed(clone)

        page = Page(tokenlab, clone, env, tmp_path / "second.log", paths=("/", "/v1/models"))
        assert page.stop() == 0
        second = page.output()
        assert "tokenlab: .venv is up to date" in second and "nothing to install" in second, second
        assert "installing" not in second and "making .venv" not in second, second
        assert installed(clone) == before  # the same packages, stamp and install log: nothing was installed
    finally:
        if page is not None:
            page.stop()
        shutil.rmtree(tmp_path / "clone", ignore_errors=True)  # GBs: not left for pytest's kept tmp folders
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)
