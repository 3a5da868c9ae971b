"""The stage registry: setting name -> (label, pure stage function (logits, params, state) -> logits)."""

from __future__ import annotations

from typing import Callable

from inference.sampling.settings import BY_NAME

STAGES: dict[str, tuple[str, Callable]] = {}


def stage(name: str):
    """Register the stage of the setting `name`, labelled as the schema labels it (its stage_label, else its label). The order
    stages run in is settings.DEFAULT_ORDER (or a run's sampler_order), not the registration's."""
    def register(fn):
        STAGES[name] = (BY_NAME[name].stage_label or BY_NAME[name].label.lower(), fn)
        return fn
    return register
