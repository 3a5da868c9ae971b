"""The loom's handlers (ui/loom): a tree grown from a step of the run on view through the
scheduler, each node's probability, its path's and the mass its children left out checked against
separate forward passes (Engine.step_logits over the node's own text) and each leaf's path against
one pass over the whole text (Engine.score_ids); a leaf continued as a run through the one
prepared request; a shared page's bound on nodes refused, said; the tree kept in the browser and in
a link, read back as it was, and a changed one refused."""

import math
from types import SimpleNamespace
from urllib.parse import parse_qsl, urlsplit

import gradio as gr
import pytest

from server.limits import Limits
from ui.controls import Controls
from ui.format import fmt_p
from ui.loom import store
from ui.loom.handlers import FROM_END, FROM_PROMPT, FROM_STEP

PROMPT = "The quick brown fox jumps over"


def req(name: str, **kw):
    return SimpleNamespace(session_hash=name, username=None, **kw)


def ran(h, c: Controls, r):
    rec = list(h.run.generate(*c.values(), r))[-1]["record"]
    assert rec.done is not None and len(rec.steps) >= 3
    return rec


def grow(h, c, rec, r, step=2, where=FROM_STEP, p=0, k=3, depth=3, nodes=60):
    return list(h.loom.grow(*c.values(), rec, [], step, where, p, k, depth, nodes, r))


def path(nodes, n):
    out = []
    while n["parent"] is not None:
        out.append(n["token_id"])
        n = nodes[n["parent"]]
    return out[::-1]


@pytest.fixture
def grown(h, tiny_engine):
    r = req("loom")
    c = Controls(prompt=PROMPT, max_new_tokens=5, temperature=0.0, seed="7")
    rec = ran(h, c, r)
    return h, c, rec, r, grow(h, c, rec, r)


def test_every_node_against_a_forward_pass_of_its_own_and_each_leaf_against_the_whole_text(grown, tiny_engine):
    h, c, rec, r, out = grown
    e = tiny_engine
    tree = out[-1]["loom_state"]
    assert out[-1]["loom_saved"] is tree  # kept in the browser as it ends
    # Streamed a level a step (each with its pool line), then the whole tree.
    levels = [o for o in out[:-1] if "loom_view" in o]
    assert len(levels) == tree["steps"] == 3 and "Level 3:" in levels[-1]["loom_md"]
    assert tree["prompt_ids"] == rec.prompt_ids and tree["given"] == rec.generated_before(2)
    assert tree["from"] == "step 2 of the run on view" and "of the run on view" in out[-1]["loom_md"]
    ids = tree["prompt_ids"] + tree["given"]
    nodes = tree["nodes"]
    checked = 0
    for n in nodes:
        kids = [k for k in nodes if k["parent"] == n["id"]]
        if not n["expanded"]:
            assert not kids and (n["depth"] == 3 or n["eos"])
            continue
        p = e.step_logits(ids + path(nodes, n)).double().softmax(-1)  # a pass of its own (float64 softmax)
        for k in kids:  # the scheduler's batched step and the one-off pass: within 1e-4
            assert abs(k["prob"] - float(p[k["token_id"]])) < 1e-4
            assert abs(k["path_prob"] - n["path_prob"] * float(p[k["token_id"]])) < 1e-4
            assert k["greedy"] == (n["greedy"] and k["token_id"] == int(p.argmax()))
        assert abs(n["unexpanded_mass"] - (1 - sum(float(p[k["token_id"]]) for k in kids))) < 1e-4
        top = p.argsort(descending=True)[:3].tolist()
        assert {k["token_id"] for k in kids} == set(top)  # top k 3, no threshold
        checked += 1
    assert checked >= 2
    # A leaf's path p against one pass over the whole text (its tokens' log p summed).
    leaves = [n for n in nodes[1:] if not n["expanded"]]
    for leaf in leaves[:3]:
        scored = e.score_ids(ids + path(nodes, leaf), top_n=0)[len(ids):]
        assert abs(sum(s.logprob for s in scored) - leaf["path_logprob"]) < 1e-4
    # The greedy path is the run's own (the run was greedy): its tokens after step 2.
    greedy = sorted((n for n in nodes[1:] if n["greedy"]), key=lambda n: n["depth"])
    assert [n["token_id"] for n in greedy] == [s.token_id for s in rec.steps[2:2 + len(greedy)]]
    # The picture: every node with its p and path p, the greedy ones marked, the left-out mass under each
    # expanded node, every leaf a button that continues it but those that end the text.
    view = out[-1]["loom_view"]
    assert view.count("class='loom-node loom-greedy") == len(greedy)
    assert view.count("loom-rest") == sum(1 for n in nodes if n["expanded"])
    assert view.count("data-pick=") == sum(not n["eos"] for n in leaves) and any(n["eos"] for n in leaves)
    for n in nodes[1:]:
        assert f"p {fmt_p(n['prob'])}" in view and f"path p {fmt_p(n['path_prob'])}" in view
    for n in nodes:
        if n["expanded"]:
            assert f"p {fmt_p(n['unexpanded_mass'])}" in view


