"""`python -m inference`: generate and tokenize from the command line, for people and scripts.

Exit status: 0 after a complete run, 2 for bad arguments or input, 1 for a model that cannot be
loaded (or a server that fails), 130 on Ctrl-C. The engine is closed before the program exits:
its scheduler thread must not be inside torch while the interpreter finalizes (that aborts)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

from inference.cli_scoring import cmd_score, cmd_score_text, cmd_tokenize, tokens_text
from inference.errors import InputError, NotAvailable, TokenLabError
from inference.factory import MODEL_HELP, add_engine_args, add_model_args, open_engine
from inference.lenses import command as quantize_compare
from inference.samples import MAX_SAMPLES, first_seed
from inference.sampling.settings import CONSTRAINT_KINDS, MAX_CONSTRAINT_CHARS, SETTINGS, how_made


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def number(text: str) -> int | float:
    """A float setting's flag as the number written (5 stays 5, as an API's JSON sends it): the
    schema checks its range, in the words every door uses."""
    try:
        return int(text)
    except ValueError:
        return float(text)  # (argparse says "invalid number value" for text that is none)


def add_setting_args(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """A flag per sampling setting of the schema (but the constraint's and `skip`). Defaults:
    the model's generation_config.json, else the settings' own."""
    for s in SETTINGS:  # a text setting takes its items as one argument or several
        if s.stage_name == "constraint" or s.name in skip:  # the constraint's flags: one per kind
            continue
        p.add_argument(s.flag, type={str: str, int: int}.get(s.kind, number), default=None, nargs="+" if s.kind is str else None,
                       help=f"{s.help}; {'' if s.kind is str else 'in '}{s.range_text()}, default {s.default_text()}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m inference", description="Token Lab inference engine",
                     epilog="exit status: 0 after a complete run, 2 for bad arguments, 1 for a "
                            "model that cannot be loaded or a server that fails, 130 on Ctrl-C "
                            "(the run's summary then says \"interrupted\")")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate a continuation, streaming")
    add_model_args(g)
    add_engine_args(g)
    g.add_argument("--prompt", required=True)
    g.add_argument("--chat", action="store_true", help="render the prompt with the chat template")
    g.add_argument("--system", default=None, help="system prompt for --chat")
    g.add_argument("--prefix-ids", default=None, metavar="ID,ID,...",
                   help="continue after the prompt and these token ids, as a branch of a run: the "
                        "settings count them as generated; the output is the tokens after them")
    add_setting_args(g)
    kinds = g.add_mutually_exclusive_group()
    for kind, (what, arg, _) in CONSTRAINT_KINDS.items():
        kinds.add_argument("--" + kind.replace("_", "-"), default=None, metavar=arg,
                           help=f"only text this {what} allows is sampled"
                                + (" (a file)" if arg == "PATH" else "") + "; a run ends when it is complete")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", nargs="*", default=[], help="stop strings (not emitted)")
    g.add_argument("--top", type=int, default=5, help="candidates reported per step (in --jsonl's lines)")
    g.add_argument("--jsonl", action="store_true", help="one JSON object per step, then a summary")
    g.add_argument("--speculative", default=None, metavar="DRAFTER",
                   help="speculative decoding with a drafter: prompt-lookup (n-grams of the context), "
                        "early-exit:L (this model's first L layers through its LM head) or model:NAME "
                        "(a second model with the same tokenizer); the text's distribution is the model's own")
    g.add_argument("--draft-tokens", type=int, default=4, metavar="K",
                   help="tokens the drafter proposes per round, checked in one forward pass (default 4)")
    g.add_argument("--n", type=int, default=1, metavar="N",
                   help=f"draw N samples at once (1..{MAX_SAMPLES}), sample k with seed --seed + k "
                        "(a random start without --seed); every line and summary says its sample and seed")

    sc = sub.add_parser("score", help="log-probabilities of a continuation, teacher-forced")
    add_model_args(sc)
    add_engine_args(sc)
    sc.add_argument("--prompt", required=True)
    sc.add_argument("--continuation", required=True)
    sc.add_argument("--chat", action="store_true", help="render the prompt with the chat template")
    sc.add_argument("--jsonl", action="store_true", help="one JSON object per token, then the sum")

    st = sub.add_parser("score-text", help="the probability of every token of a text given the tokens before it")
    add_model_args(st)
    add_engine_args(st)
    st.add_argument("--text", required=True)
    st.add_argument("--top", type=int, default=5, help="tokens the model preferred, listed per token (0: none, each token's own probability and rank only)")
    st.add_argument("--jsonl", action="store_true", help="one JSON object per token, then a summary")

    ex = sub.add_parser("explain", help="follow the prompt's next token through the model: every chapter of "
                                        "the page's lesson, with this prompt's numbers and this machine's measurements")
    add_model_args(ex)
    add_engine_args(ex)
    ex.add_argument("--prompt", required=True)
    add_setting_args(ex, skip=("max_new_tokens",))
    ex.add_argument("--seed", type=int, default=None)
    ex.set_defaults(stop=[])
    ex.add_argument("--steps", type=int, default=None, metavar="N",
                    help="tokens the lesson's run makes, and the KV-cache demonstration's steps (default 16)")
    ex.add_argument("--jsonl", action="store_true", help="one JSON object per chapter (else a short summary per chapter)")
    ex.add_argument("--follow", choices=("top", "sampled"), default="top",
                    help="the token followed: the most likely one at each step (default), or one drawn with the settings")
    ex.add_argument("--chat", action="store_true", help="read the prompt as a chat message in the model's template")
    ex.add_argument("--system", default=None, help="with --chat: the system prompt")

    quantize_compare.add_parser(sub, MODEL_HELP)

    t = sub.add_parser("tokenize", help="print the ids and pieces the model is fed")
    add_model_args(t)
    add_engine_args(t)
    t.add_argument("--text", required=True)
    return parser


def _sampling_params(args, model_defaults: dict):
    """The flags' settings over a model's defaults, parsed as every door's are (prepare_run)."""
    from inference.request import parse_settings
    return parse_settings(_settings(args), model_defaults, args.seed, args.stop)


def _settings(args) -> dict:
    """The sampling settings the flags give, by schema name (those not given: the model's
    defaults, merged by prepare_run)."""
    values = {s.name: getattr(args, s.name, None) for s in SETTINGS if getattr(args, s.name, None) is not None}
    values = {k: ", ".join(v) if isinstance(v, list) else v for k, v in values.items()}
    return {**values, **_constraint(args)}


def _constraint(args) -> dict:
    """--json-schema PATH, --regex PATTERN or --grammar PATH as the constraint settings, checked
    here so that an error names the flag, not the setting (constraint_text)."""
    from inference.sampling.constrain import check

    for kind, (what, arg, _) in CONSTRAINT_KINDS.items():
        given = getattr(args, kind, None)
        if given is None:
            continue
        flag = "--" + kind.replace("_", "-")
        text = given
        if arg == "PATH":
            try:
                with open(given, encoding="utf-8") as f:
                    text = f.read(MAX_CONSTRAINT_CHARS + 1)
            except (OSError, UnicodeDecodeError) as e:
                raise InputError(f"{flag}: cannot read {given!r} ({e.__class__.__name__})") from None
        try:
            check(kind, text)
        except InputError as e:
            message = str(e)
            raise InputError(flag + message.removeprefix("constraint_text") if message.startswith("constraint_text")
                             else f"{flag}: {message}") from None
        return {"constraint": kind, "constraint_text": text}
    return {}


@contextmanager
def _ctrl_c_cancels(cancel: threading.Event):
    """Ctrl-C ends the run at its next step, as the page's Stop does, so that what it made and
    its summary are still printed; a second Ctrl-C interrupts at once."""
    if threading.current_thread() is not threading.main_thread():  # only there can it be caught
        yield
        return

    def interrupt(signum, frame):
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _cmd_generate(args) -> int:
    from inference.request import prepare_run
    from inference.serving.engine import parse_ids

    _sampling_params(args, {})  # bad values fail before the model loads
    if args.top < 1:
        raise InputError(f"--top must be >= 1, got {args.top}")
    if not 1 <= args.n <= MAX_SAMPLES:
        raise InputError(f"--n must be from 1 to {MAX_SAMPLES}, got {args.n}")
    if not args.prompt.strip():
        raise InputError("the prompt is empty")
    if args.system is not None and not args.chat:
        raise InputError("--system is the chat template's system prompt: give --chat too")
    given = parse_ids(args.prefix_ids, "--prefix-ids")
    if args.n != 1 and given:
        raise InputError("--prefix-ids and --n together are not served: draw the samples of a branch "
                         "by its prompt and ids on the page, or one branch at a time here")
    engine = open_engine(args)
    cancel = threading.Event()
    # Ctrl-C is caught until the engine is closed: a close cut short could leave its thread
    # computing while the interpreter finalizes.
    with _ctrl_c_cancels(cancel), engine:
        seed = first_seed(args.seed, args.n) if args.n != 1 else args.seed
        request = prepare_run(engine, _settings(args), prompt=args.prompt, chat=args.chat, system=args.system,
                              given=given, seed=seed, stop=args.stop, top_n=args.top)
        name = _made_by(engine.describe())
        if args.speculative is not None:
            if args.n != 1 or given:
                raise InputError("--speculative runs one sample of a prompt: not with --n or --prefix-ids")
            return _speculative(args, engine, request, cancel, name)
        if request.params.num_beams > 1:
            if args.n != 1:
                raise InputError("--num-beams and --n together are not served: a beam search returns its beams")
            return _print_beams(engine.run(request, cancel), args.jsonl, cancel, name)
        if args.n != 1:
            samples = engine.generate_many(list(request.prompt_ids), request.params, args.n, args.top, cancel)
            return _print_samples(samples, args.jsonl, cancel, request.params, name)
        return _print_run(engine.run(request, cancel), args.jsonl, cancel, request.params, name, given)


def _print_run(events, jsonl: bool, cancel: threading.Event, params=None, model: dict | None = None,
               prefix_ids=()) -> int:
    """Print a run's steps and its summary; 130 if Ctrl-C ended it ("interrupted"), else 0."""
    from inference.events import DoneEvent, StepEvent

    shown = []
    for ev in events:
        if not isinstance(ev, (StepEvent, DoneEvent)):  # the run's progress before its tokens
            continue
        if isinstance(ev, DoneEvent) and ev.reason == "cancelled" and cancel.is_set():
            ev = dataclasses.replace(ev, reason="interrupted")
        if jsonl:
            line = _summary(ev, params, model, cancel, prefix_ids) if isinstance(ev, DoneEvent) else ev.to_json()
            print(json.dumps(line, ensure_ascii=False), flush=True)
        elif isinstance(ev, DoneEvent):
            printed = "".join(shown)
            sys.stdout.write(ev.text[len(printed):] + "\n")
            print(f"[{ev.reason}: {tokens_text(ev.generated_tokens)}, TTFT {ev.ttft_ms:.0f} ms, "
                  f"{ev.decode_tokens_per_s:.1f} tok/s, seed {ev.seed}"
                  + (f", max new tokens capped at {ev.max_new_tokens}" if ev.capped else "")
                  + (", the constraint is not complete" if ev.constraint_complete is False else "") + "]",
                  file=sys.stderr)
        else:
            shown.append(ev.text)
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        if isinstance(ev, DoneEvent):
            return 130 if ev.reason == "interrupted" else 0
    return 0


def _speculative(args, engine, request, cancel: threading.Event, model: dict | None) -> int:
    """A speculative run: with --jsonl a line per token (proposed? accepted? p, q, the coin) and
    the summary; else the text, and on stderr the acceptance and the target passes."""
    from contextlib import ExitStack

    from inference.decoding.drafters import make_drafter
    from inference.decoding.speculative import SpecDoneEvent, Speculator, check_speculative, timed
    from inference.events import StepEvent
    from inference.serving.engine import Engine

    check_speculative(request.params, args.draft_tokens)
    if not hasattr(engine, "model"):
        raise InputError("speculative decoding needs the local engine (the model's own forward passes)")
    with ExitStack() as drafts:
        def load(name):
            return drafts.enter_context(Engine.load(name, args.device, args.dtype, args.decode_dtype, args.kv_pool_mib, products=args.products))
        capacity = len(request.ids) + request.max_new + args.draft_tokens + 1
        drafter = make_drafter(args.speculative, engine, capacity, load)
        printed, tokens, first = [], [], None
        for ev in Speculator(engine, drafter, args.draft_tokens, top_n=args.top).run(request, cancel):
            done = isinstance(ev, SpecDoneEvent)
            if not done:
                tokens.append(ev.token_id)
                first = first or time.perf_counter()
            reason = ("interrupted" if ev.reason == "cancelled" and cancel.is_set() else ev.reason) if done else None
            if done:  # the same request decoded plainly, just after: the speed-up, measured
                rate = (len(tokens) - 1) / (time.perf_counter() - first) if len(tokens) > 1 else None
                plain, plain_rate, _ = ([], None, None) if cancel.is_set() else \
                    timed(engine.run(request, cancel), StepEvent)
                same = tokens == [e.token_id for e in plain] if request.params.greedy and plain else None
                speed = {"tokens_per_s": rate, "plain_tokens_per_s": plain_rate,
                         "speed_up": rate / plain_rate if rate and plain_rate else None, "same_as_plain": same}
            if args.jsonl:
                line = {**ev.to_json(), "reason": reason, **speed, **(model or {})} if done \
                    else ev.to_json()
                print(json.dumps(line, ensure_ascii=False), flush=True)
            elif not done:
                printed.append(ev.text)
                sys.stdout.write(ev.text)
                sys.stdout.flush()
            else:
                accepted = ev.acceptance_rate
                sys.stdout.write(ev.text[len("".join(printed)):] + "\n")
                print(f"[{reason}: {tokens_text(ev.generated_tokens)} in {ev.rounds} target passes, "
                      f"{ev.accepted} of {ev.proposed} proposals accepted"
                      + (f" ({accepted:.0%})" if accepted is not None else "")
                      + f", {ev.drafter}, {ev.draft_tokens} a round, seed {ev.seed}; "
                      + (f"{rate:.1f} tok/s" if rate else "too few tokens to time")
                      + (f" against {plain_rate:.1f} for plain decoding just after ({rate / plain_rate:.2f}x)"
                         if rate and plain_rate else "")
                      + ("" if same is None else ", the same text" if same else ", ⚠ another text") + "]",
                      file=sys.stderr)
            if done:
                return 130 if reason == "interrupted" else 0
    return 0


def _print_beams(events, jsonl: bool, cancel: threading.Event, model: dict | None) -> int:
    """A beam search: with --jsonl a line per step (every hypothesis, its cumulative log-probability
    and status) and the summary with every finished beam; else the best beam's text with its
    score, then the other finished beams, best first. 130 after Ctrl-C."""
    from inference.decoding.beams import UNSCORED, unscored_message
    from inference.events import BeamDoneEvent, BeamStepEvent

    for ev in events:
        if isinstance(ev, BeamStepEvent) and jsonl:
            print(json.dumps(ev.to_json(), ensure_ascii=False), flush=True)
        if not isinstance(ev, BeamDoneEvent):
            continue
        reason = "interrupted" if ev.reason == "cancelled" and cancel.is_set() else ev.reason
        if reason == UNSCORED:  # nothing to print: the reason, exit 2 (the setting's)
            raise InputError(unscored_message(ev.length_penalty), field="length_penalty")
        if jsonl:
            print(json.dumps({**ev.to_json(), "reason": reason, **(model or {})},
                             ensure_ascii=False), flush=True)
        else:
            for i, (beam, text) in enumerate(zip(ev.beams, ev.texts)):
                if i:
                    print(f"--- beam {i + 1} ---")
                print(text)
                print(f"[beam {i + 1}: score {beam.score:.4f} = log p {beam.logprob:.4f} / "
                      f"{len(beam.tokens)}^{ev.length_penalty:g}]", flush=True)
            print(f"[{reason}: {ev.num_beams} beams, {ev.steps} steps, {len(ev.beams)} finished]", file=sys.stderr)
        return 130 if reason == "interrupted" else 0
    return 0


def _made_by(info) -> dict:
    """What made a run, for its summary line: the model, and (a quantized model on a CPU) the
    products its matrices ran ("integer" with the stated bound, or "float32")."""
    return {"model": info.name, **({"products": info.products} if info.products else {})}


def _summary(ev, params, model: dict | None, cancel: threading.Event, prefix_ids=()) -> dict:
    """A run's last JSONL line: its DoneEvent ("interrupted" after Ctrl-C), how it was made (with
    --prefix-ids, those ids among its settings: the run continued after them), the model."""
    if ev.reason == "cancelled" and cancel.is_set():
        ev = dataclasses.replace(ev, reason="interrupted")
    made = how_made(params, prefix_ids) if params is not None else {}
    return {**ev.to_json(), **made, **(model or {})}


def _print_samples(samples, jsonl: bool, cancel: threading.Event, params, model: dict | None) -> int:
    """Print n samples: with --jsonl every step and summary as it comes, each with "sample" (k)
    and its "seed"; else each sample's text when it ends, its summary on stderr. 130 after Ctrl-C."""
    from inference.events import DoneEvent, StepEvent

    interrupted = False
    for k, ev in samples:
        if not isinstance(ev, (StepEvent, DoneEvent)):
            continue
        if isinstance(ev, DoneEvent):
            line = _summary(ev, params, model, cancel)
            interrupted = interrupted or line["reason"] == "interrupted"
            if jsonl:
                print(json.dumps({"sample": k, **line}, ensure_ascii=False), flush=True)
            else:
                print(f"--- sample {k} (seed {ev.seed}) ---\n{ev.text}", flush=True)
                print(f"[sample {k}: {line['reason']}: {tokens_text(ev.generated_tokens)}, seed {ev.seed}]", file=sys.stderr)
        elif jsonl:  # the first seed is chosen before the samples start: sample k's is seed + k
            print(json.dumps({"sample": k, "seed": params.seed + k, **ev.to_json()}, ensure_ascii=False), flush=True)
    return 130 if interrupted else 0


def _cmd_explain(args) -> int:
    from inference.lesson.explain import STEPS, explain
    from inference.lesson.summary import summary_line

    settings = _settings(args)
    _sampling_params(args, {})  # bad values fail before the model loads
    steps = STEPS if args.steps is None else args.steps
    if not 2 <= steps <= 256:
        raise InputError(f"--steps must be from 2 to 256, got {steps}")
    if not args.prompt.strip():
        raise InputError("the prompt is empty")
    with open_engine(args) as engine:
        lesson = explain(engine, args.prompt, settings, steps=steps, seed=args.seed, follow=args.follow,
                         chat=args.chat, system=args.system)
    for chapter in lesson.chapters:
        print(json.dumps(chapter, ensure_ascii=False) if args.jsonl else summary_line(chapter), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"generate": _cmd_generate, "explain": _cmd_explain, "tokenize": cmd_tokenize, "score": cmd_score,
                "score-text": cmd_score_text, "quantize-compare": quantize_compare.run}[args.command](args)
    except (InputError, NotAvailable) as e:  # (a setting the engine cannot run is a bad argument too)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except TokenLabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`| head -1`): stop as a tool SIGPIPE ends does
        # What is still buffered would fail again at exit; it has nowhere to go.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:  # noqa: BLE001 - an engine fault that ended the run: one line, exit 1
        print(f"error: the engine failed: {e.__class__.__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
              file=sys.stderr)
        return 1
