"""Token Lab: launch the playground. `python app.py --help` lists the options."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from contextlib import contextmanager

from inference.factory import add_engine_args, add_model_args
from server.logins import AUTH_ENV, parse_login, read_logins

def count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 (no limit) or more")
    return value


def parse_args(argv=None, environ=os.environ) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Token Lab: watch a language model predict, token by token")
    add_model_args(p, many=True)
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=None, help="port (default: Gradio's, 7860 or the next free)")
    p.add_argument("--share", action="store_true", help="create a PUBLIC Gradio share link (with the "
                   "limits below on by default)")
    g = p.add_argument_group("login", f"logins come from all of --auth, --auth-file and ${AUTH_ENV}=USER:PASSWORD; "
                             "the last two keep the password out of the process list")
    g.add_argument("--auth", default=None, metavar="USER:PASSWORD", help="require this login")
    g.add_argument("--auth-file", default=None, metavar="PATH", help="require one of these logins "
                   "(one USER:PASSWORD a line)")
    lim = p.add_argument_group("limits", "what one visitor may cost: on with --share (the defaults in "
                               "parentheses), off otherwise; 0 = no limit")
    lim.add_argument("--max-new-tokens-cap", type=count, default=None, metavar="N",
                     help="at most N new tokens a run (512)")
    lim.add_argument("--runs-per-client", type=count, default=None, metavar="N",
                     help="runs (and scores, comparisons, replays) queued or running per visitor, "
                          "a visitor being a login, else an IP address (1)")
    lim.add_argument("--max-samples", type=count, default=None, metavar="N",
                     help="at most N samples drawn at once by \"Many samples\" (16; without a limit 64)")
    lim.add_argument("--max-score-tokens", type=count, default=None, metavar="N",
                     help="at most N tokens of a text scored in one pass: a prompt's log-probabilities, "
                          "\"The probability of a text\" (2048)")
    lim.add_argument("--lens-precisions", type=count, default=None, metavar="N",
                     help="at most N precisions besides float32 in one quantization lens (2)")
    lim.add_argument("--max-tree-nodes", type=count, default=None, metavar="N",
                     help="at most N nodes in one tree the loom grows (64; without a limit 256)")
    lim.add_argument("--sessions-per-client", type=count, default=None, metavar="N",
                     help="open sessions (tabs, API clients) per visitor; one idle for 15 minutes "
                          "stops counting (8)")
    args = p.parse_args(argv)
    args.logins = read_logins(args, p, environ)
    if args.auth is not None:
        args.auth = parse_login(args.auth)
    return args


def limits_for(args):
    """The limits of a --share page by default, none otherwise; the flags set each one."""
    from server.limits import Limits
    values = dict(max_new_tokens=args.max_new_tokens_cap, runs_per_client=args.runs_per_client,
                  sessions_per_client=args.sessions_per_client, max_samples=args.max_samples,
                  max_score_tokens=args.max_score_tokens, lens_precisions=args.lens_precisions,
                  max_tree_nodes=args.max_tree_nodes)
    return Limits.shared(**values) if args.share else Limits.local(**values)


@contextmanager
def stop_on_signals():
    """SIGTERM (a service manager, `kill`) stops the page as Ctrl-C does: as a KeyboardInterrupt
    in the main thread, which ends Gradio's wait. Yields a list of callables the first signal
    runs before that, and an event it sets: the wait ends at it too, since a KeyboardInterrupt
    raised where the signal lands in code that swallows exceptions (a weakref's callback) is
    lost. Later signals are ignored: they come while the page and the engine close, and a close
    cut short could leave a thread computing while the interpreter finalizes."""
    before_stop: list = []
    stopping = threading.Event()
    if threading.current_thread() is not threading.main_thread():  # only there can they be caught
        yield before_stop, stopping
        return

    def stop(signum, frame):
        if not stopping.is_set():
            stopping.set()
            for f in before_stop:
                f()
            raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield before_stop, stopping
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def port_problem(port: int | None) -> str | None:
    """Why the page could not be served on --port, checked before the model loads (which takes
    minutes); None when it can. Without --port, Gradio takes 7860 or the next free one of its
    range: a problem only when all are taken. Bound as Gradio checks it (its http_server)."""
    import socket
    from gradio.http_server import INITIAL_PORT_VALUE, LOCALHOST_NAME, TRY_NUM_PORTS

    ports = [port] if port is not None else range(INITIAL_PORT_VALUE, INITIAL_PORT_VALUE + TRY_NUM_PORTS)
    reason = "none to try"
    for p in ports:
        try:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((LOCALHOST_NAME, p))
            return None
        except OverflowError:  # a port outside 0-65535
            return f"--port must be from 0 to 65535, got {port}"
        except OSError as e:
            reason = e.strerror or str(e)
    if port is not None:
        return f"--port {port} cannot be used: {reason} (another program may be serving on it)"
    return (f"no free port from {ports.start} to {ports.stop - 1} ({reason}): choose one with --port")


def main(argv=None) -> int:
    """Serve the page until Ctrl-C or SIGTERM, then close it and the engine: exit status 0; 2 for
    bad arguments (a --port already taken among them), 1 for a model that cannot be loaded."""
    args = parse_args(argv)
    if (problem := port_problem(args.port)) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    with stop_on_signals() as (before_stop, stopping):
        try:
            return _serve(args, before_stop, stopping)
        except KeyboardInterrupt:  # stopped before the page was up (the engine is closed)
            return 0


def _end_streams(demo, models) -> None:
    """End what keeps connections open, before Gradio stops its web server, which waits for
    them (up to 5 s, twice): the runs (their streams end with them) and the sessions' heartbeat
    streams (which end when the app's stop event is set, as demo.close() does)."""
    models.close()
    app = getattr(demo, "server_app", None) or getattr(demo, "app", None)
    if getattr(app, "stop_event", None) is not None:
        app.stop_event.set()


def serve(demo, engine, *, auth=None, **kwargs):
    """The page (ui.layout.launch's arguments) and, beside it on the same server, the
    OpenAI-compatible API: the same engine, run registry, per-visitor limits and logins."""
    from api.routes import API
    from ui.layout import launch
    h = demo.tokenlab_handlers
    logins = [auth] if isinstance(auth, tuple) else list(auth or [])
    return launch(demo, engine, auth=auth, beside=[API(engine, h.page.registry, h.page.limits, logins, h.page.models)], **kwargs)


def _serve(args, before_stop: list, stopping: threading.Event) -> int:
    from inference.factory import open_models
    from inference.errors import InputError, TokenLabError

    try:
        models = open_models(args)
    except TokenLabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, InputError) else 1
    from ui.handlers import Handlers
    from ui.layout import build_ui
    from ui.run.render import limits_markdown

    with models:
        engine = models.engine()
        info = engine.describe()
        print(f"Using {info.name} on {info.where} (context {info.max_seq_len:,} tokens"
              + ("" if info.capabilities.whole_distribution else
                 f", the server's {info.capabilities.logprobs} log-probabilities") + ")", file=sys.stderr)
        if len(models.labels) > 1:
            print("The page also offers, each loaded on its first use: " + ", ".join(models.labels[1:]),
                  file=sys.stderr)
        if args.auth is not None:
            print(f"note: a password given with --auth shows in the process list; ${AUTH_ENV} or "
                  "--auth-file keep it out", file=sys.stderr)
        if args.share:
            print("WARNING: --share creates a PUBLIC link. Anyone who has it can use this playground "
                  "and your machine's compute" + ("" if args.logins else "; consider --auth-file PATH")
                  + ".", file=sys.stderr)
        limits = limits_for(args)
        if limits.any:
            print("Limits: " + limits_markdown(limits).removeprefix("**Shared page:** "), file=sys.stderr)
        handlers = Handlers(engine, limits=limits, models=models)
        demo = build_ui(engine, handlers)
        before_stop.append(lambda: _end_streams(demo, models))
        try:  # launch returns when Gradio's wait ends (Ctrl-C, SIGTERM, whose KeyboardInterrupt may be lost)
            serve(demo, engine, host=args.host, port=args.port, share=args.share,
                   auth=args.logins or None, stopped=stopping)
        except TokenLabError as e:  # (ui.layout.PageUnreachable)
            print(f"error: {e}", file=sys.stderr)
            return 1
        finally:
            demo.close(verbose=False)
    print("Token Lab stopped", file=sys.stderr)
    return 0


def cli_commands() -> tuple[str, ...]:
    """The subcommands of `python -m inference`, as its parser names them."""
    from inference.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return tuple(sub.choices)


def token_lab(argv: list[str] | None = None) -> int:
    """`token-lab`, the command `pip install .` makes (pyproject.toml's [project.scripts]):
    `token-lab [--model ...] [--port N] [--share] ...` opens the page exactly as `python app.py ...`;
    `token-lab generate|tokenize|score|score-text ...` runs the engine from the command line exactly
    as `python -m inference ...`. Same options, same exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    names = cli_commands()
    if argv and argv[0] in names:
        from inference.cli import main as cli_main
        return cli_main(argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(f"token-lab {{{','.join(names)}}} ...: the engine from the command line, as `python -m "
              "inference` (`token-lab generate --help`). Otherwise token-lab opens the page, as "
              "`python app.py`:\n")
        sys.stdout.flush()
    return main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