def test_a_leaf_continues_as_a_run_with_its_path_given(grown, tiny_engine):
    h, c, rec, r, out = grown
    tree = out[-1]["loom_state"]
    leaf = next(n for n in tree["nodes"][1:] if not n["expanded"] and not n["greedy"])
    controls = h.loom.continue_leaf(tree, SimpleNamespace(value=str(leaf["id"])), r)
    given = tree["given"] + path(tree["nodes"], leaf)
    assert controls["prefix_ids"] == ",".join(map(str, given)) and controls["seed"] == str(rec.seed)
    again = Controls(**{n: controls[n] for n in Controls.names()})
    begun = h.run.begin(*again.values(), r)  # the run section's chain: the one prepared request
    assert "record" in begun, begun.get("status")
    cont = [o for o in h.run.generate_on_page(*again.values(), r) if "record" in o][-1]["record"]
    assert cont.prompt_ids == rec.prompt_ids and cont.given == given and cont.seed == rec.seed
    # Its first step reads the leaf's path: its bars are the model's distribution after it.
    p = tiny_engine.step_logits(cont.prompt_ids + given).double().softmax(-1)
    assert cont.steps[0].token_id == int(p.argmax())
    assert abs(cont.steps[0].raw_prob - float(p.max())) < 1e-4
    with pytest.raises(gr.Error, match="click one of its leaves"):
        h.loom.continue_leaf(tree, SimpleNamespace(value="0"), r)  # the root is no leaf
    # A leaf that ends the text: nothing to continue (a run would write past the end), and not offered.
    from ui.loom.render import tree_html
    ended = {**tree, "nodes": [{**n, "eos": n["id"] == leaf["id"]} for n in tree["nodes"]]}
    with pytest.raises(gr.Error, match="ends the text"):
        h.loom.continue_leaf(ended, SimpleNamespace(value=str(leaf["id"])), r)
    view = tree_html(ended["nodes"], "")
    assert f"data-pick='{leaf['id']}'" not in view and "data-pick=" in view


def test_a_leaf_of_a_random_run_continues_with_a_random_seed(h, tiny_engine):
    # The seed field as it was: the tree's run's drawn seed written into it would fix every later run's.
    r = req("loom-random")
    c = Controls(prompt=PROMPT, max_new_tokens=3, seed="")
    rec = ran(h, c, r)
    tree = grow(h, c, rec, r, depth=1, k=2)[-1]["loom_state"]
    assert tree["seed"] == rec.seed and tree["controls"]["seed"] == ""
    controls = h.loom.continue_leaf(tree, SimpleNamespace(value=str(tree["nodes"][1]["id"])), r)
    assert controls["seed"] == "" and controls["prefix_ids"]


