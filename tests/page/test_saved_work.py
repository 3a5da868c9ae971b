"""A page that keeps your work (ui/work): the controls, the conversation, the branch tree and the
run on view go into the browser's storage as JSON and come back as they were; a link's settings
win; what cannot be shown here is named, never shown wrong; a tree too large is said to be left out."""

import json
from types import SimpleNamespace


from ui.controls import NAMES, Controls
from ui.shared.view import output_html
from ui.work import saved
from ui.work.handlers import LINK_WINS

REQ = SimpleNamespace(session_hash="work", query_params={})
SETTINGS = dict(prompt="The quick brown fox", temperature=1.0, top_k=20, max_new_tokens=6, seed="9")


def run(h, c: Controls, history=None, nodes=()):
    rec = list(h.run.generate(*c.values(), REQ, history))[-1]["record"]
    after = h.run.after_run(rec, history, REQ)
    return rec, h.branches.grow_tree(rec, list(nodes))["branches"], after.get("history", history)


def through_browser(value):
    """What the browser hands back: the JSON it stored."""
    return json.loads(json.dumps(value))


def test_the_work_comes_back_as_it_was(h, tiny_engine):
    root, nodes, _ = run(h, Controls(**SETTINGS))
    out = h.branches.branch(root, nodes, SimpleNamespace(value=f"2:{root.steps[2].top[1].id}"))
    branch, nodes, _ = run(h, Controls(*[out[n] for n in NAMES]), nodes=out["branches"])
    typed = Controls(**{**SETTINGS, "prompt": "Typed after the runs", "top_p": 0.8})
    kept = h.work.save_work(branch, nodes, [], *typed.values(), REQ)
    assert "a tree of 2 branches" in kept["work_md"] and "the run on view" in kept["work_md"]
    back = h.work.restore_work(through_browser(kept["saved_settings"]), through_browser(kept["saved_work"]), REQ)
    rec = back["record"]
    assert rec is not branch and rec.prompt_ids == branch.prompt_ids and rec.given == branch.given
    assert [s.token_id for s in rec.steps] == [s.token_id for s in branch.steps]
    assert [[c.prob for c in s.top] for s in rec.steps] == [[c.prob for c in s.top] for s in branch.steps]
    assert back["output"] == output_html(branch, tiny_engine.tokenizer)
    assert back["bars"] == h.run.select_step(branch, len(branch.steps) - 1)
    assert [n["parent"] for n in back["branches"]] == [None, 0] and back["branches"][1]["record"] is rec
    assert "tl-viewing" in back["branch_view"] and back["edit_box"] == branch.answer_text
    # The controls as last typed, over the run's own.
    assert back["prompt"] == "Typed after the runs" and back["top_p"] == 0.8
    assert back["work_md"].startswith("Restored from this browser")


def test_a_chat_is_kept_and_a_new_conversation_forgets_it(h):
    c = Controls(**{**SETTINGS, "mode": "chat", "prompt": "Hello"})
    rec, nodes, history = run(h, c, [])
    assert len(history) == 2
    kept = h.work.save_work(rec, nodes, history, *c.values(), REQ)
    back = h.work.restore_work(kept["saved_settings"], through_browser(kept["saved_work"]), REQ)
    assert back["history"] == history and "Hello" in back["conversation"] and back["regenerate"]["interactive"]
    assert "1 chat turn" in back["work_md"]
    new = h.work.save_new_chat(rec, nodes, *c.values(), REQ)
    assert through_browser(new["saved_work"])["history"] == []


def test_a_link_wins_and_nothing_saved_is_the_defaults(h):
    rec, nodes, _ = run(h, Controls(**SETTINGS))
    kept = h.work.save_work(rec, nodes, [], *Controls(**SETTINGS).values(), REQ)
    link = SimpleNamespace(session_hash="work", query_params={"prompt": "From a link"})
    assert h.work.restore_work(kept["saved_settings"], kept["saved_work"], link) == {"work_md": LINK_WINS}
    assert set(h.work.restore_work(None, None, REQ)) == {"work_md"}
    assert set(h.work.restore_work({}, {}, REQ)) == {"work_md"}  # what "Clear saved work" leaves


def test_what_cannot_be_shown_here_is_named(h):
    rec, nodes, _ = run(h, Controls(**SETTINGS))
    kept = through_browser(h.work.save_work(rec, nodes, [], *Controls(**SETTINGS).values(), REQ))
    work = kept["saved_work"]
    work["runs"][0]["prompt_ids"] = [1, 2, 3]  # made by another tokenizer
    back = h.work.restore_work({**kept["saved_settings"], "controls": {"temperature": 9, "prompt": "x"}}, work, REQ)
    assert "record" not in back and "prompt gives other tokens here" in back["work_md"]
    assert "The branch tree was not restored" in back["work_md"]
    assert "Ignored saved setting `temperature`" in back["work_md"] and back["prompt"] == "x"
    assert back["temperature"] == h.page.defaults.temperature
    work["runs"][0] = {"steps": "garbage"}
    assert "A saved run could not be read" in h.work.restore_work(None, work, REQ)["work_md"]


def test_a_tree_too_large_keeps_the_run_on_view_and_says_so(h, monkeypatch):
    root, nodes, _ = run(h, Controls(**SETTINGS))
    out = h.branches.branch(root, nodes, SimpleNamespace(value=f"1:{root.steps[1].top[1].id}"))
    branch, nodes, _ = run(h, Controls(*[out[n] for n in NAMES]), nodes=out["branches"])
    whole = len(json.dumps(saved.work_json(branch, nodes, [])[0]))
    monkeypatch.setattr(saved, "MAX_CHARS", whole - 1)
    data, line = saved.work_json(branch, nodes, [])
    assert data["tree"] == [] and len(data["runs"]) == 1 and "only the run on view is kept" in line
    monkeypatch.setattr(saved, "MAX_CHARS", 10)
    data, line = saved.work_json(branch, nodes, [])
    assert data["runs"] == [] and "is not kept" in line
