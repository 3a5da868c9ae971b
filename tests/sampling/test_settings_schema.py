"""Everything a sampling setting reaches is derived from its one schema entry
(inference/sampling/settings.py): SamplingParams, the stages, the CLI, the page's controls, the
share link and a model server's request. Each test walks every entry of the schema, so a new
setting is checked by them without a line added here."""

from dataclasses import fields, replace
from urllib.parse import parse_qsl, urlsplit

import pytest
import torch


from inference.cli import _sampling_params, build_parser
from inference.errors import NotAvailable
from inference.remote import engine as remote_engine
from inference.sampling.params import SamplingParams
from inference.sampling.settings import BY_NAME, FILTER_SETTINGS, SETTINGS
from inference.sampling.stages import STAGES, final_logits
from inference.sampling.state import RunState
from ui.controls import Controls, controls_from_query, sampling_params, share_url


def off_default(s):
    """A value of the setting's range other than its default (and other than neutral)."""
    if s.kind is str:
        return s.example
    for v in (0.5, 0.9, 2, 3, 1.3, 0.05):
        v = s.kind(v)
        if v not in (s.default, s.neutral):
            try:
                return s.parse(v)
            except Exception:  # noqa: BLE001 - out of this setting's range: try the next
                continue
    raise AssertionError(s.name)


def test_sampling_params_has_one_field_per_setting_with_its_default():
    assert [f.name for f in fields(SamplingParams)] == [s.name for s in SETTINGS] + ["seed", "stop"]
    p = SamplingParams()
    assert all(getattr(p, s.name) == s.default for s in SETTINGS)
    assert p.plain and p.changed == ()


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_each_setting_is_checked_with_its_name(s):
    bad = "@@nope" if s.kind is str else (s.maximum + 1) if s.maximum is not None else (s.minimum - 1)
    on = {"constraint": "json_schema"} if s.name == "constraint_text" else {}  # checked against its kind
    with pytest.raises(Exception, match=s.name):
        SamplingParams(**{s.name: s.kind(bad)}, **on)


def moving(name):
    """Settings that move stage `name` off neutral: its switch (and a DRY whose breakers miss, a
    constraint's text: bytes 1 to 5, any number)."""
    s = BY_NAME[name]
    return {name: off_default(s), **({"dry_sequence_breakers": '"@"'} if name == "dry_multiplier" else {}),
            **({"constraint": "regex", "constraint_text": "[\\x01-\\x05]*"} if name == "constraint" else {})}


def with_stage(s):
    """The setting off its default, with what its stage needs to be valid (a constraint's text
    and kind go together)."""
    if s.stage_name == "constraint":
        return {"constraint": BY_NAME["constraint"].example, "constraint_text": BY_NAME["constraint_text"].example}
    return {s.name: off_default(s)}


class ByteVocab:
    """257 tokens: byte i is token i, token 256 the end of sequence (what a constraint compiles against)."""
    token_bytes = [bytes([i]) for i in range(256)] + [b""]
    eos_ids = (256,)

    def is_control(self, i):
        return i == 256

    def piece(self, i):
        return repr(self.token_bytes[i])


