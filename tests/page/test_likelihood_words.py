""""How likely was X?" says where it scores (no "the first 0 generated tokens") and that its
probabilities are the model's raw ones, not the run's final ones."""

from ui.controls import Controls
from ui.experiments.handlers import likelihood_lead
from ui.handlers import Handlers


def test_the_lead_says_where_and_which_probabilities():
    assert likelihood_lead(0, 0).startswith("After the prompt (the model's raw probabilities")
    assert likelihood_lead(0, 1).startswith("After the prompt and the first generated token (")
    assert likelihood_lead(0, 2).startswith("After the prompt and the first 2 generated tokens (")
    assert likelihood_lead(5, 2).startswith("After the prompt, the 5 given tokens and the first 2 generated tokens (")
    assert likelihood_lead(1, 0).startswith("After the prompt and the 1 given token (")
    assert "0 generated" not in likelihood_lead(3, 0)


def test_scoring_at_step_0_says_after_the_prompt(tiny_engine):
    h = Handlers(tiny_engine)
    rec = list(h.run.generate(*Controls(prompt="The quick", temperature=0.0, max_new_tokens=3, seed="1").values(),
                          None))[-1]["record"]
    text = h.experiments.likelihood(rec, 0, " the")
    assert text.startswith("After the prompt (the model's raw probabilities") and "first 0" not in text
