"""SamplingParams: one run's settings. Its fields, defaults and checks come from settings.SETTINGS;
the seed and the stop strings are the two fields that are not sampling settings of the schema."""

from __future__ import annotations

from dataclasses import field, make_dataclass

from inference.errors import InputError, shown
from inference.sampling.settings import SETTINGS

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256


def validate(p) -> None:
    """Raise InputError with a one-line message for any setting that cannot be used."""
    for s in SETTINGS:
        value = getattr(p, s.name)
        if s.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise InputError(f"{s.name} must be an integer, got {shown(value)}", field=s.name)
        s.parse(value)
    if p.constraint:  # the schema, expression or grammar parses (compiled when a run starts)
        from inference.sampling.constrain import check
        try:
            check(p.constraint, p.constraint_text)
        except InputError as e:
            raise InputError(str(e), field=e.field or "constraint_text") from None
    if p.dynatemp_range > 0 and _greedy(p):  # greedy keeps one token: no range to scale
        raise InputError(f"dynatemp_range needs temperature above 0: temperature 0 is greedy (one token "
                         f"kept), which a dynamic temperature cannot change (got a range of {p.dynatemp_range:g})",
                         field="dynatemp_range")
    if p.seed is not None and (isinstance(p.seed, bool) or not isinstance(p.seed, int)
                               or not 0 <= p.seed < 2**63):
        raise InputError(f"seed must be an integer in [0, 2^63), got {shown(p.seed)}", field="seed")
    if len(p.stop) > MAX_STOP_STRINGS:
        raise InputError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(p.stop)}", field="stop")
    for s in p.stop:
        if not isinstance(s, str) or not s:
            raise InputError("stop strings must be non-empty text", field="stop")
        if len(s) > MAX_STOP_LENGTH:
            raise InputError(f"stop strings must be at most {MAX_STOP_LENGTH} characters, "
                             f"got one of {len(s)}", field="stop")


def _greedy(self) -> bool:
    """Temperature 0: the most likely token after the stages, no draw (the one place it is decided)."""
    return self.temperature == 0


def _plain(self) -> bool:
    """Every stage at its neutral value: the distribution sampled from is the model's own."""
    return not _changed(self)


def _changed(self) -> tuple[str, ...]:
    """The stages this run moves away from their neutral value (a stage moves when one of its
    settings with a neutral value is off it), in the schema's order."""
    moved = {s.stage_name for s in SETTINGS
             if s.stage_name and s.neutral is not None and getattr(self, s.name) != s.neutral}
    return tuple(s.name for s in SETTINGS if s.is_stage and s.name in moved)


SamplingParams = make_dataclass(
    "SamplingParams",
    [(s.name, s.kind, field(default=s.default)) for s in SETTINGS]
    + [("seed", "int | None", field(default=None)),  # None = random; the seed used is reported
       ("stop", "tuple[str, ...]", field(default=()))],
    frozen=True,
    namespace={"__post_init__": validate, "plain": property(_plain), "greedy": property(_greedy), "changed": property(_changed),
               "__module__": __name__,
               "__doc__": "One run's sampling settings (fields from settings.SETTINGS), its seed "
                          "(None = random; the seed used is reported) and its stop strings."})
