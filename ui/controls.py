"""The page's inputs: their values as one object, their checks, and the share link's codec.

The sampling controls come from inference.sampling.settings.SETTINGS: their names are the URL's query
keys and /generate's parameter names, their ranges the checks.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from urllib.parse import urlencode

from inference.errors import InputError, TokenLabError, shown
from inference.sampling.constrain import check
from inference.sampling.params import MAX_STOP_LENGTH, MAX_STOP_STRINGS, SamplingParams
from inference.sampling.settings import BY_NAME, DEFAULT, SETTINGS, SHAPING_SETTINGS, defaults, schema_fields

MODES = ("completion", "chat")
DEFAULT_PROMPT = "The capital of France is"
# A model with a chat template starts in chat mode with this (an instruction given as a completion
# prompt gets a rambling continuation); choosing a mode swaps one example for the other.
CHAT_PROMPT = "Write a haiku about the sea."
EXAMPLE_PROMPTS = {"completion": DEFAULT_PROMPT, "chat": CHAT_PROMPT}


@dataclass
class Controls:
    """The page's inputs, in the order the layout passes them (also the URL query keys and
    /generate's parameters): prompt, mode, system, model (empty: the page's default), every
    sampling setting (the schema's, in its order: `schema_fields` checks them when the module
    loads), seed (text: empty = random), stop strings (one per line) and the token ids a branch
    continues after (ID,ID,...; empty: none)."""
    prompt: str = DEFAULT_PROMPT
    mode: str = "completion"
    system: str = ""
    model: str = ""
    temperature: float = DEFAULT['temperature']
    top_k: int = DEFAULT['top_k']
    top_p: float = DEFAULT['top_p']
    min_p: float = DEFAULT['min_p']
    repetition_penalty: float = DEFAULT['repetition_penalty']
    presence_penalty: float = DEFAULT['presence_penalty']
    frequency_penalty: float = DEFAULT['frequency_penalty']
    logit_bias: str = DEFAULT['logit_bias']
    typical_p: float = DEFAULT['typical_p']
    epsilon_cutoff: float = DEFAULT['epsilon_cutoff']
    eta_cutoff: float = DEFAULT['eta_cutoff']
    top_n_sigma: float = DEFAULT['top_n_sigma']
    dynatemp_range: float = DEFAULT['dynatemp_range']
    dynatemp_exponent: float = DEFAULT['dynatemp_exponent']
    xtc_probability: float = DEFAULT['xtc_probability']
    xtc_threshold: float = DEFAULT['xtc_threshold']
    dry_multiplier: float = DEFAULT['dry_multiplier']
    dry_base: float = DEFAULT['dry_base']
    dry_allowed_length: int = DEFAULT['dry_allowed_length']
    dry_penalty_last_n: int = DEFAULT['dry_penalty_last_n']
    dry_sequence_breakers: str = DEFAULT['dry_sequence_breakers']
    mirostat_tau: float = DEFAULT['mirostat_tau']
    mirostat_eta: float = DEFAULT['mirostat_eta']
    sampler_order: str = DEFAULT['sampler_order']
    constraint: str = DEFAULT['constraint']
    constraint_text: str = DEFAULT['constraint_text']
    max_new_tokens: int = DEFAULT['max_new_tokens']
    num_beams: int = DEFAULT['num_beams']
    length_penalty: float = DEFAULT['length_penalty']
    seed: str = ""
    stop: str = ""
    prefix_ids: str = ""

    def values(self) -> list:
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def for_model(cls, generation_defaults: dict | None) -> "Controls":
        """The page's defaults, with the model's generation_config.json where it has one."""
        return cls(**defaults(generation_defaults))


schema_fields(Controls, before=("prompt", "mode", "system", "model"), after=("seed", "stop", "prefix_ids"))
NAMES = Controls.names()
# The controls in "More settings" (closed unless a link or the saved work sets one of them).
MORE_SETTINGS = (*(s.name for s in SETTINGS if s.group == "more"), "stop")


def signature(*extra: str) -> inspect.Signature:
    """A signature naming each control (and `extra` names after them), then gradio's request:
    gradio takes /generate's parameter names from it."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(n, kind) for n in (*NAMES, *extra)]
    import gradio as gr
    params.append(inspect.Parameter("request", inspect.Parameter.KEYWORD_ONLY, default=None,
                                    annotation=gr.Request))
    return inspect.Signature(params)


