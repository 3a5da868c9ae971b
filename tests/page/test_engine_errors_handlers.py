"""Refusals and engine errors on the page, at the handlers: a logit bias beyond the vocabulary
refused before the run, an engine error mid-run or at once ending the run on the page, an empty
chat message refused, an error mid-way through many samples ending them in the panel (the
browser's checks are in test_engine_errors_browser.py)."""

from types import SimpleNamespace

import gradio as gr
import pytest

from engine_hold import fail_mid_run
from inference.errors import InputError
from inference.events import DoneEvent
from ui.controls import Controls

REQ = SimpleNamespace(session_hash="engine-errors")


def controls(**kw) -> Controls:
    return Controls(**{"prompt": "The quick brown fox", "max_new_tokens": 6, "seed": "3", **kw})


@pytest.mark.parametrize("beyond", [0, 1, None])
def test_a_logit_bias_beyond_the_vocabulary_is_refused_before_the_run(h, tiny_engine, beyond):
    """begin says it in the status line, by its label, as the CLI words it; no run is queued."""
    vocab = tiny_engine.cfg.vocab_size
    tid = 999_999 if beyond is None else vocab + beyond  # the vocabulary's size, one past, far past
    c = controls(logit_bias=f"{tid}:5")
    out = h.run.begin(*c.values(), REQ)
    assert out == {"status": f"⚠ Not started: Logit bias names token {tid} but the vocabulary has {vocab} tokens"}
    assert "engine-errors" not in h.page.runs._waiting
    assert list(h.run.generate_on_page(*c.values(), REQ)) == [{}]
    # The last id of the vocabulary is a token: it runs.
    ok = controls(logit_bias=f"{vocab - 1}:5")
    assert "record" in h.run.begin(*ok.values(), REQ)


@pytest.mark.parametrize("error", [InputError("the engine failed (a test's error)", field="logit_bias"),
                                   RuntimeError("out of memory\nsomewhere")])
def test_an_engine_error_mid_run_ends_the_run(h, tiny_engine, monkeypatch, caplog, error):
    """The page's run ends: its last update says the error in one line (a field by its label),
    and after_run enables Generate, disables Stop and stops the chart timer. A fault that is not
    a user's is kept in the server's log with its traceback."""
    fail_mid_run(monkeypatch, tiny_engine, error)
    c = controls()
    h.run.begin(*c.values(), REQ)
    with caplog.at_level("ERROR", logger="tokenlab.page"):
        updates = list(h.run.generate_on_page(*c.values(), REQ))
    logged = [r for r in caplog.records if r.name == "tokenlab.page"]
    assert (len(logged) == 1 and logged[0].exc_info[1] is error) if isinstance(error, RuntimeError) else not logged
    line = ("Logit bias: the engine failed (a test's error)" if isinstance(error, InputError)
            else "RuntimeError: out of memory somewhere")
    rec = updates[-1]["record"]
    assert updates[-1]["status"] == f"⚠ The run failed: {line}" and len(rec.steps) == 1 and rec.done is None
    after = h.run.after_run(rec, [], REQ)
    assert after["status"] == f"⚠ The run failed: {line}"
    assert after["generate"]["interactive"] is True and after["stop_button"]["interactive"] is False
    assert after["live"].active is False
    assert not h.page.registry.running("engine-errors")  # the job is let go: the next run may start


def test_an_engine_that_refuses_the_run_at_once_ends_it_on_the_page(h, tiny_engine, monkeypatch):
    """A server's engine raises from run itself (it is no generator): the page's run
    ends as for an error mid-run, not with an error that leaves the page running."""
    def refusing(*args, **kwargs):
        raise InputError("a branch in front of a server cannot use presence or frequency penalties")
    monkeypatch.setattr(tiny_engine, "run", refusing)
    c = controls()
    h.run.begin(*c.values(), REQ)
    updates = list(h.run.generate_on_page(*c.values(), REQ))
    rec = updates[-1]["record"]
    line = "⚠ The run failed: a branch in front of a server cannot use presence or frequency penalties"
    assert updates[-1]["status"] == line and h.run.after_run(rec, [], REQ)["status"] == line


def test_an_empty_chat_message_is_refused_on_the_page_and_answered_by_the_engine(h, tiny_engine):
    """The API answers an empty user message (OpenAI and vLLM do: the template's turn around it
    is the prompt); on the page an empty box is a slip, refused before the run."""
    out = h.run.begin(*controls(prompt="  ", mode="chat").values(), REQ)
    assert out == {"status": "⚠ Not started: the message is empty: type what you say to the model"}
    assert tiny_engine.prompt_ids("", chat=True) == [i for i in tiny_engine.prompt_ids("Hi", chat=True)
                                                     if i not in tiny_engine.tokenizer.encode_continuation("Hi")]
    with pytest.raises(InputError, match="the prompt is empty"):
        tiny_engine.prompt_ids(" ")


def test_an_engine_error_mid_way_through_many_samples_ends_them_in_the_panel(h, tiny_engine, monkeypatch, caplog):
    """The samples' engine fails after a few samples have ended: the panel's last update says how
    far they got and the error in one line, the caller gets it as a one-line error (the page's
    toast), the fault goes to the server's log, and the visitor's job is let go."""
    real = tiny_engine.generate_many

    def failing(*args, **kwargs):
        ended = 0
        for k, ev in real(*args, **kwargs):
            yield k, ev
            ended += isinstance(ev, DoneEvent)
            if ended == 2:
                raise RuntimeError("out of memory\nsomewhere")
    monkeypatch.setattr(tiny_engine, "generate_many", failing)
    updates = []
    with caplog.at_level("ERROR", logger="tokenlab.page"), pytest.raises(gr.Error) as raised:
        for out in h.samples.samples(*controls(max_new_tokens=3).values(), 6, REQ):
            updates.append(out)
    assert raised.value.message == "The samples failed: RuntimeError: out of memory somewhere"
    assert updates[-1]["samples_md"].startswith("⚠ The samples failed after 2 of 6 had ended (")
    assert updates[-1]["samples_md"].endswith("tokens): RuntimeError: out of memory somewhere")
    assert [r.exc_info[1].args for r in caplog.records if r.name == "tokenlab.page"] == [("out of memory\nsomewhere",)]
    assert not h.page.registry.running("engine-errors")
