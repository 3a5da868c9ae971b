"""The page's and the API's logins: --auth USER:PASSWORD, --auth-file PATH and $TOKENLAB_AUTH."""

from __future__ import annotations

import argparse
import os

AUTH_ENV = "TOKENLAB_AUTH"


def parse_login(text: str) -> tuple[str, str] | None:
    user, sep, password = text.strip().partition(":")
    return (user, password) if sep and user and password else None


def read_logins(args, p: argparse.ArgumentParser, environ=os.environ) -> list[tuple[str, str]]:
    """The logins of --auth, --auth-file (one USER:PASSWORD a line; blank lines and lines
    starting with # are skipped) and $TOKENLAB_AUTH (USER:PASSWORD), all of them. A bad entry
    is an error that names where it is, never what it says (it may hold a password)."""
    logins = []
    if args.auth is not None:
        if (login := parse_login(args.auth)) is None:
            p.error("--auth must be USER:PASSWORD")
        logins.append(login)
    if args.auth_file is not None:
        try:
            with open(args.auth_file, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            p.error(f"--auth-file: cannot read {args.auth_file}: {getattr(e, 'strerror', None) or e}")
        for n, line in enumerate(lines, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if (login := parse_login(line)) is None:
                p.error(f"--auth-file {args.auth_file}, line {n}: expected USER:PASSWORD")
            logins.append(login)
        if not logins:
            p.error(f"--auth-file {args.auth_file}: no USER:PASSWORD line")
    if environ.get(AUTH_ENV):
        if (login := parse_login(environ[AUTH_ENV])) is None:
            p.error(f"${AUTH_ENV} must be USER:PASSWORD")
        logins.append(login)
    return logins
