"""A run from any point of a scored text, on the page ("the probability of a text"): a click on a
token lists the model's candidates there with the choices to run from it; one clicked sets the
controls and the tab's next run (the run section's begin and run, as the page chains them) reads
the text's ids before that token as its prompt, with the candidate given in its place. Its first
step's distribution is checked against transformers' forward pass over those ids."""

from __future__ import annotations

import functools
import math
import re
from types import SimpleNamespace

import gradio as gr
import pytest
import torch

from helpers import plain
from ui.controls import NAMES, Controls
from ui.handlers import Handlers

transformers = pytest.importorskip("transformers")

TEXT = "The capital of France is Paris. The capital of Germany is Paris."
REQ = SimpleNamespace(session_hash="from-text", client=SimpleNamespace(host="198.51.100.4"), username=None)


@functools.lru_cache(maxsize=1)
def reference(model_dir):
    return transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def reference_logp(model_dir, ids) -> torch.Tensor:
    ref = reference(model_dir)
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)  # (vocab,) after the last id


def run_after(h, c: Controls, choice: dict):
    """The page's chain after a choice was clicked: the controls it set, begin, then the run."""
    c = Controls(**{**c.__dict__, **{k: v for k, v in choice.items() if k in NAMES}})
    begun = h.run.begin(*c.values(), REQ, [])
    assert "record" in begun, begun.get("status")
    rec = [o for o in h.run.generate_on_page(*c.values(), REQ, []) if "record" in o][-1]["record"]
    h.run.after_run(rec, [], REQ)
    return c, rec


@pytest.fixture
def h(tiny_engine):
    return Handlers(tiny_engine, top_n=10)


def test_a_clicked_token_runs_from_there_and_with_a_candidate_in_its_place(h, tiny_engine, tiny_dirs):
    scored = h.text_score.score_text_shown(TEXT, "", REQ)
    state = scored["score_state"]
    ids, before = tiny_engine.text_ids(TEXT)
    assert state["ids"] == ids and state["before"] == before == 1 and "Click a token" in scored["score_branch"]
    i = 5  # token 6 of the text: its place in the ids as scored is after the BOS
    at, shown = before + i, state["scores"][i]
    panel = plain(h.text_score.pick_token(state, SimpleNamespace(index=i)))
    assert f"data-pick='{at}:'>▶ Run from here<" in panel and f"the {at} tokens before it" in panel
    assert [int(x) for x in re.findall(rf"data-pick='{at}:(\d+)'", panel)] == [c.id for c in shown.top]
    # Chat mode and another prompt before: the run is a completion of the text's ids.
    page = Controls(prompt="Something else", mode="chat", temperature=0.7, max_new_tokens=3, seed="11")
    choice = h.text_score.run_from_text(state, "", SimpleNamespace(value=f"{at}:"), REQ)
    assert choice["mode"] == "completion" and choice["prefix_ids"] == ""
    # The text before the token, as typed (the tokenizer's dummy-prefix space is not the text's):
    # read again, it gives the same ids.
    assert TEXT.startswith(choice["prompt"]) and tiny_engine.prompt_ids(choice["prompt"]) == ids[:at]
    c, rec = run_after(h, page, choice)
    assert rec.prompt_ids == ids[:at] and rec.given == [] and rec.mode == "completion"
    assert rec.prompt_text == choice["prompt"]  # "Prompt as fed": the text of those ids
    assert rec.opened.startswith(f"A run from token {i + 1} of the scored text")  # as the panel numbers it
    first = rec.steps[0]
    ref = reference_logp(tiny_dirs["gqa_tied"], ids[:at])
    # The candidates the click listed (the chosen token is listed after them when it is not among them).
    assert [cand.id for cand in first.top[:len(shown.top)]] == [cand.id for cand in shown.top]
    assert max(abs(cand.raw_prob - math.exp(float(ref[cand.id]))) for cand in first.top) < 1e-4
    assert rec.params.temperature == 0.7 and rec.seed == 11  # the page's settings and seed
    # A candidate in the token's place: given, and the run continues after it.
    cand = shown.top[3].id
    choice = h.text_score.run_from_text(state, "", SimpleNamespace(value=f"{at}:{cand}"), REQ)
    assert choice["prefix_ids"] == str(cand)
    c, rec = run_after(h, c, choice)
    assert rec.prompt_ids == ids[:at] and rec.given == [cand]
    assert "is put in the place of" in rec.opened
    ref = reference_logp(tiny_dirs["gqa_tied"], ids[:at] + [cand])
    assert max(abs(x.raw_prob - math.exp(float(ref[x.id]))) for x in rec.steps[0].top) < 1e-4
    # The point was that run's only: the next Generate runs the controls' prompt and given ids.
    c2, again = run_after(h, c, {})
    assert again.opened == "" and again.prompt_ids == ids[:at] and again.given == [cand]


def test_the_prompt_of_the_run_scored_runs_from_its_ids_as_fed(h, tiny_engine, monkeypatch):
    monkeypatch.setattr(tiny_engine, "eos_ids", set())
    c = Controls(prompt="Hello there", mode="chat", temperature=0.0, max_new_tokens=2)
    rec = list(h.run.generate(*c.values(), REQ, None))[-1]["record"]
    out = h.text_score.score_prompt(rec, REQ)
    state = out["score_state"]
    assert state["ids"] == rec.prompt_ids and state["before"] == 0
    assert "nothing is before it" in plain(h.text_score.pick_token(state, SimpleNamespace(index=0)))
    at = len(rec.prompt_ids) - 2
    choice = h.text_score.run_from_text(state, "", SimpleNamespace(value=f"{at}:"), REQ)
    _, run = run_after(h, c, choice)
    assert run.prompt_ids == rec.prompt_ids[:at]  # the template's tokens as fed, not the text read again


def test_what_cannot_be_run_from_is_refused_in_one_line(h):
    with pytest.raises(gr.Error, match="Score a text first"):
        h.text_score.run_from_text(None, "", SimpleNamespace(value="3:"), REQ)
    state = h.text_score.score_text_shown(TEXT, "", REQ)["score_state"]
    with pytest.raises(gr.Error, match="Click a token"):
        h.text_score.run_from_text(state, "", SimpleNamespace(value="x:"), REQ)
    with pytest.raises(gr.Error, match="not among the model's candidates"):
        h.text_score.run_from_text(state, "", SimpleNamespace(value=f"3:{10**6}"), REQ)
    with pytest.raises(gr.Error, match="scored on another model"):
        h.text_score.run_from_text({**state, "model": "another model"}, "", SimpleNamespace(value="3:"), REQ)
    # A refused score keeps nothing to run from.
    refused = h.text_score.score_text_shown("", "", REQ)
    assert refused["score_state"] is None and refused["score_branch"] == ""
