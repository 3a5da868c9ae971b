"""SamplingParams: one run's settings. Its fields, defaults and checks come from settings.SETTINGS;
the seed and the stop strings are the two fields that are not sampling settings of the schema."""

from __future__ import annotations

from dataclasses import dataclass

from inference.errors import InputError, check_unicode, shown
from inference.sampling.settings import DEFAULT, SETTINGS, schema_fields

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
            e.field = e.field or "constraint_text"
            raise e from None
    if p.dynatemp_range > 0 and p.greedy:  # greedy keeps one token: no range to scale
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
        check_unicode(s, "a stop string", "stop")
        if len(s) > MAX_STOP_LENGTH:
            raise InputError(f"stop strings must be at most {MAX_STOP_LENGTH} characters, "
                             f"got one of {len(s)}", field="stop")


@dataclass(frozen=True)
class SamplingParams:
    """One run's sampling settings (every entry of settings.SETTINGS, in its order, with its
    default: `schema_fields` checks this list against the schema when the module loads), its seed
    (None = random; the seed used is reported) and its stop strings. Checked when made (validate)."""
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
    seed: int | None = None  # None = random; the seed used is reported
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        validate(self)

    @property
    def greedy(self) -> bool:
        """Temperature 0: the most likely token after the stages, no draw (the one place it is decided)."""
        return self.temperature == 0

    @property
    def plain(self) -> bool:
        """Every stage at its neutral value: the distribution sampled from is the model's own."""
        return not self.changed

    @property
    def changed(self) -> tuple[str, ...]:
        """The stages this run moves away from their neutral value (a stage moves when one of its
        settings with a neutral value is off it), in the schema's order."""
        moved = {s.stage_name for s in SETTINGS
                 if s.stage_name and s.neutral is not None and getattr(self, s.name) != s.neutral}
        return tuple(s.name for s in SETTINGS if s.is_stage and s.name in moved)


schema_fields(SamplingParams, after=("seed", "stop"))