SEED_CHARS = 40  # 2^63 has 19 digits: longer text is refused before it is converted


def parse_seed(text) -> int | None:
    text = "" if text is None else str(text)
    try:
        if len(text) > SEED_CHARS:  # refused before int() reads it
            raise ValueError
        if not text.strip():
            return None
        value = int(text.strip())
    except ValueError:
        raise InputError(f"seed must be a whole number or empty (random), got {shown(text)}", field="seed") from None
    if not 0 <= value < 2**63:
        raise InputError(f"seed must be between 0 and 2^63 - 1, got {value}", field="seed")
    return value


# The stop strings' box holds at most MAX_STOP_STRINGS lines of MAX_STOP_LENGTH characters,
# each written with escapes (two characters for one) and a newline; longer text is refused
# by its length before it is split.
MAX_STOP_TEXT = MAX_STOP_STRINGS * (2 * MAX_STOP_LENGTH + 1)


def parse_whole(value, what: str) -> int:
    """A box's whole number (4, 4.0, "4"); InputError naming `what` for anything else."""
    try:
        n = float(value)
        if n.is_integer():
            return int(n)
    except (TypeError, ValueError, OverflowError):
        pass
    raise InputError(f"{what} must be a whole number, got {shown(value)}")


def parse_count(value, what: str, most: int, cap: int | None, over_cap) -> int:
    """A box's whole number from 1 to `most`, within a shared page's `cap` (over_cap(cap, n): its
    one-line refusal); InputError naming `what` for anything else (True is not 1)."""
    try:
        n = float(value)
        ok = n.is_integer() and 1 <= n <= most
    except (TypeError, ValueError, OverflowError):
        ok = False
    if isinstance(value, bool) or not ok:
        raise InputError(f"{what} must be a whole number from 1 to {most}, got {shown(value)}")
    if cap is not None and n > cap:
        raise InputError(over_cap(cap, int(n)))
    return int(n)


def parse_stop(text: str | None) -> tuple[str, ...]:
    """One stop string per line; \\n and \\t written literally stand for newline and tab."""
    if not text:
        return ()
    if not isinstance(text, str):
        raise InputError("stop strings must be text", field="stop")
    if len(text) > MAX_STOP_TEXT:
        raise InputError(f"stop strings are {len(text):,} characters but at most {MAX_STOP_STRINGS} "
                         f"of at most {MAX_STOP_LENGTH} characters are allowed", field="stop")
    return tuple(line.replace("\\n", "\n").replace("\\t", "\t") for line in text.split("\n") if line)


# What the page calls each control a message can name: a setting's label is its schema entry's;
# the seed and the stop strings are not sampling settings.
LABELS = {**{s.name: s.label for s in SETTINGS}, "seed": "Seed", "stop": "Stop strings"}


def labelled(name: str, message: str) -> str:
    """A control's message with the control called as the page labels it: a message starts with
    its name (top_k, seed) or with what it is (stop strings); else the label goes before it."""
    label = LABELS[name]
    for written in (label.lower(), name):
        rest = message[len(written):]
        if message.lower().startswith(written) and not (rest[:1].isalnum() or rest[:1] == "_"):
            return label + rest
    return f"{label}: {message}"


class FieldErrors(InputError):
    """Every control that cannot be used, each (its name, its message). As text, one line with
    the names /generate's parameters have; `on_page` names them by their labels, one a line."""

    def __init__(self, errors: list[tuple[str, str]]):
        super().__init__("; ".join(message for _, message in errors))
        self.errors = errors

    def on_page(self, one_line: bool = False) -> str:
        """Each control by its label: one a line (a list after a count), or (one_line) all on one."""
        lines = [labelled(name, message) for name, message in self.errors]
        if len(lines) == 1 or one_line:
            return "; ".join(lines)
        return f"{len(lines)} fields cannot be used:\n" + "\n".join(f"- {line}" for line in lines)


def page_message(e: TokenLabError, one_line: bool = False) -> str:
    """An error as the page says it: a control by its label."""
    if isinstance(e, FieldErrors):
        return e.on_page(one_line)
    field, text = getattr(e, "field", None), unquoted(e)
    return labelled(field, text) if field in LABELS else text


