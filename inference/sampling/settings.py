"""The sampling settings, defined once: name, default, range, label, help and where each goes.

SamplingParams' fields, defaults and checks, the CLI's flags, the page's controls and where they
sit, the share link's query parameters, the keys read from a model's generation_config.json, the
replay and compare controls, and the key a model server's request carries are all derived from
SETTINGS, so a new knob is one entry here plus its stage function in stages.py and its test.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from inference.errors import InputError, check_unicode, shown

# The stages compute in float32: a value other than 0 nearer to 0 than its smallest normal number is
# 0 there, or a subnormal that overflows what it divides (top_p 1e-300 kept nothing, temperature
# 1e-39 made every logit infinite); such a value is refused with the range, as any other out of it.
FLOAT32_TINY = 1.1754943508222875e-38  # float32's smallest normal number
FLOAT32_MAX = 3.4028234663852886e38  # float32's largest finite number


@dataclass(frozen=True)
class Setting:
    name: str  # SamplingParams field, query parameter, generation_config.json key
    kind: type  # float, int, or str (a list written as text: decode reads it)
    default: float | int
    minimum: float | int
    maximum: float | int | None  # None: no upper bound
    label: str
    help: str
    step: float = 0.01  # the page's slider step
    min_open: bool = False  # the minimum itself is not allowed (top_p > 0, penalty > 0)
    group: str = "main"  # where the page shows its control: "main", or "more" (folded away)
    # The value at which its stage leaves the distribution as it is; None: not a sampling stage.
    neutral: float | int | None = None
    # What a model server's (vLLM's OpenAI) request calls it; None: no server takes it.
    server_key: str | None = None
    keeps_order: bool = True  # its stage never reorders the tokens it keeps
    control: str = "slider"  # the page's control: "slider", "number" (no natural upper end) or "text"
    # A parameter of another setting's stage (named here): it has no stage of its own.
    part_of: str | None = None
    shapes: bool = True  # it changes the distribution sampled from (replay and compare offer it)
    # str settings: text -> the value the stage reads (raises InputError), and an example.
    decode: Callable | None = None
    example: str = ""
    server_form: Callable | None = None  # the value as the server's request carries it (None: as is)
    stage_label: str = ""  # its stage's name where the label names a parameter (DRY, not "DRY multiplier")
    choices: tuple = ()  # control "choice": (value, what the page calls it), the first the neutral one
    max_chars: int = 2000  # text settings: the most characters taken
    strip: bool = True  # text settings: surrounding white space dropped (a regular expression keeps it)
    sent_by_stage: bool = False  # a server gets it inside its stage's server_form (not on its own)
    off_means: str = ""  # number boxes: what its off value does, in the label (empty: off, or default)

    @property
    def is_stage(self) -> bool:
        return self.neutral is not None and self.part_of is None

    @property
    def stage_name(self) -> str | None:
        """The stage this setting shapes: its own, or the one it is a parameter of."""
        return self.part_of or (self.name if self.is_stage else None)

    @property
    def off_label(self) -> str:
        """The number box's label: what its off value does said after it, as the help says it."""
        return f"{self.label} ({self.off:g} = {self.off_means or ('off' if self.neutral is not None else 'default')})"

    @property
    def off(self):
        """The value at which this setting asks for nothing: neutral where it has one, else its default."""
        return self.neutral if self.neutral is not None else self.default

    def default_text(self) -> str:
        return repr(self.default) if self.kind is str else f"{self.default:g}"

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def range_text(self) -> str:
        if self.kind is str:
            return f"text, e.g. {self.example}"
        lo = "(" if self.min_open else "["
        hi = f"{self.maximum:g}]" if self.maximum is not None else "∞)"
        return f"{lo}{self.minimum:g}, {hi}"

    def parse(self, raw) -> float | int:
        """The value as this setting's type, checked against its range; InputError names the
        setting. Whole numbers written as 3.0 are accepted for integers, 2.5 is not. Text
        settings are checked by decoding them, and kept as written (stripped)."""
        try:
            return self._parse(raw)
        except InputError as e:
            raise InputError(str(e), field=e.field or self.name) from None

    def _parse(self, raw) -> float | int:
        if self.kind is str:
            if not isinstance(raw, str) or len(raw) > self.max_chars:
                raise InputError(f"{self.name} must be text of at most {self.max_chars:,} characters, e.g. {self.example}")
            value = raw.strip() if self.strip else raw
            check_unicode(value, self.name)
            self.decode(value)
            return value
        if isinstance(raw, bool):
            raise InputError(f"{self.name} must be a number, got {shown(raw)}")
        try:
            value = float(raw)
        except (TypeError, ValueError, OverflowError):  # (an integer past float's range)
            raise InputError(f"{self.name} must be a number, got {shown(raw)}") from None
        if not math.isfinite(value):
            raise InputError(f"{self.name} must be a finite number, got {shown(raw)}")
        if self.kind is int:
            if value != int(value):
                raise InputError(f"{self.name} must be a whole number, got {shown(raw)}")
            value = int(value)
        too_low = value <= self.minimum if self.min_open else value < self.minimum
        if too_low or (self.maximum is not None and value > self.maximum):
            raise InputError(f"{self.name} must be in {self.range_text()} ({self.help}), got {shown(raw)}")
        if self.kind is float and value != 0 and abs(value) < FLOAT32_TINY:
            zero = self.minimum < 0 or (self.minimum == 0 and not self.min_open)  # 0 is in its range
            raise InputError(f"{self.name} must be in {self.range_text()} ({self.help}) and {'0 or ' if zero else ''}"
                             f"at least {FLOAT32_TINY:.2g} in size (float32's smallest normal number; the stages "
                             f"compute in float32), got {shown(raw)}")
        return value


