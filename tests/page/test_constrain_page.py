"""The page's "Constrain output": a constrained run's bars tag the forbidden candidates and give
the masked mass, its per-step chart has the masked mass, replay of a constrained step rebuilds
the matcher, a bad constraint is refused in one line, and the ready examples are valid."""

from __future__ import annotations

from helpers import plain
import re
from types import SimpleNamespace

import gradio as gr
import pytest

from inference.sampling.settings import SHAPING_SETTINGS
from ui.controls import Controls
from ui.shared.charts import run_chart_frames
from ui.handlers import Handlers
from ui.run import constrain

pytest.importorskip("xgrammar")
REGEX = "[a-z ]{3,40}"


@pytest.fixture
def h(tiny_engine):
    return Handlers(tiny_engine, top_n=8)


def run(h, **kw):
    c = Controls(**{"prompt": "The quick brown fox", "max_new_tokens": 12, "seed": "3", "temperature": 1.0, **kw})
    return list(h.run.generate(*c.values(), SimpleNamespace(session_hash="c"), None))[-1]["record"]


def test_a_constrained_run_tags_forbidden_candidates_and_charts_the_masked_mass(h):
    rec = run(h, constraint="regex", constraint_text=REGEX)
    text = rec.done.text
    assert re.fullmatch(r"[a-z ]*", text)  # at any end; a whole match where the constraint ended it
    assert rec.done.reason == "length" or re.fullmatch(REGEX, text)
    masked = [s.masked_mass for s in rec.steps]
    assert all(0.0 <= m <= 1.0 for m in masked) and any(m > 0 for m in masked)
    step = next(s for s in rec.steps if any(c.forbidden for c in s.top))
    bars = plain(h.page.bars(step, rec=rec))
    assert "Constraint removed" in bars and "masked mass" in bars and ">forbidden<" in bars
    assert bars.count(">forbidden<") == sum(c.forbidden for c in step.top)
    frame, _ = run_chart_frames(rec)
    chart = frame[frame.metric == "masked mass (constraint)"]
    assert chart.value.tolist() == pytest.approx(masked, abs=5e-5)  # as the page prints it: 4 decimals
    # An unconstrained run: no tag, no masked-mass line or series.
    free = run(h)
    assert "Constraint removed" not in h.page.bars(free.steps[0], rec=free)
    assert "masked mass (constraint)" not in set(run_chart_frames(free)[0].metric)


def test_replay_of_a_constrained_step_is_the_run_and_another_constraint_says_why_not(h):
    rec = run(h, constraint="regex", constraint_text=REGEX)
    values = [getattr(rec.params, n) for n in SHAPING_SETTINGS]
    out = h.experiments.replay_step(rec, 2, *values)
    assert "constraint" in out["replay_md"] and "raw mass forbidden" in out["replay_md"]
    other = dict(zip(SHAPING_SETTINGS, values), constraint_text="[0-9]+")
    out = h.experiments.replay_step(rec, 2, *other.values())
    assert out["replay_md"].startswith("⚠ Replay: the regular expression does not allow token 0")


def test_a_bad_constraint_is_refused_before_the_run_in_one_line(h):
    with pytest.raises(gr.Error) as e:
        run(h, constraint="json_schema", constraint_text='{"type": "object", "properties": 3}')
    assert "constraint_text is not a valid JSON schema: properties must be an object" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", list(constrain.EXAMPLES))
def test_every_ready_example_is_valid_and_fills_both_boxes(name):
    picked = constrain.pick_example(name)
    assert set(picked) == {"constraint", "constraint_text"}
    assert constrain.check_text(picked["constraint"], picked["constraint_text"]).startswith("✓")


def test_the_live_check_says_what_is_wrong_in_one_line():
    assert constrain.check_text("", "anything") == ""
    said = constrain.check_text("grammar", 'root ::= "a" | b')
    # The box by its label, as Generate's status line calls it (not the parameter's name).
    # Where, not what: the page quotes none of the text (issue 59, finding 9); the box holds it.
    assert said.startswith("⚠ Constraint is not a valid grammar (EBNF)") and 'line 1, column 16: Rule "…" is not defined' in said
    assert "constraint_text" not in said
    assert constrain.check_text("json_schema", " ") == "⚠ Constraint is empty: give the JSON schema"


def test_a_link_with_a_constraint_restores_it_and_opens_its_box(h):
    from ui.controls import share_url
    from urllib.parse import parse_qsl, urlsplit
    c = Controls(**constrain.pick_example("Regex: a date (YYYY-MM-DD)"))
    query = dict(parse_qsl(urlsplit(share_url("http://x/", c)).query))
    out = h.share.restore(SimpleNamespace(query_params=query))
    assert (out["constraint"], out["constraint_text"]) == (c.constraint, c.constraint_text)
    assert out["constrain_box"]["open"] is True and out["notice"] == ""
    assert "constrain_box" not in h.share.restore(SimpleNamespace(query_params={}))


def test_a_run_whose_stages_leave_no_allowed_token_names_the_stage_in_its_end(h):
    # Every token the constraint allows banned by the logit bias, which runs after the constraint:
    # the run ends before its first token, and its status line names the stage (issue 62).
    tok, vocab = h.page.engine.tokenizer, h.page.info.cfg.vocab_size
    digits = [i for i, b in enumerate(tok.token_bytes[:vocab]) if b and b.isdigit() and not tok.is_control(i)]
    assert digits
    rec = run(h, constraint="regex", constraint_text="[0-9]+", logit_bias=", ".join(f"{i}:-100" for i in digits))
    assert rec.done.reason == "constraint" and rec.done.emptied_by == "logit_bias" and not rec.steps
    from ui.shared import view as render
    status = render.status_text(rec, h.page.context, 0.0)
    assert status.startswith("Run ended: logit bias removed the last token the constraint allows")
    assert "move constraint before logit_bias in the sampler order" in status
    assert "logit bias removed the last token" in plain(render.stats_markdown(h.page.info, rec))


def test_an_end_the_constraint_forced_is_said_as_the_constraints(h):
    # "abc" allows one text. After it, where the end-of-sequence token is the only token the
    # constraint allows, the run ends whatever the model would have written: the page says so,
    # and does not say the model chose it; where other tokens were allowed too, the model chose.
    from dataclasses import replace
    from ui.format import forced_end
    from ui.shared.view import stats_markdown, status_text
    rec = run(h, constraint="regex", constraint_text="abc")
    last = rec.steps[-1]
    assert rec.done.reason == "eos" and rec.done.text == "abc"
    kept = 1.0 - last.masked_mass  # the raw mass the constraint allowed: here more than the end's own
    assert kept > last.raw_prob * 1.01 and last.prob < 1.0  # other tokens (beyond the bars' top) were allowed
    assert not forced_end(last) and "the model emitted its end-of-sequence token" in status_text(rec, 256, 0.0)
    # The same step where the end was all the constraint kept (its raw p is 1 - the masked mass).
    only = replace(last, masked_mass=1.0 - last.raw_prob, prob=1.0)
    forced = replace(rec, steps=[*rec.steps[:-1], only])
    said = "the constraint was complete (its end-of-sequence token was the only token it allowed)"
    assert forced_end(only) and said in status_text(forced, 256, 0.0) and said in plain(stats_markdown(h.page.info, forced))
