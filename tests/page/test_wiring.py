"""ui/wiring.py: hooks chained after an event run as one event, each seeing what the hooks
before it returned, and Gradio's request reaches the hooks that take it."""

import gradio as gr
from ui.wiring import Page, fused


def test_a_later_hook_reads_what_an_earlier_one_returned():
    seen = []

    def grow(rec, nodes):
        return {"nodes": [*nodes, rec], "tree": f"{len(nodes) + 1} nodes"}

    def save(rec, nodes, request: gr.Request = None):
        seen.append((rec, list(nodes), request))
        return list(nodes)  # one output: its value

    def untouched(box):
        seen.append(box)
        return gr.update(interactive=False)  # an update without a value: the box's value stays

    fn, inputs, outputs = fused([(grow, ("record", "nodes"), ("nodes", "tree")),
                                 (save, ("record", "nodes"), ("saved",)),
                                 (untouched, ("box",), ("box",)), (untouched, ("box",), ("box",))])
    assert inputs == ("record", "nodes", "box") and outputs == ("nodes", "tree", "saved", "box")
    out = fn("run 2", ["run 1"], "typed", "the request")  # Gradio passes the request after the inputs
    assert out["nodes"] == out["saved"] == ["run 1", "run 2"] and out["tree"] == "2 nodes"
    assert seen == [("run 2", ["run 1", "run 2"], "the request"), "typed", "typed"]
    assert out["box"]["interactive"] is False


def test_a_chain_is_one_event_after_its_trigger():
    page = Page()
    with gr.Blocks() as demo:
        page.add("count", gr.Number(0))
        page.add("twice", gr.Number(0))
        page.add("note", gr.Textbox())
        first = page.on(gr.Button().click, lambda c: c + 1, inputs=("count",), outputs=("count",))
        page.chain(first, [(lambda c: {"twice": 2 * c}, ("count",), ("twice",)),
                           (lambda c: {"note": f"{c}"}, ("count",), ("note",))])
    assert len(demo.fns) == 2  # the click, and one event for both hooks after it
    outputs = demo.fns[1].outputs
    assert len(outputs) == 2 and outputs[0] is page["twice"] and outputs[1] is page["note"]


def test_one_hook_with_one_output_returns_its_value_or_a_skip():
    fn, _, outputs = fused([(lambda c: c * 3, ("count",), ("count",))])
    assert outputs == ("count",) and fn(2) == 6
    fn, _, _ = fused([(lambda: gr.skip(), (), ("note",))])
    assert fn() == gr.skip()
