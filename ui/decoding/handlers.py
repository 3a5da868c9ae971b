"""The decoding section's events: a beam search, or a speculative run, of the page's prompt and
settings, prepared as Generate prepares a run (inference.request.prepare_run). A refusal is one
line in the section's summary."""

from __future__ import annotations

import gradio as gr

from inference.decoding.drafters import make_drafter
from inference.decoding.speculative import SpecStepEvent, Speculator, timed
from inference.errors import InputError, TokenLabError
from inference.events import BeamStepEvent, StepEvent
from inference.sampling.settings import BY_NAME, FILTER_SETTINGS
from inference.serving.engine import parse_ids
from ui.base import Section, session_of, takes_controls
from ui.controls import Controls, page_message, parse_whole
from ui.decoding import render
from ui.run_state import Opened


NO_BEAMS = {"beam_state": None, "open_beam": gr.update(interactive=False),
            "beam_pick": gr.update(choices=[], value=None, interactive=False)}


class DecodingHandlers(Section):
    """A beam search or a speculative run of the page's prompt, prepared as every run (self.runs)."""

    @takes_controls()
    def beam_search(self, c: Controls, request: gr.Request = None) -> dict:
        """The page's prompt and settings with Beams above 1: the tree and the ranked beams."""
        try:
            # Beams rank by the model's own log-probabilities: the sampling stages are set aside, and said so.
            moved = [BY_NAME[n].label for n in FILTER_SETTINGS if getattr(c, n) != BY_NAME[n].neutral]
            # After a branch or an edit it continues after their given ids, read with the prompt.
            rec = self.runs.prepare(c, None, beams=True, given_in_prompt=True,
                                   **{n: BY_NAME[n].neutral for n in FILTER_SETTINGS})
            if rec.params.num_beams < 2:
                raise InputError("set Beams to 2 or more for a beam search")
            m = self.view(rec.model)
            with self._job(request) as cancel:
                steps, _, done = timed(m.engine.run(rec.request, cancel), BeamStepEvent)  # done: its BeamDoneEvent
        except TokenLabError as e:
            return {"decoding_md": page_message(e, one_line=True), "decoding_view": "", **NO_BEAMS}
        note = f" The sampling settings ({', '.join(moved)}) do not apply to a beam search." if moved else ""
        given = len(parse_ids(c.prefix_ids, "prefix ids"))
        if given:
            note += (f" It continues after the {given} given tokens of the branch (More settings: Continue after "
                     "these token ids; empty that box to search from the prompt alone).")
        beams = {"model": rec.model, "prompt_ids": list(rec.request.ids), "beams": [b.tokens for b in done.beams]}
        return {"decoding_md": render.beam_summary_md(done) + note, "decoding_view": render.beam_tree_html(steps, done),
                "beam_state": beams, "open_beam": gr.update(interactive=bool(done.beams)),
                "beam_pick": gr.update(choices=render.beam_choices(done), value=0 if done.beams else None,
                                       interactive=bool(done.beams))}

    def open_beam(self, beams: dict | None, pick, request: gr.Request = None) -> None:
        """Open a finished beam as a run: the tab's next run (chained after this) makes its tokens."""
        try:
            i = int(pick)
            tokens = beams["beams"][i]
        except (TypeError, ValueError, IndexError, KeyError):
            raise gr.Error("Run a beam search first, then pick one of its beams to open.",
                           print_exception=False) from None
        self.runs.open_next(session_of(request), Opened(beams["model"], tuple(beams["prompt_ids"]), tuple(tokens),
                                                       f"beam {i + 1} of {len(beams['beams'])}"))

    def drafter_choices(self, model, drafter=None):
        """The drafter list for the model picked (render.drafters), the drafter chosen
        kept where it is still offered."""
        try:
            choices, info = render.drafters(self.models, model)
        except TokenLabError:
            return gr.update()
        values = [v for _, v in choices]
        return gr.update(choices=choices, info=info, value=drafter if drafter in values else "prompt-lookup")

    def _draft_model(self, label: str):
        """A model the page offers, as a drafter's engine (loaded now if this is its first use)."""
        if label not in self.models.labels:
            raise InputError(f"the page offers no model {label!r} to draft with")
        return self.models.engine(label)

    @takes_controls("drafter", "exit_layer", "draft_tokens")
    def speculative(self, c: Controls, drafter, exit_layer, draft_tokens, request: gr.Request = None) -> dict:
        """The page's prompt and settings decoded speculatively: each token, proposed or not,
        accepted or rejected with its coin, p and q."""
        try:
            if not self.caps.internals:
                raise InputError("speculative decoding needs the model's own forward passes (a local engine)")
            rec = self.runs.prepare(c, None)
            m = self.view(rec.model)
            k, layer = parse_whole(draft_tokens, "proposals a round"), parse_whole(exit_layer, "the early exit's layer")
            spec = f"early-exit:{layer}" if drafter == "early-exit" else str(drafter)  # make_drafter refuses others
            made = make_drafter(spec, m.engine, len(rec.request.ids) + rec.request.max_new + k + 1,
                                models=self._draft_model)
            with self._job(request) as cancel:
                steps, rate, done = timed(Speculator(m.engine, made, k).run(rec.request, cancel), SpecStepEvent)
                # The same request decoded plainly, just after: the speed-up is measured, per run.
                plain, plain_rate, _ = ([], None, None) if cancel.is_set() else \
                    timed(m.engine.run(rec.request, cancel), StepEvent)
        except TokenLabError as e:
            return {"decoding_md": page_message(e, one_line=True), "decoding_view": ""}
        same = [s.token_id for s in steps] == [p.token_id for p in plain] if rec.params.greedy and plain else None
        return {"decoding_md": render.spec_summary_md(done, rate, plain_rate, same),
                "decoding_view": render.spec_table_html(steps)}