def _items(text: str) -> list[str]:
    return [t for t in re.split(r"[\s,]+", text) if t]


_BIAS_ITEM = re.compile(r'(?:"((?:[^"\\]|\\.)*)"|([^\s,:"]+))\s*:\s*([^\s,]*)')
_SEPARATORS = re.compile(r"[\s,]*")
_BIAS_HINT = 'logit_bias entries are ID:BIAS or "text":BIAS (e.g. 15043:-100, " Paris":2)'


@lru_cache(maxsize=256)
def parse_logit_bias(text: str) -> tuple[tuple[int | str, float], ...]:
    """'ID:BIAS "text":BIAS ...' (commas or spaces between) -> ((id or text, bias), ...): the
    syntax alone, no tokenizer needed. A text is a JSON string ("\\n", "\\"" inside)."""
    out, at = [], 0
    while True:
        at = _SEPARATORS.match(text, at).end()
        if at == len(text):
            return tuple(out)
        m = _BIAS_ITEM.match(text, at)
        if m is None:
            bad = text[at:].split()[0]
            raise InputError(f"{_BIAS_HINT}, got {shown(bad)}")
        piece, tid, bias = m.groups()
        try:
            value = float(bias)
            key = json.loads(f'"{piece}"') if piece is not None else int(tid)
        except ValueError:
            raise InputError(f"{_BIAS_HINT}, got {shown(m.group(0))}") from None
        if isinstance(key, str):
            check_unicode(key, "a logit_bias text")
        if not abs(value) <= FLOAT32_MAX or key == "" or (isinstance(key, int) and key < 0):
            raise InputError(f"{_BIAS_HINT}, with a token id >= 0, a non-empty text and a bias finite in "
                             f"float32 (at most {FLOAT32_MAX:.3g} in size), got {shown(m.group(0))}")
        out.append((key, value))
        at = m.end()


@lru_cache(maxsize=256)
def decode_logit_bias(text: str, tokenizer=None) -> tuple[tuple[int, float], ...]:
    """'ID:BIAS "text":BIAS' -> ((id, bias), ...): a text biases each token the tokenizer
    encodes it to as text that continues the output (no BOS, no sentencepiece dummy-prefix
    space: " Paris" is the token "▁Paris"). A later entry for the same id replaces an earlier one. A bias
    of -100 or less bans the token. Text needs the model's tokenizer (an InputError without one)."""
    out: dict[int, float] = {}
    for key, value in parse_logit_bias(text.strip()):
        if isinstance(key, str):
            if tokenizer is None:
                raise InputError(f"logit_bias text {shown(key)} needs the model's tokenizer; write token ids (ID:BIAS)")
            ids = tokenizer.encode_continuation(key)
            if not ids:
                raise InputError(f"logit_bias text {shown(key)} encodes to no token")
            out.update((i, value) for i in ids)
        else:
            out[key] = value
    return tuple(out.items())


@lru_cache(maxsize=256)
def decode_order(text: str) -> tuple[str, ...]:
    """'a,b,c' -> the stage names listed, each a sampling stage's setting name, once."""
    names = tuple(_items(text))
    for n in names:
        if n not in FILTER_SETTINGS:
            raise InputError(f"sampler_order names stages by their setting's name ({', '.join(DEFAULT_ORDER)}), got {shown(n)}")
    if len(set(names)) != len(names):
        raise InputError(f"sampler_order lists a stage twice: {shown(text)}")
    return names


