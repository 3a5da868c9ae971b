"""The decoding section's handlers (ui/decoding): a beam search's tree and ranked beams, and a
speculative run's accepts and rejects, from the page's controls, as the CLI and engine make them."""

from inference.request import prepare_run
from inference.events import BeamDoneEvent
from ui.controls import Controls

PROMPT = "The quick brown fox jumps over the quick brown"


def test_beam_search_draws_every_step_and_ranks_the_engines_beams(h, tiny_engine):
    c = Controls(prompt=PROMPT, num_beams=3, max_new_tokens=5, temperature=0.7, top_p=0.9)  # the model's defaults
    out = h.decoding.beam_search(*c.values())
    assert "Beam search" in out["decoding_md"] and "3 beams" in out["decoding_md"]
    view = out["decoding_view"]
    kept = max(2, 1 + len(tiny_engine.eos_ids)) * 3  # candidates a step (BeamSearch: past every end token)
    assert view.count('class="beam-step"') == 5 and view.count('class="hyp ') == 5 * kept
    assert view.count("hyp pruned") > 0 and view.count("hyp kept") == 4 * 3  # the last step keeps none
    done = list(tiny_engine.run(prepare_run(tiny_engine, {"num_beams": 3, "max_new_tokens": 5}, prompt=PROMPT)))[-1]
    assert isinstance(done, BeamDoneEvent)
    assert f"{done.beams[0].score:.4f}" in out["decoding_md"]  # the engine's best beam, its score


def test_the_beam_button_refuses_one_beam_and_says_sampling_stages_do_not_apply(h):
    out = h.decoding.beam_search(*Controls(prompt=PROMPT, num_beams=1).values())
    assert "Beams to 2 or more" in out["decoding_md"] and out["decoding_view"] == ""
    out = h.decoding.beam_search(*Controls(prompt=PROMPT, num_beams=2, top_k=5, max_new_tokens=3).values())
    assert "The sampling settings (Top-k) do not apply to a beam search." in out["decoding_md"]


def test_speculative_run_shows_each_decision(h):
    c = Controls(prompt=PROMPT, max_new_tokens=8, temperature=0.0, seed="1")
    out = h.decoding.speculative(*c.values(), "early-exit", 1, 3)
    assert "Speculative decoding" in out["decoding_md"] and "early-exit:1" in out["decoding_md"]
    # Its speed against plain decoding of the same request, measured just after; greedy: the same text.
    assert "for plain decoding of the same request" in out["decoding_md"]
    assert "Its text is plain greedy decoding's, token for token." in out["decoding_md"]
    assert out["decoding_view"].count("<tr class=") == 8
    out = h.decoding.speculative(*Controls(prompt=PROMPT, repetition_penalty=1.3).values(), "prompt-lookup", 1, 3)
    assert "repetition_penalty" in out["decoding_md"] and out["decoding_view"] == ""


def test_generate_refuses_beams_in_one_line(h):
    import gradio as gr
    import pytest
    with pytest.raises(gr.Error) as e:
        list(h.run.generate(*Controls(prompt=PROMPT, num_beams=2, max_new_tokens=3).values()))
    assert "Run beam search" in str(e.value) and "\n" not in str(e.value)


def test_a_finished_beam_opens_as_a_run_with_its_tokens_and_the_models_bars(h, tiny_engine):
    """Run beam search, pick beam 2, Open as a run: the tab's next run (begin, then the page's
    generate) makes exactly that beam's tokens after the same prompt; each step's raw
    probability is the model's (their logs sum to the beam's log-probability within 1e-4) and,
    with the sampling settings set aside, the final one equals it. The run after it samples."""
    import math
    from types import SimpleNamespace

    import gradio as gr
    import pytest

    req = SimpleNamespace(session_hash="open-beam")
    c = Controls(prompt=PROMPT, num_beams=3, max_new_tokens=5, temperature=0.7, top_p=0.9, seed="4")
    out = h.decoding.beam_search(*c.values(), req)
    state = out["beam_state"]
    assert len(state["beams"]) == 3 and out["open_beam"]["interactive"]
    assert [v for _, v in out["beam_pick"]["choices"]] == [0, 1, 2]
    done = list(tiny_engine.run(prepare_run(tiny_engine, {"num_beams": 3, "max_new_tokens": 5}, prompt=PROMPT)))[-1]
    assert state["beams"] == [b.tokens for b in done.beams]
    h.decoding.open_beam(state, 1, req)
    begun = h.run.begin(*c.values(), req)
    assert "record" in begun, begun.get("status")
    rec = [o for o in h.run.generate_on_page(*c.values(), req) if "record" in o][-1]["record"]
    assert [s.token_id for s in rec.steps] == done.beams[1].tokens
    assert abs(sum(math.log(s.raw_prob) for s in rec.steps) - done.beams[1].logprob) < 1e-4
    assert all(abs(s.prob - s.raw_prob) < 1e-6 for s in rec.steps)
    assert rec.opened.startswith("Beam 2 of 3 opened as a run")
    # The beam was this run's only: the next click samples (Beams back to 1).
    again = Controls(**{**c.__dict__, "num_beams": 1})
    assert "record" in h.run.begin(*again.values(), req)
    rec2 = [o for o in h.run.generate_on_page(*again.values(), req) if "record" in o][-1]["record"]
    assert rec2.opened == "" and rec2.params.temperature == 0.7
    # Refused: no beam search yet; a prompt changed since it.
    with pytest.raises(gr.Error, match="Run a beam search first"):
        h.decoding.open_beam(None, 0, req)
    h.decoding.open_beam(state, 0, req)
    moved = h.run.begin(*Controls(**{**c.__dict__, "prompt": PROMPT + " dog"}).values(), req)
    assert "the prompt changed since the beam search" in moved["status"]


def test_beam_search_after_a_branch_continues_after_its_given_ids_and_opens_as_a_run(h, tiny_engine):
    """Issue 62: after a branch (or an edit) the beam search was refused ("does not continue after
    given ids yet") with no way out said. It continues after the given ids: the engine's beam search
    of the prompt and those ids read as the prompt; a beam opened then runs after the same ids."""
    from types import SimpleNamespace
    req = SimpleNamespace(session_hash="beam-branch")
    prompt_ids = tiny_engine.prompt_ids(PROMPT)
    given = tiny_engine.tokenizer.encode_continuation(" fox jumps")
    c = Controls(prompt=PROMPT, num_beams=3, max_new_tokens=4, temperature=0.7, top_p=0.9, seed="4",
                 prefix_ids=",".join(map(str, given)))
    out = h.decoding.beam_search(*c.values(), req)
    assert "given ids" not in out["decoding_md"].split("Beam search")[0], out["decoding_md"]
    assert f"after the {len(given)} given tokens of the branch" in out["decoding_md"]
    done = list(tiny_engine.run(prepare_run(tiny_engine, {"num_beams": 3, "max_new_tokens": 4},
                                            ids=[*prompt_ids, *given])))[-1]
    assert out["beam_state"]["beams"] == [b.tokens for b in done.beams]
    h.decoding.open_beam(out["beam_state"], 0, req)
    begun = h.run.begin(*c.values(), req)
    assert "record" in begun, begun.get("status")
    rec = [o for o in h.run.generate_on_page(*c.values(), req) if "record" in o][-1]["record"]
    assert rec.given == given and [s.token_id for s in rec.steps] == done.beams[0].tokens
