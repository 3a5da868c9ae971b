"""The loom's engine side (Engine.expand_tree, decoding/tree.py): a tree of continuations grown a
level a step through the scheduler. Every node's probability, its path's and the mass its
children left out are checked against separate forward passes (Engine.step_logits over the
node's own text), the children against the threshold and the budget, the greedy path against
greedy decoding, and a run beside a tree against the same run alone."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from inference.decoding.tree import TreeLimits
from inference.errors import InputError, NotAvailable
from inference.events import DoneEvent, StepEvent, TreeDoneEvent, TreeStepEvent
from inference.sampling.params import SamplingParams
from engine_hold import hold_passes

PROMPT = "The quick brown"


def grow(engine, ids, **kw):
    events = list(engine.expand_tree(ids, **kw))
    assert isinstance(events[-1], TreeDoneEvent)
    return events


def path(nodes, node):
    out = []
    while node.parent is not None:
        out.append(node.token_id)
        node = nodes[node.parent]
    return out[::-1]


def separate(engine, ids, nodes, node) -> torch.Tensor:
    """The model's distribution after node's path, by a forward pass of its own (float64)."""
    return engine.step_logits(ids + path(nodes, node)).double().softmax(-1)


@pytest.mark.parametrize("choose", [dict(min_prob=0.04), dict(top_k=3), dict(top_k=4, min_prob=0.06)])
def test_every_node_against_a_forward_pass_of_its_own(tiny_engine, choose):
    e = tiny_engine
    ids = e.prompt_ids(PROMPT)
    given = e.tokenizer.encode_continuation(" fox")
    events = grow(e, ids, given=given, depth=3, max_nodes=200, **choose)
    nodes = events[-1].nodes
    assert [ev.step for ev in events[:-1]] == [0, 1, 2] and events[-1].reason == "depth"
    assert sum(len(ev.nodes) for ev in events[:-1]) == len(nodes) - 1  # each added once, by its level
    children = {}
    for n in nodes[1:]:
        children.setdefault(n.parent, []).append(n)
    checked = 0
    for n in nodes:
        if not n.expanded:
            assert n.depth == 3 or n.eos
            continue
        p = separate(e, ids + given, nodes, n)
        kids = children.get(n.id, [])
        for c in kids:  # the batched step and the one-off pass: two computations, within 1e-4
            assert abs(c.prob - float(p[c.token_id])) < 1e-4
            assert abs(c.path_prob - n.path_prob * float(p[c.token_id])) < 1e-4
            assert c.greedy == (n.greedy and c.token_id == int(p.argmax()))
        assert abs(n.unexpanded_mass - (1 - sum(float(p[c.token_id]) for c in kids))) < 1e-4
        order = p.argsort(descending=True).tolist()
        want = [t for r, t in enumerate(order) if (choose.get("top_k") is None or r < choose["top_k"])
                and (choose.get("min_prob") is None or float(p[t]) >= choose["min_prob"] + 1e-4)]
        got = {c.token_id for c in kids}
        assert set(want) <= got and len(got) <= len(want) + 1  # (a token within 1e-4 of the threshold either way)
        checked += 1
    assert checked >= 2
    # The greedy path marked is greedy decoding's (the model's own distribution, no stage).
    greedy_nodes = [n for n in nodes[1:] if n.greedy]
    run = [ev.token_id for ev in e.generate_ids(ids, SamplingParams(temperature=0, max_new_tokens=3), given=given)
           if isinstance(ev, StepEvent)]
    assert [n.token_id for n in sorted(greedy_nodes, key=lambda n: n.depth)] == run[:len(greedy_nodes)]


def test_a_budget_keeps_the_most_probable_paths_and_says_what_it_left_out(tiny_engine):
    e = tiny_engine
    ids = e.prompt_ids(PROMPT)
    full = grow(e, ids, depth=2, max_nodes=200, top_k=5)[-1].nodes
    events = grow(e, ids, depth=2, max_nodes=8, top_k=5)
    done = events[-1]
    assert done.reason == "budget" and len(done.nodes) - 1 == 8
    level2 = sorted((n for n in full if n.depth == 2), key=lambda n: -n.path_logprob)
    kept = [n for n in done.nodes if n.depth == 2]
    assert [(n.parent, n.token_id) for n in sorted(kept, key=lambda n: -n.path_logprob)] == \
        [(n.parent, n.token_id) for n in level2[:3]]  # 5 children of the root, then the 3 best paths
    for n in done.nodes:
        if n.expanded:
            kids = [c for c in done.nodes if c.parent == n.id]
            assert abs(n.unexpanded_mass + sum(c.prob for c in kids) - 1) < 1e-9


def test_a_run_beside_a_tree_is_the_run_alone_and_the_pool_shows_both(tiny_engine, monkeypatch):
    e = tiny_engine
    ids = e.prompt_ids(PROMPT)
    params = SamplingParams(temperature=1.0, seed=4, max_new_tokens=6)
    alone = [ev for ev in e.generate_ids(ids, params) if isinstance(ev, StepEvent)]
    tree_alone = grow(e, ids, depth=3, max_nodes=30, min_prob=0.05)[-1].nodes
    go = hold_passes(monkeypatch, e)
    with ThreadPoolExecutor(2) as pool:
        run = pool.submit(lambda: [ev for ev in e.generate_ids(ids, params)])
        tree = pool.submit(grow, e, ids, depth=3, max_nodes=30, min_prob=0.05)
        while e.active_runs < 2:
            threading.Event().wait(0.001)
        go.set()
        together, tree_events = run.result(), tree.result()
    beside = [ev for ev in together if isinstance(ev, StepEvent)]
    assert [(s.token_id, s.prob) for s in beside] == [(s.token_id, s.prob) for s in alone]  # the same bits
    assert [(n.parent, n.token_id, n.logprob) for n in tree_events[-1].nodes] == \
        [(n.parent, n.token_id, n.logprob) for n in tree_alone]
    assert max(ev.pool.active_runs for ev in tree_events if isinstance(ev, TreeStepEvent)) == 2
    assert isinstance(together[-1], DoneEvent)


def test_a_cancelled_tree_ends_so_and_gives_its_blocks_back(tiny_engine, monkeypatch):
    e = tiny_engine
    go = hold_passes(monkeypatch, e, free=1)  # the first level goes; the second waits for the test
    cancel = threading.Event()
    events = e.expand_tree(e.prompt_ids(PROMPT), depth=4, max_nodes=50, top_k=3, cancel=cancel)
    first = next(events)
    assert isinstance(first, TreeStepEvent) and first.step == 0 and len(first.nodes) == 3
    cancel.set()
    go.set()
    out = list(events)
    assert out[-1].reason == "cancelled" and len(out[-1].nodes) >= 4
    assert e.scheduler.stats().blocks_used == 0 and e.active_runs == 0


@pytest.mark.parametrize("kw,says", [
    (dict(depth=0, top_k=2), "depth must be from 1 to 16"),
    (dict(depth=5, top_k=2, limits=TreeLimits(4, 64, "this page")), "from 1 to 4 \\(this page's bound\\)"),
    (dict(max_nodes=65, top_k=2, limits=TreeLimits(4, 64, "this page")), "nodes must be from 1 to 64 \\(this page's bound\\)"),
    (dict(), "threshold, the top k, or both"),
    (dict(min_prob=0.0), "above 0 and at most 1"),
    (dict(top_k=0), "top k must be"),
])
def test_a_tree_past_its_bounds_is_refused_saying_the_bound(tiny_engine, kw, says):
    with pytest.raises(InputError, match=says):
        next(tiny_engine.expand_tree(tiny_engine.prompt_ids(PROMPT), **kw))


def test_the_context_window_bounds_the_depth(tiny_engine):
    e = tiny_engine
    ids = [e.tokenizer.bos_id or 1] * (e.max_seq_len - 2)
    with pytest.raises(InputError, match="depth at most 2"):
        next(e.expand_tree(ids, depth=3, top_k=2))


def test_capabilities_say_who_grows_trees():
    from inference.remote.engine import RemoteEngine
    from inference.serving.engine import CAPABILITIES
    assert CAPABILITIES.tree
    with pytest.raises(NotAvailable, match="capabilities.tree"):
        RemoteEngine.expand_tree(None, [1, 2])
