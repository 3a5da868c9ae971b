"""Token Lab: launch the playground. `python app.py --help` lists the options."""

from __future__ import annotations

import argparse
import sys

from inference.cli import add_model_args


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Token Lab: watch a language model predict, token by token")
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=None, help="port (default: Gradio's, 7860 or the next free)")
    p.add_argument("--share", action="store_true", help="create a PUBLIC Gradio share link")
    p.add_argument("--auth", default=None, metavar="USER:PASSWORD", help="require this login")
    args = p.parse_args(argv)
    if args.auth is not None:
        user, sep, password = args.auth.partition(":")
        if not sep or not user or not password:
            p.error("--auth must be USER:PASSWORD")
        args.auth = (user, password)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from inference.engine import Engine
    from inference.errors import TokenLabError

    try:
        engine = Engine.load(args.model, args.device, args.dtype, args.decode_dtype, args.kv_pool_mib)
    except TokenLabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    from ui.layout import build_ui, launch

    print(f"Loaded {engine.name}: {engine.cfg.n_layers} layers, {engine.dtype} on {engine.device}",
          file=sys.stderr)
    if args.share:
        print("WARNING: --share creates a PUBLIC link. Anyone who has it can use this playground "
              "and your machine's compute" + ("" if args.auth else "; consider --auth USER:PASSWORD")
              + ".", file=sys.stderr)
    launch(build_ui(engine), engine, host=args.host, port=args.port, share=args.share, auth=args.auth)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
