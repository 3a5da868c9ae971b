"""The README and docs/ say what the code does: the README's size, its first two commands, its install
order, every relative link and every file named, the CLI's subcommands and flags, the app's flags, the
environment variables, and the figures the docs state in more than one place.

Each check is a function returning what is wrong (empty: nothing), run on the real files and, in the
tests at the end, on a text made to be wrong, so that every check is seen to fail."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
REQUIREMENTS = "pip install -r requirements.txt"
MAX_README_LINES, MAX_LINE = 200, 120
ENV_NAME = re.compile(r"\b(?:TOKEN_LAB|TOKENLAB)_[A-Z0-9_]*[A-Z0-9]\b")
# Code that reads environment variables: the packages, the app, the scripts, the benchmark, CI, and
# the tests (some variables are the tests' own, documented for whoever runs them).
CODE_GLOBS = ("inference/**/*.py", "ui/**/*.py", "api/**/*.py", "bench/**/*.py", "bench/**/*.sh",
              "scripts/*.sh", "scripts/*.py", "app.py", "tokenlab", ".ci/run", "tests/**/*.py")
NOT_TESTS = tuple(g for g in CODE_GLOBS if not g.startswith("tests/"))


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def prose(text: str) -> str:
    """The text without its fenced code blocks (their brackets are code, not links)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


# ---------------------------------------------------------------- checks


def size_problems(text: str) -> list[str]:
    lines = text.splitlines()
    problems = [f"{len(lines)} lines, more than {MAX_README_LINES}"] if len(lines) > MAX_README_LINES else []
    return problems + [f"line {n}: {len(line)} characters" for n, line in enumerate(lines, 1)
                       if len(line) > MAX_LINE]


FIRST_COMMANDS = ["./tokenlab", "./tokenlab test"]  # the page and the tests, each one command on a fresh clone


def first_commands_problems(text: str) -> list[str]:
    """The README opens with the two commands: its first code block, before any section, is them."""
    block = re.search(r"^```\w*\n(.*?)^```", text, flags=re.S | re.M)
    if block is None or re.search(r"^## ", text[:block.start()], flags=re.M):
        return ["no code block before the first section"]
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.split("#")[0].strip()]
    return [] if commands == FIRST_COMMANDS else [f"the first commands are {commands}, not {FIRST_COMMANDS}"]


