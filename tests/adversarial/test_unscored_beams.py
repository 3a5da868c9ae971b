"""Issue 59, finding 5: a beam search with length_penalty -5 answered `choices: []` with HTTP 200,
and the CLI printed "0 finished" with exit 0. A search that ends with no finished beam (each one
that ended scored below -1e9, transformers' impossible score, and was dropped as transformers
drops it) ends with a stated reason: the API's error names length_penalty, the CLI exits 2, the
page says why."""

from __future__ import annotations

import httpx

from inference.request import prepare_run
from ui.controls import Controls
from served_page import page  # noqa: F401 - the fixture

LONG = 60  # tokens: at length 60, a log-probability of -100 times 60^5 is far below -1e9


def test_a_search_that_finishes_no_beam_ends_saying_why(tiny_engine, monkeypatch):
    monkeypatch.setattr(tiny_engine, "eos_ids", set())  # every beam ends at the cap
    request = prepare_run(tiny_engine, {"num_beams": 4, "length_penalty": -5, "max_new_tokens": LONG,
                                        "temperature": 0}, prompt="The quick brown", seed=1)
    done = list(tiny_engine.run(request))[-1]
    assert done.reason == "unscored" and done.beams == []
    alike = prepare_run(tiny_engine, {"num_beams": 4, "length_penalty": -1, "max_new_tokens": LONG,
                                      "temperature": 0}, prompt="The quick brown", seed=1)
    assert len(list(tiny_engine.run(alike))[-1].beams) == 4  # a length penalty nearer 0 finishes them


def test_the_api_answers_an_error_naming_the_length_penalty(page):
    r = httpx.post(f"{page.url}/v1/completions", timeout=120, json={
        "prompt": "The quick brown", "max_tokens": LONG, "use_beam_search": True, "n": 4, "length_penalty": -5})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "length_penalty" and "finished no beam" in error["message"]


def test_the_page_says_why(page):
    c = Controls(prompt="The quick brown", max_new_tokens=LONG, num_beams=4, length_penalty=-5.0, temperature=0.0)
    out = page.handlers.decoding.beam_search(*c.values(), None)
    assert "finished no beam" in out["decoding_md"] and "length penalty -5" in out["decoding_md"]


def test_the_cli_exits_2_saying_why(tiny_dirs, capsys, monkeypatch):
    from inference.cli import main
    from inference.decoding.beams import BeamSearch
    from inference.serving import scheduler

    # The CLI's model ends beams at its end-of-sequence token; here every beam ends at the cap.
    monkeypatch.setattr(scheduler, "BeamSearch", lambda width, lp, eos, max_new: BeamSearch(width, lp, frozenset(), max_new))
    code = main(["generate", "--model", str(tiny_dirs["gqa_tied"]), "--device", "cpu", "--prompt", "The quick brown",
                 "--num-beams", "4", "--length-penalty", "-5", "--max-new-tokens", str(LONG), "--temperature", "0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: the beam search finished no beam") and len(err.splitlines()) == 1
