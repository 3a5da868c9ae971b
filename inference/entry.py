"""`token-lab`, the command `pip install .` makes (pyproject.toml's [project.scripts]).

`token-lab [--model ...] [--port N] [--share] ...` opens the page exactly as `python app.py ...`;
`token-lab generate|tokenize|score|score-text ...` runs the engine from the command line exactly as
`python -m inference ...`. Same options, same exit status."""

from __future__ import annotations

import argparse
import sys


def commands() -> tuple[str, ...]:
    """The subcommands of `python -m inference`, as its parser names them."""
    from inference.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return tuple(sub.choices)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    names = commands()
    if argv and argv[0] in names:
        from inference.cli import main as cli_main
        return cli_main(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(f"token-lab {{{','.join(names)}}} ...: the engine from the command line, as `python -m "
              "inference` (`token-lab generate --help`). Otherwise token-lab opens the page, as "
              "`python app.py`:\n")
        sys.stdout.flush()
    import app  # app.py, installed beside the packages (pyproject.toml: py-modules)
    return app.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