def test_from_the_end_and_from_the_prompt(h, tiny_engine):
    r = req("loom-points")
    c = Controls(prompt=PROMPT, max_new_tokens=3, temperature=0.0, seed="2")
    rec = ran(h, c, r)
    end = grow(h, c, rec, r, where=FROM_END, depth=1, k=2, p=0)[-1]["loom_state"]
    assert end["given"] == [s.token_id for s in rec.steps] and "the end of the run on view" in end["from"]
    first = grow(h, c, None, r, where=FROM_STEP, depth=1, k=2, p=0)[-1]["loom_state"]  # no run: the prompt
    assert first["given"] == [] and first["prompt_ids"] == tiny_engine.prompt_ids(PROMPT)
    assert [n["token_id"] for n in first["nodes"][1:]][0] == rec.steps[0].token_id  # greedy's first token
    assert grow(h, c, rec, r, where=FROM_PROMPT, depth=1, k=2, p=0)[-1]["loom_state"]["from"] == "the prompt"
    # A threshold alone: every token the model gives at least p there, no other.
    above = grow(h, c, rec, r, where=FROM_PROMPT, depth=1, k=0, p=0.02)[-1]["loom_state"]
    p = tiny_engine.step_logits(above["prompt_ids"]).double().softmax(-1)
    want = {t for t in range(len(p)) if float(p[t]) >= 0.02 + 1e-4}
    got = {n["token_id"] for n in above["nodes"][1:]}
    assert want <= got and all(float(p[t]) >= 0.02 - 1e-4 for t in got) and above["min_prob"] == 0.02


def test_a_shared_page_bounds_the_nodes_and_says_so(tiny_engine):
    from ui.handlers import Handlers
    h = Handlers(tiny_engine, top_n=5, limits=Limits.shared())
    r = req("loom-shared")
    c = Controls(prompt=PROMPT, max_new_tokens=3)
    out = list(h.loom.grow(*c.values(), None, [], 0, FROM_PROMPT, 0.05, 3, 3, 65, r))
    assert len(out) == 1 and "nodes must be from 1 to 64 (this shared page's bound), got 65" in out[0]["loom_md"]
    assert tiny_engine.active_runs == 0 and "loom_state" not in out[0]
    out = list(h.loom.grow(*c.values(), None, [], 0, FROM_PROMPT, 0, 0, 3, 10, r))
    assert "threshold, the top k, or both" in out[0]["loom_md"]
    done = list(h.loom.grow(*c.values(), None, [], 0, FROM_PROMPT, 0.01, 0, 4, 64, r))[-1]["loom_state"]
    assert len(done["nodes"]) - 1 <= 64
    from ui.run.render import limits_markdown
    assert "at most 64 nodes in a loom's tree" in limits_markdown(h.page.limits)
    import app  # the flag sets it; 0 turns it off (the engine's own bound, 256, then)
    assert app.limits_for(app.parse_args(["--share", "--max-tree-nodes", "12"], environ={})).max_tree_nodes == 12
    assert Limits.shared(max_tree_nodes=0).max_tree_nodes is None


