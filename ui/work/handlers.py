"""The saved work's events: the controls kept as they are typed, the work after each run (and
when a run is put on view again, or the conversation is new), everything restored at load
unless a link was opened (the link wins)."""

from __future__ import annotations

import gradio as gr

from inference.errors import TokenLabError
from ui.base import Section, named_args
from ui.controls import MORE_SETTINGS, NAMES, Controls, controls_from_query
from ui.shared.conversation import conversation_html
from ui.shared.tree import tree_html
from ui.work.saved import VERSION, controls_json, read_run, summary, work_json

# (The address then drops the link's query, so a reload keeps what the visitor does next.)
LINK_WINS = "Opened from a link: its settings replace yours, and this browser keeps them."
NOTHING = "Your settings, conversation, branches and last run are kept in this browser as you work."


def chat_history(value) -> list[dict]:
    """A saved conversation: user and assistant messages (text; an answer's bytes that make no
    character as shown, ui.chat.turn_if_answered), else none."""
    if not isinstance(value, list) or not all(
            isinstance(m, dict) and m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)
            and isinstance(m.get("shown", ""), str) for m in value):
        return []
    return [{k: m[k] for k in ("role", "content", "shown") if k in m} for m in value]


class WorkHandlers(Section):
    @named_args(*NAMES)
    def save_settings(self, *values, request: gr.Request = None) -> dict:
        """The controls, as typed: kept in the browser."""
        return {"v": VERSION, "controls": controls_json(values)}

    @named_args(*NAMES)
    def keep_link_settings(self, *values, request: gr.Request = None):
        """At load, once a link's settings are in: kept as the browser's, since the page then
        takes the query off its address (a reload must not apply the link again over newer
        work); without a link nothing changes."""
        query = getattr(request, "query_params", None) or {}
        if not any(not str(k).startswith("__") for k in query):
            return gr.skip()
        return self.save_settings(*values, request)

    @named_args("record", "branches", "history", *NAMES)
    def save_work(self, rec, nodes, history, *values, request: gr.Request = None) -> dict:
        """After a run (or a run put on view, or a new conversation): the controls and the work."""
        data, line = work_json(rec, list(nodes or []), chat_history(history))
        return {"saved_settings": {"v": VERSION, "controls": controls_json(values)}, "saved_work": data,
                "work_md": line}

    @named_args("record", "branches", *NAMES)
    def save_new_chat(self, rec, nodes, *values, request: gr.Request = None) -> dict:
        """"New conversation": the work kept without the conversation."""
        return self.save_work(rec, nodes, [], *values, request)

    def restore_work(self, settings, work, request: gr.Request = None) -> dict:
        """At load: the controls, the conversation, the branch tree and the run on view as the
        browser kept them; what cannot be shown here (another model's run, a setting out of
        range) is named in the line. A link's settings win: nothing is restored."""
        query = getattr(request, "query_params", None) or {}
        if any(not str(k).startswith("__") for k in query):
            return {"work_md": LINK_WINS}
        out, notes = {}, []
        if isinstance(work, dict) and work.get("v") == VERSION:
            out.update(self._saved_work(work, notes))
        # The controls as last kept, over those of the run on view (they may have changed since).
        if isinstance(settings, dict) and settings.get("v") == VERSION and isinstance(settings.get("controls"), dict):
            out.update(self._saved_controls(settings["controls"], notes))
        if not out:
            return {"work_md": NOTHING}
        kept = summary(work if isinstance(work, dict) else {}).replace("Kept in this browser: ", "")
        line = "Restored from this browser: " + kept
        return {**out, "work_md": line + "".join(f" {n}." for n in notes)}

    def _saved_controls(self, saved: dict, notes: list[str]) -> dict:
        c, problems = controls_from_query(saved, Controls(**vars(self.defaults)), {"max_new_tokens": self.context - 1})
        if c.model not in self.models.labels[1:]:  # the default model is "" (the picker's value)
            c.model = ""
        cap = self.limits.max_new_tokens
        if cap is not None and c.max_new_tokens > cap:
            c.max_new_tokens = cap
        notes.extend(p.replace("link parameter", "saved setting") for p in problems)
        out = dict(zip(NAMES, c.values()))
        if any(getattr(c, n) != getattr(self.defaults, n) for n in MORE_SETTINGS):
            out["more"] = gr.update(open=True)
        if c.constraint:
            out["constrain_box"] = gr.update(open=True)
        if c.model:  # Generate waits for the picker's event (the model's first load, its mode)
            out["generate"] = gr.update(interactive=False)
        return out

    def _saved_work(self, work: dict, notes: list[str]) -> dict:
        history = chat_history(work.get("history"))
        out = {"history": history, "conversation": conversation_html(history),
               "regenerate": gr.update(interactive=bool(history))}
        runs, records = work.get("runs") if isinstance(work.get("runs"), list) else [], {}

        def record(i):
            if i not in records:
                try:
                    data = runs[i]
                    rec = read_run(data, lambda c, seed, h: self.runs.prepare(Controls(**c), seed, h),
                                   self.view(data["controls"].get("model", "")).tokenizer.vocab_size)
                except (TokenLabError, IndexError, TypeError, KeyError, AttributeError) as e:
                    rec = None
                    notes.append(f"A saved run was not restored: {e}" if isinstance(e, TokenLabError)
                                 else "A saved run could not be read")
                records[i] = rec
            return records[i]

        tree = work.get("tree") if isinstance(work.get("tree"), list) else []
        try:
            nodes = [{**{k: n[k] for k in ("parent", "at", "token", "piece", "raw", "final", "prefix")},
                      "record": record(n["run"])} for n in tree]
        except (KeyError, TypeError):
            nodes = []
        if any(n["record"] is None for n in nodes):
            nodes = []
            notes.append("The branch tree was not restored")
        view = work.get("view")
        rec = record(view) if isinstance(view, int) else None
        if rec is None:
            return out
        viewing = next((k for k, n in enumerate(nodes) if n["record"] is rec), None)
        return {**out, **self.runs.show(rec), "branches": nodes, "branch_view": tree_html(nodes, viewing),
                "edit_box": rec.answer_text}
