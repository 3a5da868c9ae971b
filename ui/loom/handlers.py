"""The loom's events: grow the tree of continuations from a step of the run on view (or its end, or
the prompt) through the engine's scheduler, a level a step (Engine.expand_tree); a leaf clicked
continues as a run (the controls set as a branch's, then the run section's chain: the one prepared
request); the tree kept in the browser, as a download and in a link. A shared page bounds a tree's
nodes per visitor (server/limits.py) and says the bound when it refuses."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import gradio as gr

from inference.decoding.tree import MAX_DEPTH, MAX_NODES, TreeLimits, check_tree
from inference.errors import InputError, TokenLabError, shown
from inference.events import TreeDoneEvent, TreeStepEvent
from ui.base import Section, named_args, session_of, step_index, takes_controls
from ui.controls import NAMES, Controls, controls_from_query, parse_whole, share_url, unquoted
from ui.loom import render, store
from ui.shared.conversation import conversation_html

FROM_STEP, FROM_END, FROM_PROMPT = "the step on view", "the run's end", "the prompt"
FROM = (FROM_STEP, FROM_END, FROM_PROMPT)
LOOM_OUTPUTS = ("loom_md", "loom_view", "loom_state", "loom_saved", "loom_links")
# At load also the controls, set to the tree's own choice of children.
RESTORE_OUTPUTS = (*LOOM_OUTPUTS, "loom_p", "loom_k", "loom_depth", "loom_nodes", "loom_panel")


def whole(value, what: str) -> int:
    """A box's whole number (empty: 0)."""
    return 0 if value in (None, "") else parse_whole(value, what)


def whole_or_none(value, what: str) -> int | None:
    """A box's whole number, None for 0 or empty (that way of choosing children is off)."""
    return whole(value, what) or None


def prob_or_none(value) -> float | None:
    if value in (None, ""):
        return None
    try:
        p = float(value)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"the probability threshold must be a number, got {shown(value)}") from None
    return p or None


def context_of(tokenizer, prompt_ids: list[int], given: list[int], chars: int = 60) -> str:
    """The end of the text a tree grows after, as its root shows it."""
    text = tokenizer.decode(prompt_ids) + tokenizer.continuation_text(given)
    return text if len(text) <= chars else "…" + text[-chars:]