@lru_cache(maxsize=256)
def decode_breakers(text: str) -> tuple[str, ...]:
    """DRY's sequence breakers as text-generation-webui writes them: JSON strings separated by
    commas, e.g. "\\n", ":", "*"."""
    try:
        items = json.loads(f"[{text}]")
    except json.JSONDecodeError:
        raise InputError('dry_sequence_breakers are JSON strings separated by commas, e.g. "\\n", ":", "*"') from None
    if not all(isinstance(b, str) and b for b in items):
        raise InputError("dry_sequence_breakers must be non-empty strings")
    for b in items:
        check_unicode(b, "a DRY sequence breaker")
    return tuple(items)


# The kinds of constraint on the output (the constraint setting's values): value -> (what the
# page and the messages call it, the CLI flag's argument, vLLM's structured_outputs key).
CONSTRAINT_KINDS = {"json_schema": ("JSON schema", "PATH", "json"),
                    "regex": ("regular expression", "PATTERN", "regex"),
                    "grammar": ("grammar (EBNF)", "PATH", "grammar")}
MAX_CONSTRAINT_CHARS = 16_000  # characters of a schema, regular expression or grammar


def decode_constraint_kind(text: str) -> str:
    if text and text not in CONSTRAINT_KINDS:
        raise InputError(f"constraint must be empty or one of {', '.join(CONSTRAINT_KINDS)}, got {shown(text)}")
    return text


def _server_constraint(kind: str, tokenizer=None, values=None) -> dict:
    """vLLM's structured_outputs: {"json": schema} (the schema as an object), {"regex": ...}
    or {"grammar": ...}."""
    text = values["constraint_text"]
    return {CONSTRAINT_KINDS[kind][2]: json.loads(text) if kind == "json_schema" else text}


def _server_bias(text: str, tokenizer=None, values=None) -> dict[str, float]:
    """OpenAI's logit_bias: {"id": bias}, the bias within [-100, 100] (vLLM clamps to it)."""
    return {str(i): max(-100.0, min(100.0, b)) for i, b in decode_logit_bias(text, tokenizer)}