def install_problems(text: str) -> list[str]:
    """A newcomer on a CPU machine reads the CPU build's install before requirements.txt's, each
    in a virtual environment, the CPU machine's first."""
    problems = []
    cpu, req = text.find(CPU_INDEX), text.find(REQUIREMENTS)
    if cpu < 0 or req < 0:
        return [f"the install does not say both {CPU_INDEX!r} and {REQUIREMENTS!r}"]
    if cpu > req:
        problems.append(f"{REQUIREMENTS!r} comes before the CPU build's index URL")
    venv = text.find("python3 -m venv .venv")
    if venv < 0 or venv > cpu:
        problems.append("no virtual environment made before the first install")
    cpu_machine, gpu_machine = text.find("CPU machine"), text.find("GPU machine")
    if cpu_machine < 0 or gpu_machine < 0 or cpu_machine > gpu_machine:
        problems.append("the CPU machine's install is not the first of the two")
    return problems


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors for a Markdown file's headings."""
    anchors = set()
    for title in re.findall(r"^#+\s+(.+?)\s*$", prose(text), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def link_problems(path: Path, text: str) -> list[str]:
    """Every relative link names a file or folder that exists, and an anchor a heading of it."""
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(text)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve()
        if file and not dest.exists():
            problems.append(f"{target}: no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and (not file or dest.suffix == ".md") \
                and anchor not in heading_anchors(read(dest) if file else text):
            problems.append(f"{target}: no heading #{anchor} in {dest.name if file else path.name}")
    return problems


OUTPUTS = ("bench/results",)  # folders the code writes (ignored by git), not in a clone
CODE_PATH = re.compile(r"`((?:tests|inference|ui|api|bench|scripts|docs)/[\w/.\-]*[\w/])`")


def path_problems(text: str, root: Path = ROOT) -> list[str]:
    """Every file or folder of the repository a text names in backticks (`tests/x.py`) exists."""
    return [f"{name}: no such file" for name in CODE_PATH.findall(text)
            if not (root / name).exists() and not name.startswith(OUTPUTS)]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def flags_named(text: str) -> list[str]:
    """The flags a text names: `--top-k`, and `--engine-*` as the prefix `--engine-`."""
    return [m.group(0) for m in re.finditer(r"(?<![\w-])--[a-z][a-z0-9-]*\*?", text)]


def flag_problems(named: list[str], flags: set[str], where: str) -> list[str]:
    problems = []
    for flag in named:
        if flag.endswith("*"):
            if not any(f.startswith(flag[:-1]) for f in flags):
                problems.append(f"{where}: no flag starts with {flag[:-1]}")
        elif flag not in flags:
            problems.append(f"{where}: {flag} is not a flag")
    return problems


def cli_problems(text: str, parser: argparse.ArgumentParser) -> list[str]:
    """The subcommands and flags docs/cli.md names are the parser's: under a subcommand's own
    heading, that subcommand's flags; elsewhere, any subcommand's."""
    subs = subparsers(parser)
    every = set().union(*(flags_of(p) for p in subs.values()))
    problems = [f"no section for the subcommand {name}" for name in subs
                if not re.search(rf"^## {re.escape(name)}\s*$", text, flags=re.M)]
    for word in re.findall(r"(?:python -m inference|token-lab) ([a-z][\w-]*)", text):
        if word not in subs:
            problems.append(f"{word} is not a subcommand")
    for section in re.split(r"^(?=## )", text, flags=re.M):
        title = section.splitlines()[0].removeprefix("## ").strip() if section.startswith("## ") else ""
        flags = flags_of(subs[title]) if title in subs else every
        problems += flag_problems(flags_named(section), flags, f"section {title or 'top'!r}")
    return problems


def app_flags() -> set[str]:
    """The flags `python app.py --help` lists."""
    import app
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        app.parse_args(["--help"])
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", out.getvalue()))


def section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\s*$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    return match.group(1) if match else ""


def code_files(globs=CODE_GLOBS) -> dict[Path, str]:
    files = {p for g in globs for p in ROOT.glob(g) if p.is_file() and "tests/docs" not in p.as_posix()}
    return {p: read(p) for p in sorted(files)}


def read_in_code(name: str, code: dict[Path, str]) -> bool:
    """Whether some code reads `name` from the environment: "NAME" or 'NAME' (os.environ, a
    constant), or $NAME / ${NAME in a shell script."""
    pattern = re.compile(rf"[\"']{name}[\"']|\${{?{name}\b")
    return any(pattern.search(text) for text in code.values())


def env_table(text: str) -> list[str]:
    """The names in the first column of docs/page.md's "Environment variables" table."""
    rows = re.findall(r"^\| (`[A-Z_][A-Z0-9_]*`(?:, `[A-Z_][A-Z0-9_]*`)*) \|", section(text, "Environment variables"),
                      flags=re.M)
    return [name for row in rows for name in re.findall(r"`([A-Z0-9_]+)`", row)]


def env_problems(doc_texts: dict[str, str], table: list[str], code: dict[Path, str],
                 product_code: dict[Path, str]) -> list[str]:
    named = {n for text in doc_texts.values() for n in ENV_NAME.findall(text)}
    problems = [f"{n} is named in the docs but read by no code" for n in sorted(named | set(table))
                if not read_in_code(n, code)]
    read = {n for text in product_code.values() for n in ENV_NAME.findall(text)}
    problems += [f"{n} is read by the code but not in docs/page.md's table" for n in sorted(read - set(table))]
    return problems


RECOMPUTED = re.compile(r"agrees? with the run(?:'s)? within (\d(?:\.\d+)?e-\d+)")


def figure_problems(doc_texts: dict[str, str]) -> list[str]:
    """Figures the docs state in several places, stated one way: a recomputed step agrees with the
    run within one bound (the README's), a run's numbers are not promised as "one number
    everywhere", replay is not "exact" without its bound, and the kernels' compile time (which
    depends on the machine) is given nowhere."""
    problems = []
    bounds = {(name, b) for name, text in doc_texts.items() for b in RECOMPUTED.findall(" ".join(text.split()))}
    if {b for _, b in bounds} - {"1e-4"}:
        problems.append(f"a recomputed step's bound differs from 1e-4: {sorted(bounds)}")
    for name, text in doc_texts.items():
        flat = " ".join(text.split())
        if re.search(r"one number everywhere|replay is exact", flat, flags=re.I):
            problems.append(f"{name}: promises one number everywhere or an exact replay")
        if re.search(r"(?:compiled?|compiler)[^.]{0,80}?\b(?:about|~) ?(?:a|\d+(?:\.\d+)?) ?(?:s|second)\b", flat):
            problems.append(f"{name}: states a compile time for the kernels")
    return problems


MODELS = ("SmolLM2", "Gemma 3 270M")
DISK = re.compile(r"(\d[\d.,]*) ?(MiB|GiB|KiB|MB|GB|KB) of disk")


def disk_problems(doc_texts: dict[str, str]) -> list[str]:
    """Each model's cache on disk, stated one way in every doc, in the binary units `du -h`
    prints: "N UNIT of disk", of the model named last before it in its sentence (issue 62: the
    README said 700 MB and 1.5 GB, docs/page.md 517 MiB and 1.3 GB)."""
    said: dict[str, set] = {}
    problems = []
    for name, text in doc_texts.items():
        for sentence in re.split(r"\.\s+", " ".join(prose(text).split())):
            for m in DISK.finditer(sentence):
                before = sentence[:m.start()]
                model = max(MODELS, key=lambda x: before.rfind(x))
                if before.rfind(model) < 0:
                    continue
                if m.group(2) not in ("MiB", "GiB", "KiB"):
                    problems.append(f"{name}: {model}'s disk in decimal units: {m.group(0)}")
                said.setdefault(model, set()).add(f"{m.group(1)} {m.group(2)}")
    problems += [f"{model}'s disk is stated several ways: {sorted(v)}" for model, v in said.items() if len(v) > 1]
    problems += [f"{model}'s disk is stated nowhere" for model in MODELS if model not in said]
    return problems


# ---------------------------------------------------------------- the real files


def all_docs() -> dict[str, str]:
    return {p.relative_to(ROOT).as_posix(): read(p) for p in [README, *DOCS]}


def test_the_readme_is_short_and_narrow():
    assert size_problems(read(README)) == []


def test_the_readme_opens_with_the_command_that_starts_the_page_and_the_one_that_tests():
    assert first_commands_problems(read(README)) == []


def test_the_install_by_hand_reads_the_cpu_build_before_requirements():
    assert install_problems(section(read(README), "Other ways to install")) == []


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_every_relative_link_points_to_a_file_that_exists(path):
    assert link_problems(path, read(path)) == []


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_every_file_the_docs_name_exists(path):
    assert path_problems(read(path)) == []


def test_the_cli_doc_names_only_the_parsers_subcommands_and_flags():
    from inference.cli import build_parser
    assert cli_problems(read(ROOT / "docs" / "cli.md"), build_parser()) == []


def test_the_page_doc_names_only_the_apps_flags():
    options = section(read(ROOT / "docs" / "page.md"), "Options")
    assert options, "docs/page.md has an Options section"
    assert flag_problems(flags_named(options), app_flags(), "docs/page.md Options") == []


def test_the_environment_variables_named_are_those_the_code_reads():
    table = env_table(read(ROOT / "docs" / "page.md"))
    assert len(table) >= 5, table
    assert env_problems(all_docs(), table, code_files(), code_files(NOT_TESTS)) == []


def test_the_docs_state_each_figure_one_way():
    docs = all_docs()
    assert figure_problems(docs) == []
    assert disk_problems(docs) == []
    assert any(RECOMPUTED.search(" ".join(t.split())) for t in docs.values()), "the bound is stated"


# ---------------------------------------------------------------- each check can fail


def test_the_checks_fail_on_texts_made_wrong(tmp_path):
    assert size_problems("x\n" * 201) and size_problems("x" * 121) and not size_problems("x" * 120)
    good = "CPU machine\npython3 -m venv .venv\npip install torch --index-url " + CPU_INDEX + "\n" + REQUIREMENTS
    assert not install_problems(good + "\nGPU machine")
    assert install_problems(REQUIREMENTS + "\n" + good + "\nGPU machine")  # requirements first
    assert install_problems(good.replace("python3 -m venv .venv\n", "") + "\nGPU machine")  # no venv
    assert install_problems("GPU machine\n" + good)  # the GPU machine's first
    opening = "# T\nintro\n```bash\n./tokenlab          # the page\n./tokenlab test     # the tests\n```\n## Install\n"
    assert not first_commands_problems(opening)
    assert first_commands_problems(opening.replace("./tokenlab test ", "bash scripts/test.sh"))
    assert first_commands_problems("# T\n## Install\n" + opening)  # after a section
    assert first_commands_problems("# T\nno code\n")

    (tmp_path / "there.md").write_text("# A heading\n")
    doc = tmp_path / "doc.md"
    assert not link_problems(doc, "[a](there.md) [b](there.md#a-heading) [c](https://x.org/y) [d](#top)\n# Top")
    assert link_problems(doc, "[a](missing.md)") and link_problems(doc, "[b](there.md#no-such)")
    assert link_problems(doc, "[d](#bottom)\n# Top")

    assert not path_problems("`tests/docs/test_docs.py`, `ui/assets/` and `a/b.py`")
    assert path_problems("`tests/docs/no_such_test.py`")

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    sub.add_parser("run").add_argument("--fast")
    sub.add_parser("walk").add_argument("--slow")
    assert not cli_problems("## run\n`--fast`\n## walk\n`--slow`, `python -m inference walk`", parser)
    assert cli_problems("## run\n`--slow`\n## walk\n", parser)  # walk's flag under run
    assert cli_problems("## run\n`--fast`\n", parser)  # no section for walk
    assert cli_problems("## run\n## walk\n`python -m inference fly`", parser)
    assert flag_problems(["--eng*"], {"--engine-url"}, "x") == [] and flag_problems(["--x*"], {"--y"}, "x")

    code = {Path("a.py"): 'os.environ.get("TOKEN_LAB_REAL")', Path("b.sh"): "${TOKENLAB_SH:-1}"}
    docs = {"d.md": "`TOKEN_LAB_REAL` and `TOKENLAB_SH`"}
    assert not env_problems(docs, ["TOKEN_LAB_REAL", "TOKENLAB_SH"], code, code)
    assert env_problems({"d.md": "`TOKEN_LAB_MADE_UP`"}, ["TOKEN_LAB_REAL", "TOKENLAB_SH"], code, code)
    assert env_problems(docs, ["TOKEN_LAB_REAL"], code, code)  # TOKENLAB_SH read, not in the table
    assert env_table("## Environment variables\n| `A_B` | x |\n| `C`, `D` | y |\n") == ["A_B", "C", "D"]

    both = "SmolLM2 about 700 MiB of disk. Gemma 3 270M about 1.5 GiB of disk."
    assert not disk_problems({"a": both, "b": "Then Gemma 3 270M (1.5 GiB of disk) and SmolLM2 700 MiB of disk."})
    assert disk_problems({"a": both, "b": "SmolLM2 takes 517 MiB of disk."})  # two figures
    assert disk_problems({"a": both.replace("700 MiB", "700 MB")})  # decimal units
    assert disk_problems({"a": "SmolLM2 about 700 MiB of disk."})  # Gemma's nowhere
    assert not figure_problems({"a": "agrees with the run within 1e-4", "b": "compiled once, cached"})
    assert figure_problems({"a": "agrees with the run within 1e-4", "b": "its numbers agree with the run's within 1e-5"})
    assert figure_problems({"a": "a probability is one number everywhere"})
    assert figure_problems({"a": "compiled with the machine's C compiler (`cc`, about a second)"})
    assert figure_problems({"a": "with the C compiler (`-O3 -march=native`, about 0.2 s, cached"})