@pytest.mark.parametrize("name", FILTER_SETTINGS)
def test_each_stage_at_its_neutral_value_changes_nothing(name):
    """The neutral value is what remote.steps relies on to say the numbers are the model's own."""
    _, fn = STAGES[name]
    logits = torch.randn(257, generator=torch.Generator().manual_seed(0)) * 3
    logits[:3] = torch.tensor([9.0, 8.8, 8.5])  # three likely tokens: XTC has top choices to cut
    params = SamplingParams(**moving(name))
    # A context with a repeat ending in its last token, generated tokens, μ and a coin that acts.
    state = RunState.at(params, [1, 2, 3, 4, 5, 1, 2], [3, 4, 1, 2, 3], 257,
                        tokenizer=ByteVocab() if name == "constraint" else None)
    state.coin = 0.0 if state.coin is not None else None
    assert torch.equal(fn(logits, SamplingParams(), state), logits)
    moved = fn(logits, params, state)
    assert not torch.equal(moved, logits)  # and another value does change something
    # final_logits runs exactly the registered stages: one moved, the others neutral.
    assert params.changed == (name,) and not params.plain
    assert torch.equal(final_logits(logits, params, state), moved)


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_each_setting_is_a_cli_flag(s):
    if s.stage_name == "constraint":  # a flag per kind: --json-schema PATH, --regex PATTERN, --grammar PATH
        p = _sampling_params(build_parser().parse_args(["generate", "--prompt", "x", "--regex", " a+"]), {})
        assert (p.constraint, p.constraint_text) == ("regex", " a+")
        return
    value = off_default(s)
    args = build_parser().parse_args(["generate", "--prompt", "x", s.flag, str(value)])
    assert getattr(_sampling_params(args, {}), s.name) == value


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)
def test_each_setting_goes_through_the_share_link_and_the_page(s):
    c = Controls(**with_stage(s))
    query = dict(parse_qsl(urlsplit(share_url("http://x/", c)).query))
    assert s.name in query
    back, problems = controls_from_query(query)
    assert problems == [] and getattr(back, s.name) == getattr(c, s.name) != s.default
    assert getattr(sampling_params(back, None), s.name) == getattr(c, s.name)


def test_a_servers_request_carries_each_setting_under_the_schemas_key():
    taken = [s for s in SETTINGS if s.server_key is not None]
    p = SamplingParams(**{k: v for s in taken for k, v in with_stage(s).items()})
    body = remote_engine.server_settings(p, max_new_tokens=7)
    assert body == {s.server_key: (7 if s.name == "max_new_tokens" else s.server_form(off_default(s), None, vars(p))
                                   if s.server_form else off_default(s)) for s in taken}
    assert body["structured_outputs"] == {"json": {"type": "object"}}  # vLLM's form: the schema as an object


def test_a_setting_no_server_takes_is_refused_unless_neutral(monkeypatch):
    min_p = replace(BY_NAME["min_p"], server_key=None)
    monkeypatch.setattr(remote_engine, "SETTINGS", tuple(min_p if s.name == "min_p" else s for s in SETTINGS))
    assert "min_p" not in remote_engine.server_settings(SamplingParams())
    with pytest.raises(NotAvailable, match="min-p is not available in front of a model server"):
        remote_engine.server_settings(SamplingParams(min_p=0.1))


def test_a_control_the_engine_does_not_take_is_fixed_at_neutral():
    from ui.widgets import setting_control
    for s in (BY_NAME["top_k"], BY_NAME["min_p"]):
        control = setting_control(s, off_default(s), 100, available=False)
        assert control.value == s.neutral and control.interactive is False
        assert "not available" in control.info
    assert setting_control(BY_NAME["min_p"], 0.2, 100).interactive is None  # gradio's default


def test_the_classes_that_spell_out_the_settings_are_checked_against_the_schema():
    """SamplingParams and the page's Controls list every setting as a field a reader sees;
    schema_fields fails at import when such a list and the schema part ways."""
    import dataclasses
    from inference.sampling.params import SamplingParams
    from inference.sampling.settings import SETTINGS, schema_fields
    from ui.controls import Controls
    assert [f.name for f in dataclasses.fields(SamplingParams)] == [s.name for s in SETTINGS] + ["seed", "stop"]
    assert SamplingParams() == SamplingParams(**{s.name: s.default for s in SETTINGS})
    assert [f.name for f in dataclasses.fields(Controls)][4:-3] == [s.name for s in SETTINGS]

    missing = dataclasses.make_dataclass("Missing", [(s.name, s.kind, dataclasses.field(default=s.default))
                                                     for s in SETTINGS[1:]])
    with pytest.raises(TypeError, match=rf"missing \['{SETTINGS[0].name}'\]"):
        schema_fields(missing)
    wrong = dataclasses.make_dataclass("Wrong", [(s.name, s.kind, dataclasses.field(
        default=s.default if s.name != "temperature" else 0.5)) for s in SETTINGS])
    with pytest.raises(TypeError, match=r"Wrong.temperature is .* = 0.5; the schema says float = 1.0"):
        schema_fields(wrong)
    schema_fields(dataclasses.make_dataclass("Right", [(s.name, s.kind, dataclasses.field(default=s.default))
                                                       for s in SETTINGS]))
