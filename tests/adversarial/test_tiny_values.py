"""Issue 59, finding 2: values so near 0 that float32 (what the stages compute in) holds them as 0 or
as a subnormal ended runs with "index N is out of bounds" and an HTTP 500. The schema refuses them
with the range at every door; a tiny but normal temperature draws the top token; settings whose
numbers still overflow float32 end their own run with a one-line error, never a draw past the
vocabulary, and the runs beside it are untouched."""

from __future__ import annotations

import threading

import pytest
import torch

from inference.errors import InputError
from inference.request import prepare_run
from inference.sampling.settings import SETTINGS

FLOAT32_TINY = torch.finfo(torch.float32).tiny  # float32's smallest normal number
FLOATS = [s for s in SETTINGS if s.kind is float]


@pytest.mark.parametrize("setting", FLOATS, ids=lambda s: s.name)
@pytest.mark.parametrize("value", [1e-300, 1e-39, -1e-39, 1e-45])
def test_a_value_float32_holds_as_0_or_subnormal_is_refused_with_the_range(setting, value):
    if not (setting.minimum <= value and (setting.maximum is None or value <= setting.maximum)):
        pytest.skip("outside the range in float64 too: the plain range error")
    with pytest.raises(InputError) as e:
        setting.parse(value)
    message = str(e.value)
    assert e.value.field == setting.name and setting.range_text() in message and "float32" in message
    assert "\n" not in message
    if setting.minimum <= 2 * FLOAT32_TINY:  # the smallest normal number and above are taken
        assert setting.parse(2 * FLOAT32_TINY) == 2 * FLOAT32_TINY
    if setting.minimum == 0 and not setting.min_open:
        assert setting.parse(0.0) == 0.0  # 0 means what 0 means


def test_a_logit_bias_that_float32_cannot_hold_is_refused():
    from inference.sampling.settings import BY_NAME
    with pytest.raises(InputError, match="finite in float32"):
        BY_NAME["logit_bias"].parse("5:1e39")


def _steps(engine, settings, seed=1, cancel=None):
    request = prepare_run(engine, {"max_new_tokens": 4, **settings}, prompt="Hello there", seed=seed)
    return list(engine.run(request, cancel))


def test_a_tiny_normal_temperature_draws_the_top_token_whatever_the_logits(tiny_engine, monkeypatch):
    """2e-38 divides a logit of 60 past float32's largest: the logits are shifted first, and the
    draw is the top token's (before: every logit infinite, the distribution NaN, index 384)."""
    monkeypatch.setattr(tiny_engine, "eos_ids", set())
    events = _steps(tiny_engine, {"temperature": 2e-38, "logit_bias": "5:60"})
    assert [e.token_id for e in events[:-1]] == [5, 5, 5, 5] and [e.prob for e in events[:-1]] == [1.0] * 4
    assert events[-1].reason == "length"


def test_settings_that_overflow_float32_end_their_own_run_in_one_line(tiny_engine, monkeypatch):
    """A repetition penalty of 2e-38 on a seen token with a logit of 50 overflows float32: that run
    ends with a one-line InputError (a 400 at the API, exit 2 at the CLI), never a draw past the
    vocabulary; a run sampled in the same steps makes the tokens it makes alone."""
    monkeypatch.setattr(tiny_engine, "eos_ids", set())
    plain = {"temperature": 1.0, "top_k": 20}
    alone = [e.token_id for e in _steps(tiny_engine, plain, seed=7)[:-1]]
    bad = prepare_run(tiny_engine, {"max_new_tokens": 4, "repetition_penalty": 2e-38, "logit_bias": "5:50 6:40"},
                      ids=[5, 6, 7], seed=1)
    good = prepare_run(tiny_engine, {"max_new_tokens": 4, **plain}, prompt="Hello there", seed=7)
    out, errors = {}, {}

    def run(name, request):
        try:
            out[name] = list(tiny_engine.run(request))
        except Exception as e:  # noqa: BLE001 - what the run raised is the point
            errors[name] = e

    threads = [threading.Thread(target=run, args=a) for a in (("bad", bad), ("good", good))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert isinstance(errors.get("bad"), InputError) and "overflowed float32" in str(errors["bad"]), errors
    assert "good" not in errors and [e.token_id for e in out["good"][:-1]] == alone
    stats = tiny_engine.scheduler.stats()
    assert stats.blocks_used - stats.blocks_cached == 0 and stats.active_runs == 0
