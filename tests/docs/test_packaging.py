"""`pip install .` (pyproject.toml): the wheel holds every package, the files they open at run
time, app.py and the `token-lab` command, its requirements are requirements.txt's; and the
command dispatches as the README says (`token-lab` = `python app.py`, `token-lab generate` =
`python -m inference generate`)."""

from __future__ import annotations

import email
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What a build reads: copied elsewhere, so the build's own folders (build/, *.egg-info) never land
# in the working tree, where other processes read it.
PACKAGES = ("inference", "server", "ui", "api")
SOURCES = ("pyproject.toml", "README.md", "requirements.txt", "app.py", *PACKAGES)


def can_build() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    if (major, minor) >= (70, 1):  # bdist_wheel is part of setuptools since 70.1
        return True
    try:
        import wheel  # noqa: F401
    except ImportError:
        return False
    return major >= 64


@pytest.fixture(scope="module")
def wheel_file(tmp_path_factory) -> zipfile.ZipFile:
    if not can_build():
        pytest.skip("setuptools >= 64 with wheel (or >= 70.1) is needed to build the wheel")
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                             "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (whl,) = out.glob("token_lab-*.whl")
    with zipfile.ZipFile(whl) as zf:
        yield zf


def dist_info(zf: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in zf.namelist() if re.fullmatch(rf"token_lab-[^/]+\.dist-info/{name}", n)]
    return zf.read(path).decode()


def test_the_wheel_holds_every_package_app_py_and_the_files_they_open(wheel_file):
    names = set(wheel_file.namelist())
    packages = [p.parent for top in PACKAGES for p in (ROOT / top).rglob("__init__.py")]
    modules = {p.relative_to(ROOT).as_posix() for d in packages for p in d.glob("*.py")}
    assert modules - names == set()
    # Files the packages read beside their modules (Path(__file__)...): the page's scripts and
    # styles, and the kernels' C sources (kernels.c and the files it includes), compiled on first use.
    data = {p.relative_to(ROOT).as_posix() for p in (ROOT / "ui" / "assets").iterdir() if p.is_file()}
    data |= {p.relative_to(ROOT).as_posix() for p in (ROOT / "inference" / "model" / "kernels").glob("*.c")}
    assert data - names == set()
    assert "app.py" in names
    assert not any(n.startswith(("tests/", "bench/", "docs/")) for n in names)


def test_the_wheel_has_the_token_lab_command(wheel_file):
    entry_points = dist_info(wheel_file, "entry_points.txt")
    assert re.search(r"^\[console_scripts\]\s*^token-lab = app:token_lab\s*$", entry_points, re.M), entry_points


def test_the_wheels_requirements_are_requirements_txt(wheel_file):
    Requirement = pytest.importorskip("packaging.requirements").Requirement
    metadata = email.message_from_string(dist_info(wheel_file, "METADATA"))
    required = {Requirement(r) for r in metadata.get_all("Requires-Dist")}
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()]
    expected = {Requirement(ln) for ln in lines if ln}
    assert {(r.name, r.specifier) for r in required} == {(r.name, r.specifier) for r in expected}


def test_token_lab_dispatches_a_subcommand_to_the_cli_and_the_rest_to_the_app(monkeypatch):
    import app
    import inference.cli
    calls = []
    monkeypatch.setattr(inference.cli, "main", lambda argv: calls.append(("cli", argv)) or 7)
    monkeypatch.setattr(app, "main", lambda argv: calls.append(("app", argv)) or 8)
    for command in ("generate", "tokenize", "score", "score-text"):
        assert app.token_lab([command, "--prompt", "x"]) == 7
    assert app.token_lab(["--model", "gemma3-270m", "--port", "7861", "--share"]) == 8
    assert app.token_lab([]) == 8
    monkeypatch.setattr(sys, "argv", ["token-lab", "tokenize", "--text", "hi"])
    assert app.token_lab() == 7
    assert calls == [("cli", [c, "--prompt", "x"]) for c in ("generate", "tokenize", "score", "score-text")] + [
        ("app", ["--model", "gemma3-270m", "--port", "7861", "--share"]), ("app", []),
        ("cli", ["tokenize", "--text", "hi"])]


def test_token_lab_help_is_the_apps_and_a_subcommands_help_the_clis(capsys):
    import app
    with pytest.raises(SystemExit) as exit_:
        app.token_lab(["generate", "--help"])
    assert exit_.value.code == 0 and "--prompt" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        app.token_lab(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "{generate,score,score-text,explain,quantize-compare,tokenize}" in out and "--share" in out and "--port" in out
