"""The sampling settings, defined once: name, default, range, label, help and where each goes.

SamplingParams' fields, defaults and checks, the CLI's flags, the page's controls and where they
sit, the share link's query parameters, the keys read from a model's generation_config.json, the
replay and compare controls, and the key a model server's request carries are all derived from
SETTINGS, so a new knob is one entry here plus its stage function in stages.py and its test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inference.errors import InputError, shown


@dataclass(frozen=True)
class Setting:
    name: str  # SamplingParams field, query parameter, generation_config.json key
    kind: type  # float or int
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
    control: str = "slider"  # the page's control: "slider" or "number" (no natural upper end)

    @property
    def is_stage(self) -> bool:
        return self.neutral is not None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def range_text(self) -> str:
        lo = "(" if self.min_open else "["
        hi = f"{self.maximum:g}]" if self.maximum is not None else "∞)"
        return f"{lo}{self.minimum:g}, {hi}"

    def parse(self, raw) -> float | int:
        """The value as this setting's type, checked against its range; InputError names the
        setting. Whole numbers written as 3.0 are accepted for integers, 2.5 is not."""
        if isinstance(raw, bool):
            raise InputError(f"{self.name} must be a number, got {shown(raw)}")
        try:
            value = float(raw)
        except (TypeError, ValueError):
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
        return value


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
    Setting("max_new_tokens", int, 128, 1, None, "Max new tokens", "at most this many tokens "
            "are generated", step=1, server_key="max_tokens"),
)
BY_NAME = {s.name: s for s in SETTINGS}
# The settings that shape the distribution sampled from (each a stage of stages.final_logits),
# in the page's order; max_new_tokens is not one.
FILTER_SETTINGS = tuple(s.name for s in SETTINGS if s.is_stage)


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
