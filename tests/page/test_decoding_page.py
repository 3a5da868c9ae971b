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
    assert view.count('class="beam-step"') == 5 and view.count('class="hyp ') == 5 * 6
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
    assert out["decoding_view"].count("<tr class=") == 8
    out = h.decoding.speculative(*Controls(prompt=PROMPT, repetition_penalty=1.3).values(), "prompt-lookup", 1, 3)
    assert "repetition_penalty" in out["decoding_md"] and out["decoding_view"] == ""


def test_generate_refuses_beams_in_one_line(h):
    import gradio as gr
    import pytest
    with pytest.raises(gr.Error) as e:
        list(h.run.generate(*Controls(prompt=PROMPT, num_beams=2, max_new_tokens=3).values()))
    assert "Run beam search" in str(e.value) and "\n" not in str(e.value)
