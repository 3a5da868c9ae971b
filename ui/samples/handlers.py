"""The many-samples panel's events: N samples of the page's prompt and settings in one batch
(also the /samples API), and its buttons while they run."""

from __future__ import annotations

from typing import Iterator

import gradio as gr

from inference.errors import TokenLabError
from inference.samples import MAX_SAMPLES
from ui.base import Section, failure_line, page_error, takes_controls
from ui.controls import Controls, parse_count
from server.limits import samples_message
from ui.samples import render
from ui.streaming import EventPump

SAMPLE_TOP = 20  # candidates each step reports: the first step's table lists these
UPDATE_S = 0.5  # the panel's progress line, at most twice a second


class SampleHandlers(Section):
    @takes_controls("n_samples", after=("history",))
    def samples(self, c: Controls, n_samples, request: gr.Request = None, history=None) -> Iterator[dict]:
        """N samples of the prompt with the page's settings, seeds s..s+N-1 (s: the seed box, else
        random), as N runs in one batch; the panel shows the progress, then the distinct texts
        and the first step against the model. Stop ends them all; what ended is shown."""
        try:
            n = parse_count(n_samples, "the number of samples", MAX_SAMPLES, self.limits.max_samples, samples_message)
            rec = self.runs.prepare(c, None, history)  # the checks of a run, its token cap
        except TokenLabError as e:
            raise page_error(e) from None
        m = self.view(rec.model)
        batch = render.SampleBatch(n, rec.seed)
        with self._job(request) as cancel:
            pump = EventPump(m.engine.generate_many(rec.prompt_ids, rec.params, n, SAMPLE_TOP, cancel), cancel)
            try:
                yield {"samples_md": render.progress_md(batch), "samples_outcomes": "", "samples_first": "",
                       "samples_data": None}
                for events in pump.batches(lambda: UPDATE_S):
                    for k, ev in events:
                        batch.add(k, ev)
                    yield {"samples_md": render.progress_md(batch)}
            except Exception as e:  # the engine failed mid-way: the panel says so, the caller gets it
                line = failure_line(e, "samples")
                yield {"samples_md": render.failed_md(batch, line)}
                raise gr.Error(f"The samples failed: {line}", print_exception=False) from None
            finally:
                pump.close()
        piece = m.tokenizer.piece
        yield {"samples_md": render.summary_md(batch), "samples_outcomes": render.outcomes_html(batch),
               "samples_first": render.first_step_html(batch, piece),
               "samples_data": render.samples_json(batch, piece)}

    def samples_started(self) -> dict:
        """At the click: the button off and the panel's Stop on while the samples run."""
        return {"samples_button": gr.update(interactive=False),
                "samples_stop": gr.update(interactive=True, variant="stop")}

    def samples_ended(self) -> dict:
        return {"samples_button": gr.update(interactive=True),
                "samples_stop": gr.update(interactive=False, variant="secondary")}
