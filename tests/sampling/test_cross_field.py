"""Settings that cannot be used together are refused in one line naming both, by the engine's
schema (SamplingParams), so that the page, the CLI and the API refuse them alike: a dynamic
temperature range with temperature 0 (greedy keeps one token: there is nothing to scale)."""

from types import SimpleNamespace

import gradio as gr
import pytest

from api.errors import APIError
from api.params import completion_ask
from inference.cli import main
from inference.errors import InputError
from inference.sampling.params import SamplingParams
from ui.controls import Controls
from ui.handlers import Handlers


def test_dynamic_temperature_with_temperature_zero_is_refused_naming_both():
    with pytest.raises(InputError) as e:
        SamplingParams(temperature=0.0, dynatemp_range=1.5)
    assert e.value.field == "dynatemp_range" and "\n" not in str(e.value)
    assert str(e.value).startswith("dynatemp_range needs temperature above 0")
    # Either alone is fine, and a range with any temperature above 0.
    for ok in (dict(temperature=0.0), dict(dynatemp_range=1.5), dict(temperature=0.01, dynatemp_range=1.5)):
        SamplingParams(**ok)


def test_the_page_refuses_it_by_the_controls_labels(tiny_engine):
    c = Controls(prompt="The quick", temperature=0.0, dynatemp_range=1.5, max_new_tokens=2, seed="1")
    h, req = Handlers(tiny_engine), SimpleNamespace(session_hash="dynatemp")
    status = h.run.begin(*c.values(), req, [])["status"]
    assert status.startswith("⚠ Not started: Dynamic temperature range needs temperature above 0")
    assert "\n" not in status and "dynatemp_range" not in status
    with pytest.raises(gr.Error) as e:  # /generate, for scripts: the parameters' names
        list(h.run.generate(*c.values(), req))
    assert e.value.message.startswith("dynatemp_range needs temperature above 0")


def test_the_api_answers_400_naming_the_field():
    with pytest.raises(APIError) as e:
        completion_ask({"prompt": "The quick", "temperature": 0, "dynatemp_range": 1.5}, "m", {}, None)
    assert e.value.status == 400 and e.value.param == "dynatemp_range"
    assert e.value.message.startswith("dynatemp_range needs temperature above 0") and "\n" not in e.value.message


def test_the_cli_exits_2(tiny_dirs, capsys):
    assert main(["generate", "--model", str(tiny_dirs["mha"]), "--prompt", "The quick", "--temperature", "0",
                 "--dynatemp-range", "1.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: dynatemp_range needs temperature above 0") and err.count("\n") == 1