class LoomHandlers(Section):
    def tree_limits(self) -> TreeLimits:
        """What one tree may hold here: the engine's bounds, a shared page's node budget within them."""
        cap = self.limits.max_tree_nodes
        if cap is None or cap >= MAX_NODES:
            return TreeLimits(MAX_DEPTH, MAX_NODES, "the engine")
        return TreeLimits(MAX_DEPTH, cap, "this shared page")

    def _point(self, c: Controls, rec, history, step, where: str):
        """(model, prompt ids, given ids, controls, seed, history, words): where the tree grows
        from. A run on view that has ended: its prompt, its given ids and its tokens before `step`
        (or all of them); else the page's prompt, prepared as Generate prepares a run."""
        if where != FROM_PROMPT and rec is not None and rec.done is not None and rec.controls is not None and rec.steps:
            i = len(rec.steps) if where == FROM_END else step_index(rec, step)
            given = rec.generated_before(i)
            eos = getattr(self.view(rec.model).engine, "eos_ids", ())
            if given and given[-1] in eos and len(given) > len(rec.given):
                raise InputError("the run ended with its end-of-sequence token: nothing follows it; grow from a "
                                 "step on view instead")
            said = f"step {i} of the run on view" if i < len(rec.steps) else "the end of the run on view"
            return rec.model, list(rec.prompt_ids), given, rec.controls, rec.seed, list(rec.history), said
        prepared = self.runs.prepare(c, None, history)
        return (prepared.model, list(prepared.prompt_ids), list(prepared.given), c, prepared.seed,
                list(prepared.history), "the prompt" + (" and its given ids" if prepared.given else ""))

    @takes_controls("record", "history", "step", "loom_from", "loom_p", "loom_k", "loom_depth", "loom_nodes")
    def grow(self, c: Controls, rec, history, step, where, p, k, depth, nodes,
             request: gr.Request = None) -> Iterator[dict]:
        """The tree, a level at a time as the scheduler computes it, then kept (the state, the
        browser, the download). A refusal (a bound, a setting) is the summary's one line."""
        try:
            model, prompt_ids, given, controls, seed, turns, said = self._point(c, rec, history, step, where)
            m = self.view(model)
            if not m.caps.tree:
                raise InputError("this engine cannot grow a tree (it does not give the model's whole distribution "
                                 "at any point): the loom needs a local engine")
            shape = dict(depth=whole(depth, "the depth"), max_nodes=whole(nodes, "the node budget"),
                         top_k=whole_or_none(k, "top k"), min_prob=prob_or_none(p))
            check_tree(shape["depth"], shape["max_nodes"], shape["top_k"], shape["min_prob"], self.tree_limits())
        except TokenLabError as e:
            yield {"loom_md": f"⚠ {unquoted(e)[:1].upper()}{unquoted(e)[1:]}"}
            return
        context = context_of(m.tokenizer, prompt_ids, given)
        root = {"id": 0, "parent": None, "token_id": None, "depth": 0, "logprob": 0.0, "path_logprob": 0.0,
                "greedy": True, "eos": False, "expanded": True, "unexpanded_mass": None, "piece": ""}
        grown, pools, done = [root], [], None
        try:
            with self._job(request) as cancel:
                for ev in m.engine.expand_tree(prompt_ids, given, limits=self.tree_limits(), cancel=cancel, **shape):
                    if isinstance(ev, TreeStepEvent):
                        grown += [n.to_json() for n in ev.nodes]
                        pools.append(render.pool_line(ev))
                        yield {"loom_md": "<br>".join(pools), "loom_view": render.tree_html(grown, context, growing=True)}
                    elif isinstance(ev, TreeDoneEvent):
                        done = ev
        except TokenLabError as e:
            yield {"loom_md": f"⚠ {unquoted(e)}"}
            return
        if done is None:  # stopped before its first level (its job started stopped)
            yield {"loom_md": "Stopped before the tree grew a level.", "loom_view": render.tree_html([])}
            return
        tree = store.tree_json(done, model=model, prompt_ids=prompt_ids, given=given,
                               controls=dict(zip(NAMES, controls.values())), seed=seed, history=turns, where=said)
        tree["context"] = context
        yield self._shown(tree, pools, owner=getattr(request, "username", None) or None)

    def _shown(self, tree: dict, pools=(), note: str = "", owner=None, download: bool = True) -> dict:
        """A tree on view: its summary, its picture, kept in the state and the browser, and its
        download (one at load waits for "Link and download": a reload writes no file)."""
        download = self._download(tree, owner) if download else None
        return {"loom_md": render.summary_html(tree, pools, note),
                "loom_view": render.tree_html(tree["nodes"], tree.get("context", "")),
                "loom_state": tree, "loom_saved": tree, "loom_links": render.links_html(download, None)}

    def _download(self, tree: dict, owner) -> str:
        return self.runs.downloads.write(f"loom-{len(tree['nodes']) - 1}-nodes.json", store.download_text(tree), owner)

    def continue_leaf(self, tree, evt: gr.SelectData, request: gr.Request = None) -> dict:
        """A leaf clicked: the controls set to the run the tree grew from (its model, settings and
        seed field), continuing after the tree's given ids and the leaf's path as token ids, as a branch
        does; the run section's chain then runs it. A page error if it cannot run here."""
        try:
            node = tree["nodes"][int(evt.value)]
            assert node["parent"] is not None and not node["expanded"]
        except (TypeError, ValueError, AttributeError, IndexError, KeyError, AssertionError):
            raise gr.Error("Grow a tree, then click one of its leaves to continue it.", print_exception=False) from None
        if node["eos"]:
            raise gr.Error("This leaf ends the text (its end-of-sequence token): there is nothing after it to "
                           "continue.", print_exception=False)
        path, n = [], node
        while n["parent"] is not None:
            path.append(n["token_id"])
            n = tree["nodes"][n["parent"]]
        given = [*tree["given"], *path[::-1]]
        # The seed as its field was (empty: random stays random): the tree's run's drawn seed written
        # into the field would fix every later run's, unsaid.
        c = Controls(**{**tree["controls"], "prefix_ids": ",".join(map(str, given))})
        try:  # the checks the run's own begin makes, and that it reads what the tree grew after
            rec = self.runs.prepare(c, None, list(tree["history"]))
        except TokenLabError as e:
            raise gr.Error(f"This leaf cannot be continued here: {unquoted(e)}", print_exception=False) from None
        if rec.prompt_ids != tree["prompt_ids"] or rec.given != given:
            raise gr.Error("This leaf cannot be continued here: its prompt gives other tokens now (another model "
                           "or tokenizer); grow the tree again.", print_exception=False)
        history = list(tree["history"])
        return {**dict(zip(NAMES, c.values())), "history": history, "conversation": conversation_html(history)}

    def link(self, tree, base, request: gr.Request = None) -> str:
        """The links line: the download, and a link that opens the page with the tree's prompt,
        settings and given ids and the tree itself (past MAX_LINK_CHARS: said, the download
        instead)."""
        if not isinstance(tree, dict) or not tree.get("nodes"):
            return render.links_html(None, None)
        controls = Controls(**{**tree["controls"], "prefix_ids": ",".join(map(str, tree["given"]))})
        base = base if isinstance(base, str) and len(base) <= 2048 else ""
        model = "" if tree["model"] == self.models.default else tree["model"]
        url = share_url(base, replace(controls, model=model), self.defaults,
                        seed=None if tree["seed"] is None else str(tree["seed"]))
        url += "&loom=" + store.link_param(tree)
        download = self._download(tree, getattr(request, "username", None) or None)
        if len(url) > store.MAX_LINK_CHARS:
            return render.links_html(download, None, too_long=len(url))
        return render.links_html(download, url)

    @named_args("loom_saved")
    def restore(self, saved, request: gr.Request = None) -> dict:
        """At load: a link's tree (its prompt and settings are the link's controls), else the tree
        kept in this browser; one that cannot be shown here says why in the summary."""
        query = dict(getattr(request, "query_params", {}) or {})
        try:
            if "loom" in query:
                c, _ = controls_from_query(query, Controls(**vars(self.defaults)), {"max_new_tokens": self.context - 1})
                if c.model and c.model not in self.models.labels:
                    raise InputError(f"the link's model {shown(c.model)} is not offered here")
                prepared = self.runs.prepare(c, None)
                m = self.view(prepared.model)
                tree = store.from_link_param(str(query["loom"]), model=prepared.model,
                                             prompt_ids=prepared.prompt_ids, given=prepared.given,
                                             controls=dict(zip(NAMES, c.values())), seed=prepared.seed, history=[],
                                             piece=m.tokenizer.piece, vocab=m.tokenizer.vocab_size)
                tree["context"] = context_of(m.tokenizer, prepared.prompt_ids, prepared.given)
                note = "Opened from a link: the tree as the link gives it (grow it again to compute it here)."
            elif saved is not None:
                if not isinstance(saved, dict) or saved.get("model") not in self.models.labels:
                    raise InputError("the kept tree was grown on a model this page does not offer")
                tree = store.checked(saved, self.view(saved["model"]).tokenizer.vocab_size)
                note = "Restored from this browser."
            else:
                return {}
        except TokenLabError as e:
            return {"loom_md": f"⚠ The tree was not restored: {unquoted(e)}.", "loom_saved": None}
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):  # (a load event never raises)
            return {"loom_md": "⚠ The tree was not restored: it could not be read.", "loom_saved": None}
        shape = {"loom_p": tree["min_prob"] or 0, "loom_k": tree["top_k"] or 0}
        if isinstance(tree["depth"], int) and isinstance(tree["max_nodes"], int):
            shape.update(loom_depth=min(max(tree["depth"], 1), MAX_DEPTH),
                         loom_nodes=min(max(tree["max_nodes"], 1), self.tree_limits().nodes))
        # A link's tree is what the link is for: its section opens (one kept in this browser stays folded).
        opened = {"loom_panel": gr.update(open=True)} if "loom" in query else {}
        return {**self._shown(tree, note=note, download=False), "loom_saved": gr.skip(), **shape, **opened}
