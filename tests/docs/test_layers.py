"""The house's layers, read from the code's own imports (every import statement, those inside
functions included; only `if TYPE_CHECKING:` blocks, which never run, are left out): no module
imports a layer above its own, api/ and ui/ never import each other, and no import inside a
function crosses from one top-level package into another (app.py, the launcher, excepted: it
defers torch and gradio until a page is asked for)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("inference", "server", "api", "ui")

# Lowest first. A module may import its own group and any group of a lower rank; groups of one
# rank never import each other.
RANKS = {
    "inference.errors": 0, "inference.events": 0, "inference.paths": 0,
    "inference.device": 1,
    "inference.model": 2, "inference.sampling": 2,
    "inference.loading": 3, "inference.decoding": 3,
    "inference.request": 4,
    "inference.samples": 5,
    "inference.contract": 6,
    "inference.serving": 7, "inference.remote": 7,
    "inference.factory": 8, "inference.lesson": 8,  # the lesson: numbers of a run on an engine it is given
    "inference.lenses": 8,  # the quantization lens: engines of its own, one per precision
    "inference.cli_scoring": 8.5,  # the CLI's text commands: read by cli.py alone
    "inference.cli": 9,
    "inference.__main__": 10,
    "server": 11,
    "api": 12, "ui": 12,
    "app": 13,
}


def group(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "inference" and len(parts) > 1 else parts[0]


def module_name(path: Path, root: Path = ROOT) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def imports(path: Path):
    """(line, imported module, inside a function) for every import of one of our packages."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
              for n in ast.walk(f)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in (*PACKAGES, "app"):
                yield node.lineno, name, id(node) in nested


def sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))] + [ROOT / "app.py"]


def edges(paths: list[Path] | None = None, root: Path = ROOT):
    """(file, line, its group, the imported group, inside a function) for every import of the
    sources (or of `paths`, files under `root`)."""
    for path in sources() if paths is None else paths:
        mod = module_name(path, root)
        for line, name, lazy in imports(path):
            yield path.relative_to(root), line, group(mod), group(name), lazy


def test_every_module_has_a_layer():
    unknown = {g for _, _, g, _, _ in edges()} | {t for _, _, _, t, _ in edges()}
    assert unknown <= set(RANKS), f"groups with no rank in RANKS: {sorted(unknown - set(RANKS))}"


def test_no_module_imports_a_layer_above_or_beside_its_own():
    wrong = [f"{path}:{line}: {src} imports {dst}" for path, line, src, dst, _ in edges()
             if src != dst and RANKS[dst] >= RANKS[src]]
    assert not wrong, "\n".join(wrong)


def test_no_import_inside_a_function_crosses_packages():
    wrong = [f"{path}:{line}: {src} imports {dst} inside a function" for path, line, src, dst, lazy in edges()
             if lazy and src != "app" and src.split(".")[0] != dst.split(".")[0]]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("code, wrong", [
    ("from ui.layout import build_ui\n", "ui"),  # api importing the page
    ("def f():\n    from inference.serving.models import Models\n", "inference"),  # a lazy cross-package import
])
def test_a_wrong_edge_is_seen(tmp_path, code, wrong):
    """The checks above fail on a module that breaks them (here: a file of api/, written in a
    copy of the tree's layout under tmp_path: never in the source tree, where another test
    process lists the files)."""
    fake = tmp_path / "api" / "_layers_probe.py"
    fake.parent.mkdir()
    fake.write_text(code)
    found = list(edges([fake], tmp_path))
    assert [dst.split(".")[0] for _, _, _, dst, _ in found] == [wrong]
    _, _, src, dst, lazy = found[0]
    assert RANKS[dst] >= RANKS[src] or (lazy and src.split(".")[0] != dst.split(".")[0])


# ---------------------------------------------------------------- inside the page (ui/)

def ui_node(module: str) -> str:
    """The page's part a module belongs to: ui.run for ui.run.handlers, ui.format for ui.format."""
    return ".".join(module.split(".")[:2])


def ui_edges(root: Path = ROOT, paths: list[Path] | None = None) -> dict[str, set[str]]:
    """{part of ui: the other parts of ui it imports} (every import, those in functions too)."""
    out: dict[str, set[str]] = {}
    for path in sorted((root / "ui").rglob("*.py")) if paths is None else paths:
        src = ui_node(module_name(path, root))
        for _, name, _ in imports(path):
            dst = ui_node(name)
            if name.startswith("ui.") and dst != src:
                out.setdefault(src, set()).add(dst)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle of the graph that a depth-first walk finds (each once, from its least name)."""
    found, state = [], {}

    def walk(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                loop = path[path.index(nxt):]
                k = loop.index(min(loop))
                if loop[k:] + loop[:k] not in found:
                    found.append(loop[k:] + loop[:k])
            elif nxt not in state:
                walk(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            walk(node, [node])
    return found


def sections(root: Path = ROOT) -> set[str]:
    """The page's sections: each part of ui with a section's build (a package's section.py, or a
    module of its own, ui/chat.py), as ui/layout.py lists them."""
    tree = ast.parse((root / "ui" / "layout.py").read_text(encoding="utf-8"))
    listed = next(n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                  and getattr(n.targets[0], "id", "") == "SECTIONS")
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ui"):
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}" if node.module == "ui" else node.module
    return {ui_node(aliases[e.id]) for e in listed.elts}


def test_no_import_cycle_between_the_pages_parts():
    assert cycles(ui_edges()) == [], "import cycles between ui's parts"


def test_no_section_imports_another():
    """What sections share is below them (ui/shared, ui/base, ui/format, …): a section imports
    none of the others; ui/handlers.py and ui/layout.py, above them all, import each."""
    parts = sections()
    assert {"ui.run", "ui.branches", "ui.chat", "ui.lesson", "ui.work"} <= parts, parts
    wrong = {src: dst & (parts - {src}) for src, dst in ui_edges().items() if src in parts and dst & (parts - {src})}
    assert wrong == {}, f"sections importing other sections: {wrong}"


def test_a_cycle_and_a_section_importing_another_are_seen(tmp_path):
    """The two checks above fail on a tree made to break them (written under tmp_path)."""
    ui = tmp_path / "ui"
    (ui / "a").mkdir(parents=True)
    (ui / "a" / "section.py").write_text("from ui.b.render import x\n")
    (ui / "b").mkdir()
    (ui / "b" / "render.py").write_text("from ui.a.section import y\n")
    (ui / "layout.py").write_text("from ui.a import section as a\nfrom ui.b import section as b\nSECTIONS = (a, b)\n")
    graph = ui_edges(tmp_path)
    assert cycles(graph) == [["ui.a", "ui.b"]]
    assert sections(tmp_path) == {"ui.a", "ui.b"} and "ui.b" in graph["ui.a"]


@pytest.mark.parametrize("package", ["ui", "api"])
def test_no_file_of_the_page_or_the_api_is_over_450_lines(package):
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / package).rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 450}
    assert long == {}, f"files over 450 lines: {long}"