def test_the_tree_is_kept_in_the_browser_and_a_link_and_read_back_as_it_was(grown, tiny_engine, monkeypatch):
    h, c, rec, r, out = grown
    tree = out[-1]["loom_state"]
    # The browser's copy, at load: the same picture.
    back = h.loom.restore(tree, req("loom-reload", query_params={}))
    assert back["loom_view"] == out[-1]["loom_view"] and "Restored from this browser" in back["loom_md"]
    assert back["loom_state"]["nodes"] == tree["nodes"]
    # A link: the tree's prompt, settings and given ids, and the tree; opened, the same nodes.
    links = h.loom.link(tree, "http://127.0.0.1:7860/")
    url = links.split("id='loom-link-text' value='")[1].split("'")[0].replace("&amp;", "&")
    assert "loom-download" in links and len(url) <= store.MAX_LINK_CHARS
    query = dict(parse_qsl(urlsplit(url).query))
    assert query["prefix_ids"] == ",".join(map(str, tree["given"]))
    shared = h.share.restore(req("loom-link", query_params=query))
    assert shared["notice"] == ""  # the loom's parameter is not an unknown one
    opened = h.loom.restore(None, req("loom-link", query_params=query))
    assert "Opened from a link" in opened["loom_md"]
    for a, b in zip(opened["loom_state"]["nodes"], tree["nodes"], strict=True):
        assert {k: a[k] for k in store.NODE_KEYS} == {k: b[k] for k in store.NODE_KEYS}
    # A changed copy is refused in one line, never shown.
    bad = {**tree, "nodes": [dict(n) for n in tree["nodes"]]}
    bad["nodes"][2]["token_id"] = tiny_engine.vocab_size
    refused = h.loom.restore(bad, req("loom-bad", query_params={}))
    assert refused["loom_md"].startswith("⚠ The tree was not restored") and "loom_view" not in refused
    forged = {**tree, "nodes": [dict(n) for n in tree["nodes"]]}
    forged["nodes"][1]["logprob"] = math.log(0.99)  # its path's log p no longer the sum along it
    assert "not restored" in h.loom.restore(forged, req("loom-bad", query_params={}))["loom_md"]
    cut = {**query, "loom": query["loom"][:-12]}
    assert "could not be read" in h.loom.restore(None, req("loom-cut", query_params=cut))["loom_md"]
    # Past a link's length: said, the download instead.
    monkeypatch.setattr(store, "MAX_LINK_CHARS", 100)
    long = h.loom.link(tree, "http://127.0.0.1:7860/")
    assert "too large for a link" in long and "loom-download" in long and "loom-link-text" not in long


def test_stop_ends_a_growing_tree_within_its_level_and_the_section_has_it(h, tiny_engine, hold):
    from concurrent.futures import ThreadPoolExecutor
    r = req("loom-stop")
    c = Controls(prompt=PROMPT, max_new_tokens=3)
    held = hold(tiny_engine)
    with ThreadPoolExecutor(1) as pool:  # top 2 to depth 4: 30 nodes unstopped
        growing = pool.submit(lambda: list(h.loom.grow(*c.values(), None, [], 0, FROM_PROMPT, 0, 2, 4, 64, r)))
        held.step(1)  # the first level made, the second held
        h.run.stop_job(r)  # the loom's Stop: the session's one job
        out = growing.result(timeout=240)
    tree = out[-1]["loom_state"]
    assert "was stopped" in out[-1]["loom_md"] and tree["reason"] == "cancelled", out[-1]["loom_md"]
    assert 1 < len(tree["nodes"]) - 1 < 30 and max(n["depth"] for n in tree["nodes"]) < 4
    assert tiny_engine.active_runs == 0 and len(h.page.registry) == 0
    from ui.layout import build_ui
    demo = build_ui(tiny_engine, h)
    stops = [f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "stop_job"
             and any(getattr(demo.blocks.get(b), "elem_id", None) in ("loom-stop", "lens-stop") for b, _ in f.targets)]
    assert len(stops) == 2 and all(not f.queue for f in stops)  # Stop never waits behind the job it ends


def test_a_stop_before_the_tree_starts_stops_it_and_an_idle_stop_stops_nothing_later(h, tiny_engine):
    r = req("loom-early")
    c = Controls(prompt=PROMPT, max_new_tokens=3)
    # Clicked before the tree's job started (queued behind others): it starts stopped, nothing grown.
    h.run.stop_job(r)
    out = grow(h, c, None, r, where=FROM_PROMPT, p=0, k=2, depth=4, nodes=64)
    assert "it was stopped" in out[-1]["loom_md"] and len(out[-1]["loom_state"]["nodes"]) == 1  # the root alone
    # A Stop with nothing going, then a new click (its event clears the stop, as the page's guard does
    # for every event a session asks for): the tree grows whole.
    h.run.stop_job(r)
    h.page.registry.resume(r.session_hash)
    out = grow(h, c, None, r, where=FROM_PROMPT, p=0, k=2, depth=4, nodes=64)
    assert out[-1]["loom_state"]["reason"] != "cancelled" and len(out[-1]["loom_state"]["nodes"]) > 1
    assert tiny_engine.active_runs == 0 and len(h.page.registry) == 0