SETTINGS: tuple[Setting, ...] = (
    Setting("temperature", float, 1.0, 0.0, 2.0, "Temperature", "0 = greedy, 1 = the model's own "
            "distribution", step=0.05, neutral=1.0, server_key="temperature"),
    Setting("top_k", int, 0, 0, None, "Top-k", "keep the k most likely tokens; 0 = off", step=1,
            neutral=0, server_key="top_k", control="number"),
    Setting("top_p", float, 1.0, 0.0, 1.0, "Top-p", "keep the smallest set whose probability "
            "reaches p; 1 = off", min_open=True, neutral=1.0, server_key="top_p"),
    Setting("min_p", float, 0.0, 0.0, 1.0, "Min-p", "keep tokens at least min_p times as likely "
            "as the top one; 0 = off", group="more", neutral=0.0, server_key="min_p"),
    Setting("repetition_penalty", float, 1.0, 0.0, 2.0, "Repetition penalty", "divide the "
            "logits of tokens already seen; 1 = off", step=0.05, min_open=True, group="more",
            neutral=1.0, server_key="repetition_penalty", keeps_order=False),
    Setting("presence_penalty", float, 0.0, -2.0, 2.0, "Presence penalty", "subtract from the "
            "logit of every token generated so far; 0 = off", step=0.05, group="more", neutral=0.0,
            server_key="presence_penalty", keeps_order=False),
    Setting("frequency_penalty", float, 0.0, -2.0, 2.0, "Frequency penalty", "subtract this "
            "times the number of times a token was generated; 0 = off", step=0.05, group="more",
            neutral=0.0, server_key="frequency_penalty", keeps_order=False),
    Setting("logit_bias", str, "", 0, None, "Logit bias", "ID:BIAS or \"text\":BIAS added to "
            "the logit of the token (or each token of the text); -100 or less bans it; empty = off", group="more", neutral="", server_key="logit_bias",
            keeps_order=False, control="text", decode=parse_logit_bias, example="42:-100, 7:2.5",
            server_form=_server_bias),
    Setting("typical_p", float, 1.0, 0.0, 1.0, "Typical-p", "keep the tokens whose surprise is "
            "closest to the entropy, up to mass p; 1 = off", min_open=True, group="more", neutral=1.0),
    Setting("epsilon_cutoff", float, 0.0, 0.0, 1.0, "Epsilon cutoff", "drop tokens of probability "
            "below epsilon; 0 = off", step=0.0001, group="more", neutral=0.0),
    Setting("eta_cutoff", float, 0.0, 0.0, 1.0, "Eta cutoff", "drop tokens below min(eta, "
            "sqrt(eta) e^-entropy); 0 = off", step=0.0001, group="more", neutral=0.0),
    Setting("top_n_sigma", float, 0.0, 0.0, 10.0, "Top-nσ", "keep logits within n standard "
            "deviations of the top one; 0 = off", step=0.05, group="more", neutral=0.0),
    Setting("dynatemp_range", float, 0.0, 0.0, 2.0, "Dynamic temperature range", "temperature "
            "± range, scaled by the normalized entropy; 0 = off", step=0.05, group="more",
            neutral=0.0, part_of="temperature"),
    Setting("dynatemp_exponent", float, 1.0, 0.0, 5.0, "Dynamic temperature exponent",
            "the normalized entropy is raised to it", step=0.05, group="more", part_of="temperature"),
    Setting("xtc_probability", float, 0.0, 0.0, 1.0, "XTC probability", "chance per step that "
            "XTC removes every top token above the threshold but the least likely; 0 = off",
            group="more", neutral=0.0, stage_label="XTC"),
    Setting("xtc_threshold", float, 0.1, 0.0, 1.0, "XTC threshold", "tokens at least this likely "
            "are top tokens (above 0.5: XTC never acts)", group="more", part_of="xtc_probability"),
    Setting("dry_multiplier", float, 0.0, 0.0, 5.0, "DRY multiplier", "penalize tokens that "
            "extend a repeat of the context; 0 = off", step=0.05, group="more", neutral=0.0,
            keeps_order=False, stage_label="DRY"),
    Setting("dry_base", float, 1.75, 1.0, 4.0, "DRY base", "the penalty grows as base^(repeat "
            "length - allowed length)", step=0.05, min_open=True, group="more", part_of="dry_multiplier"),
    Setting("dry_allowed_length", int, 2, 1, 50, "DRY allowed length", "repeats this long are "
            "not penalized", step=1, group="more", part_of="dry_multiplier"),
    Setting("dry_penalty_last_n", int, 0, 0, None, "DRY range", "tokens of the context searched "
            "for repeats; 0 = all", step=1, group="more", part_of="dry_multiplier", control="number",
            off_means="all"),
    Setting("dry_sequence_breakers", str, '"\\n", ":", "\\"", "*"', 0, None, "DRY sequence breakers",
            "JSON strings; a repeat does not continue across one", group="more",
            part_of="dry_multiplier", control="text", decode=decode_breakers, example='"\\n", ":"'),
    Setting("mirostat_tau", float, 0.0, 0.0, 20.0, "Mirostat τ", "Mirostat v2's target surprise "
            "in bits; 0 = off", step=0.1, group="more", neutral=0.0, stage_label="Mirostat v2"),
    Setting("mirostat_eta", float, 0.1, 0.0, 1.0, "Mirostat η", "how fast μ follows the surprise",
            group="more", part_of="mirostat_tau"),
    Setting("sampler_order", str, "", 0, None, "Sampler order", "setting names of the stages to "
            "run first, in this order; the rest follow in the default order", group="more",
            control="text", decode=decode_order, example="top_k,temperature"),
    Setting("constraint", str, "", 0, None, "Constrain output", "only text this JSON schema, regular "
            "expression or grammar allows is sampled; empty = off", group="constrain", neutral="",
            control="choice", decode=decode_constraint_kind, example="json_schema",
            choices=(("", "none"), *((k, v[0]) for k, v in CONSTRAINT_KINDS.items())),
            server_key="structured_outputs", server_form=_server_constraint, stage_label="constraint"),
    Setting("constraint_text", str, "", 0, None, "Constraint", "the JSON schema, regular expression "
            "or grammar (xgrammar's EBNF: root ::= ...)", group="constrain", part_of="constraint",
            control="text", decode=str, example='{"type": "object"}', max_chars=MAX_CONSTRAINT_CHARS,
            strip=False, sent_by_stage=True),
    Setting("max_new_tokens", int, 128, 1, None, "Max new tokens", "at most this many tokens "
            "are generated", step=1, server_key="max_tokens", shapes=False),
    # Decoding methods other than one sample a step (inference/decoding/): not stages, they
    # choose among the model's own distributions.
    Setting("num_beams", int, 1, 1, 8, "Beams", "beam search with this many beams, ranked by the "
            "model's own log-probabilities; 1 = off (sampling)", step=1, group="decoding", shapes=False),
    Setting("length_penalty", float, 1.0, -5.0, 5.0, "Length penalty", "a finished beam's score is its "
            "log-probability / length^penalty (transformers'); above 0 favours longer beams", step=0.1,
            group="decoding", shapes=False),
)
BY_NAME = {s.name: s for s in SETTINGS}
DEFAULT = {s.name: s.default for s in SETTINGS}


