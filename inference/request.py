"""A run request: what a door received (the page's controls, an API body, the CLI's flags)
turned once into a validated, immutable request that the engine runs.

Every door maps its own field names onto `prepare_run` and runs what it returns; nothing after it
parses a setting, chooses a seed or tokenizes the prompt again. A request it returns can start:
its settings are the schema's, its seed is chosen, its prompt is rendered and tokenized, its given
ids, constraint, vocabulary and context room are checked; whatever fails is one InputError whose
`field` names the setting at fault (each door calls it by its own name for it).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from typing import Mapping

from inference.errors import InputError, check_unicode, shown
from inference.sampling.params import SamplingParams
from inference.sampling.settings import BY_NAME, SETTINGS, defaults

SEED_RANGE = 2**31  # a random seed is below this: short enough to read and type back


def choose_seed(seed: int | None) -> int:
    """The seed a run uses: the one given, else a random one (the one place it is chosen). Either
    way the run knows, and reports, its seed, so that it can be repeated."""
    return secrets.randbelow(SEED_RANGE) if seed is None else seed


class SettingErrors(InputError):
    """Every setting that cannot be used, each (its schema name, its message), not only the first."""

    def __init__(self, errors: list[tuple[str, str]]):
        super().__init__("; ".join(message for _, message in errors), field=errors[0][0] if len(errors) == 1 else None)
        self.errors = errors


def parse_settings(raw: Mapping[str, object], generation_defaults: dict | None = None,
                   seed: int | None = None, stop=()) -> SamplingParams:
    """The sampling settings a door received, by schema name (a name absent or None: the model's
    default from its generation_config.json, else the schema's), parsed against the schema:
    SettingErrors naming every setting that cannot be used. Then the checks across settings
    (SamplingParams' own: the constraint parses, the seed, the stop strings)."""
    unknown = sorted(set(raw) - set(BY_NAME))
    if unknown:
        raise InputError(f"there is no sampling setting {shown(unknown[0])}", field=unknown[0])
    if _asks_beams(raw):  # beams rank by the model's own distribution: its sampling defaults do not apply
        generation_defaults = {k: v for k, v in (generation_defaults or {}).items()
                               if k in BY_NAME and not BY_NAME[k].shapes}
    values, errors = defaults(generation_defaults), []
    for s in SETTINGS:
        if raw.get(s.name) is None:
            continue
        try:
            values[s.name] = s.parse(raw[s.name])
        except InputError as e:
            errors.append((e.field or s.name, str(e)))
    if errors:
        raise SettingErrors(errors)
    return SamplingParams(**values, seed=seed, stop=tuple(stop))


def _asks_beams(raw: Mapping[str, object]) -> bool:
    try:
        return raw.get("num_beams") is not None and BY_NAME["num_beams"].parse(raw["num_beams"]) > 1
    except InputError:
        return False  # reported with the others


@dataclass(frozen=True)
class RunRequest:
    """One run, validated: the ids fed, the settings (its seed chosen) and what it reports."""
    prompt_ids: tuple[int, ...]  # the prompt as fed (a chat rendered by the model's template)
    params: SamplingParams  # params.seed is the seed the run uses
    given: tuple[int, ...] = ()  # generated already after the prompt (a branch's or an edit's)
    top_n: int = 10  # candidates reported per step (0: none, the benchmark's baseline)
    max_new: int = 1  # the tokens it may make: max_new_tokens, lowered to the room the context leaves
    prompt_text: str | None = None  # the text fed (None: the door gave ids)
    # The tokens the run makes, one a step, instead of drawing them (a beam opened as a run): each
    # step still reports the model's distribution and the settings' final one, and where the
    # given token stands in them. Empty: every token is drawn.
    forced: tuple[int, ...] = ()

    @property
    def ids(self) -> list[int]:
        """Every id the model reads before the first new token."""
        return [*self.prompt_ids, *self.given]

    @property
    def seed(self) -> int:
        return self.params.seed

    @property
    def capped(self) -> bool:
        """max_new_tokens was lowered to fit the context window."""
        return self.max_new < self.params.max_new_tokens

    def with_seed(self, seed: int) -> "RunRequest":
        """The same run with another seed (sample k of many is seed s + k)."""
        return replace(self, params=replace(self.params, seed=seed))


def tokens_message(cap: int, asked=None) -> str:
    """A server's cap on max new tokens (a shared page's), as every door says it."""
    return f"The server allows at most {cap} new tokens" + (f"; got {asked}" if asked is not None else "") + "."


def prepare_run(engine, settings: SamplingParams | Mapping[str, object], *, prompt: str | None = None,
                ids=None, chat: bool = False, system: str | None = None, history=(), given=(),
                seed: int | None = None, stop=(), top_n: int = 10, token_cap: int | None = None,
                controls: bool = False, forced=()) -> RunRequest:
    """The one way a run is prepared, whichever door it came by.

    settings: the values by schema name (parsed here, over the model's defaults), or settings a
    door parsed already (the page names every field that cannot be used at once); seed and stop
    go with a mapping (a SamplingParams carries its own). prompt (rendered with the chat template
    when chat, with system and the earlier turns of history) or ids: what the model reads;
    given: ids generated already after it. token_cap: a shared page's most new tokens a visitor
    may ask for. controls: control-token text the user wrote becomes the token (the API's, as
    vLLM's). forced: the tokens the run makes instead of drawing them (RunRequest.forced).
    Raises InputError (one line, `field` the setting at fault)."""
    if engine.down is not None:  # its scheduler died: refused at once, never queued to hang
        raise engine.down
    if isinstance(settings, SamplingParams):
        params = settings
    else:
        params = parse_settings(settings, engine.generation_defaults, seed, stop)
    if token_cap is not None and params.max_new_tokens > token_cap:
        raise InputError(tokens_message(token_cap, params.max_new_tokens))
    params = replace(params, seed=choose_seed(params.seed))
    # (Not describe(): it may measure the decode path by runs of its own, prepared here.)
    context = engine.max_seq_len
    vocab = engine.vocab_size  # None: a server whose config is not known checks the ids itself
    text = None
    if ids is None:
        if not isinstance(prompt, str):
            raise InputError("the prompt must be text")
        check_texts(prompt, system if chat else None, history if chat else None)
        text, ids = engine.prompt(prompt, chat, system, list(history), controls=controls)
    given = list(given)
    check_ids(list(ids) + given, vocab, context)
    from inference.decoding.beams import check_beams
    check_beams(params, given)
    if vocab is not None:
        from inference.sampling.state import check_vocab
        check_vocab(params, vocab, engine.tokenizer)
    forced = list(forced)
    if forced:
        check_forced(params, forced, vocab, token_cap)
    n = len(ids) + len(given)
    max_new = min(len(forced) or params.max_new_tokens, context - n)
    if max_new < 1:
        raise InputError(f"the prompt is {n} tokens and fills the context window of {context}"
                         + (f" ({len(given)} of them given)" if given else ""))
    if forced and max_new < len(forced):
        raise InputError(f"the {len(forced)} tokens to make do not fit: the prompt is {n} tokens of the "
                         f"{context}-token context window")
    top_n = max(0, top_n if vocab is None else min(top_n, vocab))
    request = RunRequest(tuple(ids), params, tuple(given), top_n, max_new, text, tuple(forced))
    engine.check_run(request)
    return request


def check_texts(prompt, system=None, history=None) -> None:
    """A prompt, system prompt and earlier turns that every tokenizer can encode (no lone
    surrogate); InputError naming which."""
    if isinstance(prompt, str):
        check_unicode(prompt, "the prompt")
    if isinstance(system, str):
        check_unicode(system, "the system prompt")
    for i, turn in enumerate(history or ()):
        if isinstance(turn, dict) and isinstance(turn.get("content"), str):
            check_unicode(turn["content"], f"earlier turn {i + 1}")


def prepare_from_text(engine, settings: SamplingParams | Mapping[str, object], ids, at: int, *,
                      candidate: int | None = None, **run) -> RunRequest:
    """A run from a point of a scored text (Engine.score_ids over `ids`, the text as fed, a BOS
    where the model adds one): the tokens before ids[at] are its prompt, and it makes what comes
    next; with `candidate`, that token is put in ids[at]'s place and the run continues after it
    (as a branch's given id: the stages count it as generated). `at` may be len(ids): the run
    continues after the whole text. The rest (seed, stop, top_n, token_cap...) as prepare_run's."""
    if isinstance(at, bool) or not isinstance(at, int) or not isinstance(ids, (list, tuple)):
        raise InputError("the point of the text must be a token's place in it", field="at")
    if not 1 <= at <= len(ids):
        raise InputError("the first token has nothing before it: start from a later token" if at == 0 else
                         f"the text has {len(ids)} tokens: start from one of tokens 1..{len(ids)}", field="at")
    given = () if candidate is None else (candidate,)
    return prepare_run(engine, settings, ids=list(ids[:at]), given=given, **run)


def check_forced(params: SamplingParams, forced: list[int], vocab_size: int | None, token_cap: int | None) -> None:
    """Tokens a run makes instead of drawing them: ids of the vocabulary, within a shared page's
    cap, one sequence (no beams), each step's distribution a draw could come from (greedy's is
    its argmax alone) and no constraint (the tokens are given, not allowed)."""
    if vocab_size is not None and not all(isinstance(t, int) and 0 <= t < vocab_size for t in forced):
        raise InputError(f"the tokens to make must be ids below the vocabulary's {vocab_size}")
    if token_cap is not None and len(forced) > token_cap:
        raise InputError(tokens_message(token_cap, len(forced)))
    if params.num_beams > 1:
        raise InputError("a run of given tokens is one sequence: set Beams to 1", field="num_beams")
    if params.greedy:
        raise InputError("a run of given tokens reports the distribution each was drawn from; greedy's is "
                         "its argmax alone: set a temperature above 0", field="temperature")
    if params.constraint:
        raise InputError("a run of given tokens cannot be constrained: turn the constraint off",
                         field="constraint")


def check_ids(ids, vocab_size: int | None, max_seq_len: int) -> None:
    """Token ids a caller gives (an API's prompt, a branch's given ids): a non-empty list of ids
    of the vocabulary (None: not known here) that fits the context window; InputError otherwise."""
    if not isinstance(ids, (list, tuple)) or not ids:
        raise InputError("the prompt is empty")
    end = vocab_size if vocab_size is not None else 2**62
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < end][:1]
    if bad:
        raise InputError(f"token ids must be integers in [0, {vocab_size if vocab_size is not None else '∞'}), "
                         f"got {shown(bad[0])}")
    if len(ids) > max_seq_len:
        raise InputError(f"the prompt is {len(ids)} tokens but the context window is {max_seq_len}")