def unquoted(e: Exception) -> str:
    """The error's message as the page says it: without any of a constraint's text quoted back
    (inference.sampling.constrain.ConstraintError; the text is in its box, the message says where)."""
    return getattr(e, "unquoted", None) or str(e)


def sampling_params(c: Controls, seed: int | None, **override) -> SamplingParams:
    """Validated settings (and the seed's text checked); raises FieldErrors naming every control
    that cannot be used, not only the first."""
    errors = []

    def checked(name: str, parse, raw):
        try:
            return parse(raw)
        except InputError as e:
            errors.append((e.field if e.field in LABELS else name, unquoted(e)))

    values = {s.name: checked(s.name, s.parse, override.get(s.name, getattr(c, s.name))) for s in SETTINGS}
    checked("seed", parse_seed, c.seed)
    stop = checked("stop", parse_stop, c.stop)
    if errors and values["constraint"] and values["constraint_text"] is not None:
        # SamplingParams checks the constraint; here it is named with the others, not after them.
        checked("constraint_text", lambda text: check(values["constraint"], text), values["constraint_text"])
    if errors:
        raise FieldErrors(errors)
    return SamplingParams(**values, seed=seed, stop=stop)


def shaping_values(**given) -> list:
    """A value for each of settings.SHAPING_SETTINGS, in order (replay's and compare's B
    controls): `given` by name, the rest at their defaults."""
    return [given.get(n, BY_NAME[n].default) for n in SHAPING_SETTINGS]


def controls_from_query(query: dict, base: Controls | None = None,
                        maxima: dict[str, float] | None = None) -> tuple[Controls, list[str]]:
    """Controls from a link's query; each unusable or unknown parameter is left at its default
    and named, as it appears in the link, in the returned problems. `maxima` tightens a
    setting's range to what the page's control can hold (max_new_tokens: the context)."""
    c, problems = base or Controls(), []
    for name in NAMES:
        if name not in query:
            continue
        raw = query[name]
        try:
            if name in BY_NAME:
                value = BY_NAME[name].parse(raw)
                if maxima and name in maxima and value > maxima[name]:
                    raise InputError(f"{name} must be at most {maxima[name]:g} here, got {raw!r}")
            elif name == "mode":
                if raw not in MODES:
                    raise InputError(f"mode must be one of {', '.join(MODES)}")
                value = raw
            else:
                value = str(raw)
                if name == "seed":
                    parse_seed(value)
        except TokenLabError as e:
            problems.append(f"Ignored link parameter `{name}` = {shown(raw)}: {e}")
            continue
        setattr(c, name, value)
    for key in query:
        if key not in NAMES and key not in LINK_EXTRAS and not key.startswith("__"):
            problems.append(f"Ignored unknown link parameter {shown(key)}")
    return c, problems


def query_value(v) -> str:
    """A value as the link writes it, the way JavaScript's String() does (1 for 1.0, 0.3 for
    0.3): the page's copy button builds the same link in the browser (layout.SHARE_JS)."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e21 else repr(v)
    return str(v)


# Written into every link: a link without a mode is a completion link (links from before chat
# became a default named only chat).
ALWAYS_IN_LINK = ("prompt", "mode", "seed")
# A link's parameters that are not controls: a section restores them itself (ui/loom: its tree).
LINK_EXTRAS = ("loom",)


def share_url(base: str, c: Controls, default: Controls | None = None, seed=None) -> str:
    """A link with every setting that differs from the defaults, plus the prompt and seed;
    `seed` (the seed a run used) stands in for an empty seed box. A constraint's text is left
    out while the constraint is off (ui/share.share_js writes the same link in the browser)."""
    default = default or Controls()
    values = dict(zip(NAMES, c.values()))
    if str(values["seed"]).strip() == "" and seed is not None:
        values["seed"] = str(seed)
    if not values["constraint"]:  # a constraint's text left in its box while it is off: not the link's
        values["constraint_text"] = default.constraint_text
    query = {n: query_value(v) for n, v in values.items() if v != getattr(default, n) or n in ALWAYS_IN_LINK}
    return f"{base.split('?')[0]}?{urlencode(query)}"
