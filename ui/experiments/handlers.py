"""The sampling experiments' events: replay of a step under other settings, compare A/B, and
"how likely was X?"."""

from __future__ import annotations

import dataclasses
import gradio as gr

from inference.errors import InputError, TokenLabError, check_unicode
from server.limits import score_message
from inference.sampling.replay import replay_state
from inference.sampling.settings import SHAPING_SETTINGS
from ui.base import Section, named_args, page_error, step_index, takes_controls
from ui.controls import Controls, page_message, sampling_params
from ui.experiments import render
from ui.experiments.two_models import TwoModels, along, same_vocabulary
from ui.run_state import RunRecord, divergence, text_divergence

class ExperimentHandlers(Section):
    @named_args("rec", "step", *SHAPING_SETTINGS)
    def replay_step(self, rec: RunRecord | None, step, *values, request: gr.Request = None) -> dict:
        """The step's sampling pipeline as it ran and under new settings (values: one per
        settings.SHAPING_SETTINGS), on the step's logits recomputed by one forward pass (kept
        for the next replay of the same step, so moving a replay control is cheap)."""
        if rec is None or not rec.steps:
            return {"replay_md": "Generate first, then pick a step to replay.", "replay_bars": ""}
        i = step_index(rec, step)
        ev = rec.steps[i]
        try:
            new = sampling_params(self.defaults, None, **dict(zip(SHAPING_SETTINGS, values)))
        except TokenLabError as e:
            return {"replay_md": f"⚠ Replay: {page_message(e, one_line=True)}", "replay_bars": ""}
        with self._job(request):  # one forward pass, unless this step's logits are kept
            try:
                m = self.view(rec.model)
                logits = rec.logits_at(i, m.engine.step_logits)
            except TokenLabError as e:  # an engine without the whole logit vector
                return {"replay_md": f"⚠ Replay: {page_message(e, one_line=True)}", "replay_bars": ""}
        generated = rec.generated_before(i)
        vocab, tok = logits.shape[-1], m.tokenizer
        shown = set(rec.params.changed) | set(new.changed)
        try:
            states = [replay_state(p, rec.params, rec.prompt_ids, generated, vocab, rec.seed or 0,
                                   ev.sampler_state, tok) for p in (rec.params, new)]
            ran, final_ran = m.engine.replay(logits, rec.params, states[0], ev.token_id, shown)
            again, final_again = m.engine.replay(logits, new, states[1], ev.token_id, shown)
        except TokenLabError as e:
            return {"replay_md": f"⚠ Replay: {page_message(e, one_line=True)}", "replay_bars": ""}
        return {"replay_md": (f"**Step {i}**, every token of the vocabulary through each stage; the step's "
                              "logits recomputed by one forward pass over its context (it sums in another "
                              "order than the run did: a probability can differ from the bars' by one in "
                              "the 4th decimal).\n\n"
                              + render.stages_table(ran, again, tok, ev.token_id)),
                "replay_bars": render.replay_bars(ev, final_ran, final_again, tok)}

    def _collect(self, rec: RunRecord, cancel) -> RunRecord:
        for ev in self.view(rec.model).engine.run(rec.request, cancel):
            rec.add(ev)
        return rec

    def compare_begin(self, request: gr.Request = None) -> dict:
        """At the compare click: refused (one line) as Generate is when a job is going; else
        Generate, Regenerate, compare and "Score it" are off and Stop stops the comparison."""
        self.admit(request)
        off = gr.update(interactive=False)
        return {"generate": off, "regenerate": off, "compare_button": off, "x_button": off,
                "stop_button": gr.update(interactive=True, variant="stop")}

    def compare_end(self, history=None) -> dict:
        """Once the comparison has ended: the buttons back as they are between runs."""
        on = gr.update(interactive=True)
        return {"generate": on, "regenerate": gr.update(interactive=bool(history)), "compare_button": on,
                "x_button": on, "stop_button": gr.update(interactive=False, variant="secondary")}

    def likelihood_begin(self, request: gr.Request = None) -> None:
        """At the "Score it" click: refused with its one-line reason while a job is going."""
        self.admit(request)

    @takes_controls(*(f"{name}_b" for name in SHAPING_SETTINGS), "model_b")
    def compare(self, c: Controls, *b_values, request: gr.Request = None) -> dict:
        """Run A (the page's model and settings) and B (the compare settings, and model_b: the
        same model when empty) with the same prompt and seed. Across two models whose
        tokenizers agree, both then read A's text and their distributions are compared."""
        *b_values, model_b = b_values
        try:
            cb = dataclasses.replace(c, model=model_b or c.model)
            ra = self.runs.prepare(c, None)  # the seed typed, else one chosen for both
            chosen = ra.seed
            rb = self.runs.prepare(cb, chosen, **dict(zip(SHAPING_SETTINGS, b_values)))
            with self._job(request) as cancel:
                ra, rb = self._collect(ra, cancel), self._collect(rb, cancel)
                two, two_note = self._two_models(ra, rb) if ra.model != rb.model else (None, "")
        except TokenLabError as e:
            raise page_error(e) from None
        by_text = not self._same_vocabulary(ra, rb)
        d = (text_divergence if by_text else divergence)(ra, rb)
        at_a, at_b = (None, None) if d is None else (d.a, d.b)
        differs = render.differences_md(self._differences(c, b_values, model_b))
        return {"out_a": render.highlighted_with_marker(ra, at_a), "out_b": render.highlighted_with_marker(rb, at_b),
                "compare_md": (differs + "\n\n" + render.compare_summary(ra, rb, d, by_text) + f"\n\nSeed {chosen} for both."
                               + render.two_models_md(ra, rb, two, two_note, self.view(ra.model).tokenizer)),
                # Drawn only where both read A's text (else the note says why there is nothing to draw).
                "compare_chart": gr.update(value=render.two_models_frame(two), visible=two is not None),
                "bars_a": "" if at_a is None else self._bars(ra.steps[at_a], f"A at step {at_a}", ra),
                "bars_b": "" if at_b is None else self._bars(rb.steps[at_b], f"B at step {at_b}", rb)}

    def _differences(self, c: Controls, b_values, model_b) -> list[str]:
        """Every setting in which B's controls are not A's (the page's), the model first."""
        a = {n: getattr(c, n) for n in SHAPING_SETTINGS}
        labels = {"": self.models.default}
        return render.settings_differences(a, dict(zip(SHAPING_SETTINGS, b_values)),
                                           labels.get(c.model, c.model), labels.get(model_b or c.model, model_b or c.model))

    @named_args(*SHAPING_SETTINGS, *(f"b_{n}" for n in SHAPING_SETTINGS), "model", "model_b")
    def compare_differences(self, *values, request: gr.Request = None) -> str:
        """The line above "Run A and B": what B's settings change from the page's, as they are set."""
        n = len(SHAPING_SETTINGS)
        c = Controls(**dict(zip(SHAPING_SETTINGS, values[:n])), model=values[2 * n] or "")
        return render.differences_md(self._differences(c, values[n:2 * n], values[2 * n + 1]))

    def _same_vocabulary(self, ra: RunRecord, rb: RunRecord) -> bool:
        """Whether an id is the same text in both runs' models (always so within one model)."""
        return ra.model == rb.model or same_vocabulary(self.view(ra.model).tokenizer, self.view(rb.model).tokenizer)

    def _two_models(self, ra: RunRecord, rb: RunRecord) -> tuple[TwoModels | None, str]:
        """A's text read by both models (each after its own prompt), or why it cannot be."""
        ma, mb = self.view(ra.model), self.view(rb.model)
        if not (ma.caps.internals and mb.caps.internals):
            return None, "the whole distributions are needed, which a server does not return"
        if not self._same_vocabulary(ra, rb):
            return None, ("their tokenizers differ: an id is not the same text in both, so their "
                          "distributions are over different outcomes")
        chosen = [s.token_id for s in ra.steps]
        if not chosen:
            return None, "A made no token"
        try:
            la = ma.engine.logits_along(ra.prompt_ids + chosen, len(ra.prompt_ids))
            lb = mb.engine.logits_along(rb.prompt_ids + chosen, len(rb.prompt_ids))
        except TokenLabError as e:
            return None, str(e)
        return along(la, lb, chosen), ""

    def likelihood(self, rec: RunRecord | None, step, text: str, request: gr.Request = None) -> str:
        """How likely was this text? Teacher-forced at the selected step's position."""
        if rec is None or not rec.steps:
            return "Generate first, then pick the position to score from."
        i = step_index(rec, step)
        try:
            with self._job(request):
                context, m = rec.seen_before(i), self.view(rec.model)
                if self.limits.max_score_tokens is not None:  # a shared page's bound, before the pass
                    check_unicode(text or "", "the text")
                    cap, longest = self.limits.max_score_tokens, getattr(m.tokenizer, "max_token_chars", None)
                    if longest is not None and len(text or "") > cap * longest:  # by its length, before tokenizing
                        raise InputError(score_message(cap, len(context) + len(text) // longest))
                    n = len(context) + len(m.tokenizer.encode_continuation(text or ""))
                    if (refusal := self.limits.score_refusal(n)) is not None:
                        raise InputError(refusal)
                scores = m.engine.score(context, text or "")
        except TokenLabError as e:
            raise page_error(e) from None
        return likelihood_lead(len(rec.given), i) + "\n\n" + render.likelihood_table(scores)


def likelihood_lead(n_given: int, generated: int) -> str:
    """Where "How likely was X?" scores its text, and which probabilities it gives: the model's
    raw ones (no sampling setting applies to a text scored teacher-forced, so a step's final p
    can be 0 where this one is not)."""
    parts = ["the prompt"] + ([f"the {n_given} given token{'s' * (n_given != 1)}"] if n_given else [])
    if generated:
        parts.append("the first generated token" if generated == 1 else f"the first {generated} generated tokens")
    where = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return (f"After {where} (the model's raw probabilities, before any sampling setting; the run's final "
            "p for a token can differ, even be 0):")

