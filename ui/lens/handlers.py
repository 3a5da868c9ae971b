"""The quantization lens's event: the picked model at float32 and the precisions picked, on the
section's prompt (inference/lenses/precisions.py's compare), as the session's one engine job. A
shared page bounds the precisions per visitor (server/limits.py); the server runs one lens at a
time (each holds the model twice: float32 and the precision being measured). A refusal is one
line in the section's summary."""

from __future__ import annotations

import threading
from typing import Iterator

import gradio as gr

from inference.device import available_memory_bytes
from inference.errors import InputError, TokenLabError
from inference.lenses.precisions import MAX_NEW_TOKENS, compare, source_note
from inference.lenses.quantize import TYPES
from inference.request import tokens_message
from ui.base import Section, failure_line
from ui.controls import page_message, parse_count
from ui.lens import render

BUSY = ("Another quantization lens is running on this server (each holds the model twice in memory, so they "
        "run one at a time): try again when it has ended.")


def picked_precisions(value) -> list[str]:
    """The precisions picked besides float32 (which is always measured), in the list's order."""
    names = [value] if isinstance(value, str) else list(value or [])
    if not all(isinstance(n, str) for n in names):
        raise InputError("the precisions must be names (q8_0, q5_0, q4_1, q4_0, file)")
    names = [n for n in names if n.strip().lower() != "float32"]
    if not names:
        raise InputError("pick at least one precision to compare with float32")
    order = [*TYPES, "file"]  # most bits first, whatever order they were ticked in
    return sorted(names, key=lambda n: order.index(n.strip().lower()) if n.strip().lower() in order else len(order))


class LensHandlers(Section):
    """The quantization lens of the page's picked model, one at a time on the server."""

    def __init__(self, page):
        super().__init__(page)
        self._one_at_a_time = threading.Lock()
        self.available = available_memory_bytes  # the memory a lens may take (a test's stand-in)

    def model_note(self, model) -> str:
        """The line under the section's intro for the model picked (at the build, and after a pick:
        Page.after_pick): that its float32 is a quantized file's blocks, or that the lens cannot
        read its weights. Outside the queue: never raises."""
        try:
            info = self.view(model).info
            note = None if info.model_dir is None else source_note(info.model_dir)
        except (TokenLabError, OSError, ValueError):
            return ""
        return render.model_note_md(note, info.model_dir is not None and info.capabilities.internals)

    def lens(self, model, prompt, precisions, max_new_tokens, chat, request: gr.Request = None) -> Iterator[dict]:
        """Measure each precision against float32: progress as each is done, then the table, the
        charts per step and the texts where they fork. A stop (a reload, a closed tab) ends it after
        the precision being measured; what was measured is shown."""
        try:
            picked = picked_precisions(precisions)
            refusal = self.limits.lens_refusal(len(picked))
            if refusal is not None:
                raise InputError(refusal)
            n = parse_count(max_new_tokens, "max new tokens", MAX_NEW_TOKENS, self.limits.max_new_tokens, tokens_message)
            m = self.view(model)
            model_dir = m.info.model_dir
            if model_dir is None or not m.caps.internals:
                raise InputError(render.LOCAL_ONLY)
            note = source_note(model_dir)
        except TokenLabError as e:
            yield {"lens_md": page_message(e, one_line=True), "lens_view": ""}
            return
        wanted = ["float32", *picked]
        done: list = []
        shared = False  # whether other jobs ran beside it (its tok/s then shares the CPU)
        with self._job(request) as cancel:
            if not self._one_at_a_time.acquire(blocking=False):
                yield {"lens_md": BUSY, "lens_view": ""}
                return
            results = None
            try:
                yield {"lens_md": render.progress_md(done, wanted), "lens_view": ""}
                results = compare(model_dir, prompt, picked, n, chat=bool(chat), limit=self.limits.lens_precisions,
                                  available=lambda: self.available())
                for r in results:
                    done.append(r)
                    shared = shared or len(self.registry) > 1
                    if cancel.is_set():
                        break
                    if len(done) < len(wanted):
                        yield {"lens_md": render.progress_md(done, wanted)}
            except TokenLabError as e:
                yield {"lens_md": page_message(e, one_line=True), "lens_view": ""}
                return
            except Exception as e:  # a fault: this lens ends with it, the page and its runs go on
                yield {"lens_md": f"The quantization lens failed: {failure_line(e, 'the quantization lens')}",
                       "lens_view": ""}
                return
            finally:
                if results is not None:
                    results.close()  # a precision being measured: its engine closes with it
                self._one_at_a_time.release()
        tok = m.tokenizer
        common = {r.precision: tok.continuation_text(done[0].tokens[:r.fork_step])
                  for r in done[1:] if r.fork_step is not None}
        busy = " (beside other runs on this server, which share its processor)" if shared else ""
        yield {"lens_md": render.summary_md(done, note, stopped=len(done) < len(wanted), busy_note=busy),
               "lens_view": render.view_html(done, common, tok.piece)}