def schema_fields(cls, before: tuple[str, ...] = (), after: tuple[str, ...] = ()) -> None:
    """A dataclass that spells every setting out as a field of its own (SamplingParams, the page's
    Controls), checked when its module loads: its fields are `before`, then every setting in the
    schema's order with the schema's type and default, then `after`; a setting added to the schema
    and not to the class (or the reverse) fails at import, naming it."""
    import dataclasses
    got = [f.name for f in dataclasses.fields(cls)]
    want = [*before, *(s.name for s in SETTINGS), *after]
    if got != want:
        missing, extra = [n for n in want if n not in got], [n for n in got if n not in want]
        raise TypeError(f"{cls.__name__}'s fields are not the schema's: missing {missing}, not in the schema "
                        f"{extra}" + ("" if missing or extra else ", or not in the schema's order"))
    for f in dataclasses.fields(cls):
        s = BY_NAME.get(f.name)
        if s is not None and (f.default != s.default or f.type not in (s.kind, s.kind.__name__)):
            raise TypeError(f"{cls.__name__}.{f.name} is {f.type} = {f.default!r}; the schema says "
                            f"{s.kind.__name__} = {s.default!r}")
# The settings that are a stage of the pipeline (each a stage of stages.final_logits), in the
# page's order; max_new_tokens, the stages' parameters and the order are not.
FILTER_SETTINGS = tuple(s.name for s in SETTINGS if s.is_stage)
# The order the stages run in unless sampler_order says otherwise: written down here only.
# The constraint first, as vLLM (its grammar bitmask on the logits before the sampler) and
# llama.cpp (the grammar before the other samplers) apply it: the cutoffs then choose among the
# tokens it allows, and never leave none of them (after top-k 40 under a JSON schema, often none was).
DEFAULT_ORDER = ("constraint", "logit_bias", "repetition_penalty", "presence_penalty", "frequency_penalty",
                 "dry_multiplier", "temperature", "top_k", "top_p", "min_p", "typical_p",
                 "epsilon_cutoff", "eta_cutoff", "top_n_sigma", "xtc_probability", "mirostat_tau")
assert sorted(DEFAULT_ORDER) == sorted(FILTER_SETTINGS)
# Every setting that shapes the distribution sampled from: what replay and compare can change.
SHAPING_SETTINGS = tuple(s.name for s in SETTINGS if s.shapes)


def order(sampler_order: str) -> tuple[str, ...]:
    """The stages in the order they run: those listed in sampler_order, then the rest in DEFAULT_ORDER."""
    first = decode_order(sampler_order.strip())
    return first + tuple(n for n in DEFAULT_ORDER if n not in first)


def how_made(params, prefix_ids=()) -> dict:
    """What a run's summary line records of its settings: each one not at its default (and
    prefix_ids: the given ids the run continued after), and the order its stages ran in."""
    settings = {s.name: getattr(params, s.name) for s in SETTINGS if getattr(params, s.name) != s.default}
    if prefix_ids:
        settings["prefix_ids"] = list(prefix_ids)
    return {"settings": settings, "sampler_order": list(order(params.sampler_order))}


def defaults(generation_defaults: dict | None = None) -> dict:
    """Each setting's default, overridden by a model's generation_config.json values."""
    out = {s.name: s.default for s in SETTINGS}
    for name, value in (generation_defaults or {}).items():
        if name in out:
            out[name] = BY_NAME[name].kind(value)
    return out


def from_generation_config(data: dict) -> dict:
    """The settings a generation_config.json sets (do_sample false means greedy); values out of
    range are left out, so a model's odd default cannot make every run fail."""
    out = {}
    for s in SETTINGS:
        try:
            if isinstance(data.get(s.name), (int, float)):
                out[s.name] = s.parse(data[s.name])
        except InputError:
            continue
    if data.get("do_sample") is False:
        out["temperature"] = 0.0
    return out
