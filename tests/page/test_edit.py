"""Edit and continue (ui/edit): the edited output, tokenized after the prompt, continues the run
as token ids (the engine's own continuation, transformers' numbers); the seam table lists the
tokens that changed, as the tokenizer itself tokenizes; undo goes back; /continue_edit refuses
what /generate refuses."""

import re
from types import SimpleNamespace

import pytest
import torch

from inference.events import StepEvent
from inference.sampling.params import SamplingParams
from ui.controls import NAMES, Controls
from ui.edit.render import seam_html
from ui.edit.seam import edited_ids, seam_changes
from ui.handlers import Handlers

REQ = SimpleNamespace(session_hash="edit")
SETTINGS = dict(prompt="The quick brown fox", temperature=1.0, frequency_penalty=0.4, max_new_tokens=8, seed="3")


def run(h, c: Controls, history=None, pending=None, undo=None):
    """A run as the page makes it: the run, its end, the edit panel's bookkeeping."""
    rec = list(h.run.generate(*c.values(), REQ, history))[-1]["record"]
    h.run.after_run(rec, history, REQ)
    return rec, h.edit.edit_after_run(rec, pending, undo)


def tbody(seam: str) -> str:
    return seam.split("<tbody>")[1]


def continue_from(h, rec, text, undo):
    out = h.edit.edit_continue(rec, text, [], [])
    c = Controls(*[out[n] for n in NAMES])
    new, after = run(h, c, out["history"], out["edit_pending"], undo)
    return out, c, new, after


def test_a_continue_after_an_edit_is_the_engine_on_those_ids(h, tiny_engine, tiny_dirs):
    root, after = run(h, Controls(**SETTINGS))
    assert after["edit_box"] == root.answer_text and after["edit_undo_stack"] == []
    edited = root.answer_text[:5] + " the end"
    out, c, new, after = continue_from(h, root, edited, after["edit_undo_stack"])
    tok = tiny_engine.tokenizer
    # The prompt's ids, then the edited text tokenized after the prompt: the tokenizer on the whole text.
    whole = tok.encode("The quick brown fox" + edited)
    assert whole[:len(root.prompt_ids)] == root.prompt_ids
    assert new.prompt_ids == root.prompt_ids and new.given == whole[len(root.prompt_ids):]
    assert c.seed == "3" and c.max_new_tokens == 8 and c.prefix_ids == ",".join(map(str, new.given))
    alone = [e for e in tiny_engine.generate_ids(root.prompt_ids, SamplingParams(
        temperature=1.0, frequency_penalty=0.4, max_new_tokens=8, seed=3), top_n=5, given=new.given)
        if isinstance(e, StepEvent)]
    assert [s.token_id for s in new.steps] == [s.token_id for s in alone]
    # The text joins at the seam: the given part as given, then the continuation's own.
    assert new.given_text == edited and new.answer_text == tok.decode(new.given + [s.token_id for s in new.steps])
    assert after["edit_box"] == new.answer_text and len(after["edit_undo_stack"]) == 1
    transformers = pytest.importorskip("transformers")
    ref = transformers.LlamaForCausalLM.from_pretrained(tiny_dirs["gqa_tied"], dtype=torch.float32).eval()
    with torch.no_grad():
        logits = ref(torch.tensor([root.prompt_ids + new.given])).logits[0, -1].float()  # (vocab,)
    raw = logits.softmax(-1)
    assert max(abs(cand.raw_prob - raw[cand.id].item()) for cand in new.steps[0].top) <= 1e-4


def test_the_seam_table_lists_the_tokens_the_tokenizer_changed(tiny_engine):
    """'Thee' ends in the token 'e'; with an 'x' after it the tokenizer makes 'ex': a token of
    text the edit did not touch is another now."""
    tok = tiny_engine.tokenizer
    old = tok.encode_continuation("Thee")
    new = edited_ids(tok, "", [], "Theex", chat=True)
    assert new == tok.encode_continuation("Theex")
    (change,) = seam_changes(tok, old, new)
    differing = [i for i in old if i not in new]
    assert [i for i, _ in change.before] == differing == [tok.encode_continuation("e")[0]]
    assert [i for i, _ in change.after] == [i for i in new if i not in old] == [tok.encode_continuation("ex")[0]]
    assert change.retokenized == 1 and change.seam and change.before[0][1] == tok.piece(change.before[0][0])
    # An edit whose neighbours keep their tokens: only the edited tokens are listed.
    old = tok.encode_continuation("The quick brown fox")
    new = tok.encode_continuation("The quick brown cat")
    changes = seam_changes(tok, old, new)
    assert changes and not any(c.seam for c in changes) and all(c.near for c in changes)
    assert seam_changes(tok, old, old) == []


PARIS = " Paris, the capital of Europe is Europe"


@pytest.mark.parametrize("at, inserted", [(PARIS.index(" Europe"), " Asia and"), (0, " Oh"),
                                          (len(PARIS), " and Asia")], ids=["before a space", "start", "end"])
def test_an_insertion_or_a_deletion_anywhere_is_the_edit(tiny_engine, at, inserted):
    """Text put in (or taken out) where the tokenizer keeps every other token is the edit
    itself: one row, no ⚑, no ≠, even where it goes before a token that starts with a space
    (the bytes cannot tell " Asia and" before " Europe" from "Asia and " before "Europe")."""
    tok = tiny_engine.tokenizer
    edited = PARIS[:at] + inserted + PARIS[at:]
    old, new, put = (tok.encode_continuation(t) for t in (PARIS, edited, inserted))
    k = next(k for k in range(len(old) + 1) if new == old[:k] + put + old[k:])  # the tokenizer keeps the rest
    assert k == len(old) or tok.piece(old[k]).startswith(" ")
    for before, after, gone, added in ((old, new, [], put), (new, old, put, [])):  # the insertion; the deletion
        (change,) = seam_changes(tok, before, after)
        assert [i for i, _ in change.before] == gone and [i for i, _ in change.after] == added
        assert change.near and not change.seam
        table = seam_html([change])
        assert "≠" not in table and "Away from the edit" not in table and "only the edited tokens differ" in table


def test_the_run_s_own_tokens_away_from_the_edit_are_marked(tiny_engine):
    """A run that spelt 'ar' as 'a' 'r' (the tokenizer writes 'ar'), edited further on: that
    place is away from the edit (≠), the edit's own row is not."""
    tok = tiny_engine.tokenizer
    old = tok.encode_continuation(PARIS)
    ar = old.index(tok.encode_continuation("ar")[0])
    spelt = old[:ar] + tok.encode_continuation("a") + tok.encode_continuation("r") + old[ar + 1:]
    assert tok.decode(spelt) == tok.decode(old)
    away, edit = seam_changes(tok, spelt, tok.encode_continuation(PARIS + " and Asia"))
    assert not away.near and [i for i, _ in away.after] == [old[ar]] and len(away.before) == 2
    assert edit.near and edit.before == [] and not edit.seam
    assert "in 1 place (marked ≠)" in seam_html([away, edit])


def test_the_page_shows_the_seam_as_you_type_and_at_the_continue(h, tiny_engine):
    tok = tiny_engine.tokenizer
    dot = tok.encode_continuation(".")[0]  # every run here makes dots (a logit bias): canonical tokens
    root, after = run(h, Controls(**{**SETTINGS, "prompt": "The quick", "temperature": 0.0,
                                     "logit_bias": f"{dot}:100"}))
    # The run continued after "Thee" (its given tokens 'T', 'he', 'e'), then dots.
    out, _, first, after = continue_from(h, root, "Thee", after["edit_undo_stack"])
    assert "⚑" not in out["edit_seam"] and "Your edit changed" not in out["edit_seam"]
    e, ex = tok.encode_continuation("e"), tok.encode_continuation("ex")
    assert len(e) == len(ex) == 1 and first.given == tok.encode_continuation("Thee") and first.given[-1] == e[0]
    assert {s.token_id for s in first.steps} == {dot}
    # An x typed after that 'e' (text the edit does not touch): the tokenizer joins them.
    edited = "Theex" + first.answer_text[4:]
    preview = h.edit.edit_preview(first, edited)
    ids = edited_ids(tok, first.prompt_text, first.prompt_ids, edited, chat=False)
    assert ids == tok.encode_continuation(edited) and ids[2] == ex[0]
    assert "⚑" in preview and "1 token of text you did not edit is different now" in preview and "≠" not in preview
    (change,) = seam_changes(tok, first.generated_before(len(first.steps)), ids)
    assert change.before == [(e[0], "e")] and change.after == [(ex[0], "ex")] and change.seam
    row = preview.split("tl-seam-moved")[1].split("</tr>")[0]
    assert f"<sub>{e[0]}</sub>" in row and f"<sub>{ex[0]}</sub>" in row
    out, _, second, _ = continue_from(h, first, edited, after["edit_undo_stack"])
    # The same places at the click, labelled as the edit the new run continues from.
    assert tbody(out["edit_seam"]) == tbody(preview) and "continued from your edit" in out["edit_seam"]
    assert second.given == ids
    assert "Cannot continue from this text: the edited text is empty" in h.edit.edit_preview(root, "")
    assert "Let a run end" in h.edit.edit_preview(None, "x")


def test_undo_restores_the_run_before_each_edit(h):
    root, after = run(h, Controls(**SETTINGS))
    _, _, first, after = continue_from(h, root, root.answer_text + " and", after["edit_undo_stack"])
    _, _, second, after = continue_from(h, first, "A new start", after["edit_undo_stack"])
    stack = after["edit_undo_stack"]
    assert [b["record"] for b in stack] == [root, first] and after["edit_undo"]["interactive"]
    back = h.edit.edit_undo(stack)
    assert back["record"] is first and back["edit_box"] == first.answer_text
    assert back["prefix_ids"] == first.controls.prefix_ids and back["output"].count("tl-given") == 1
    back = h.edit.edit_undo(back["edit_undo_stack"])
    assert back["record"] is root and back["prefix_ids"] == "" and not back["edit_undo"]["interactive"]
    assert back["edit_undo_stack"] == [] and back["edit_box"] == root.answer_text
    # A run put on view again (a branch clicked in the tree) brings its own text into the box.
    assert h.edit.edit_on_view(second) == {"edit_box": second.answer_text, "edit_seam": ""}
    # A run that is not a continue starts afresh: nothing to undo.
    _, after = run(h, Controls(**SETTINGS), undo=stack)
    assert after["edit_undo_stack"] == [] and after["edit_seam"] == ""


def test_a_chat_answer_edited_continues_the_same_turn(h):
    c = Controls(**{**SETTINGS, "mode": "chat", "prompt": "Hello"})
    rec = list(h.run.generate(*c.values(), REQ, []))[-1]["record"]
    history = h.run.after_run(rec, [], REQ)["history"]
    out = h.edit.edit_continue(rec, "Sure thing", [], history)
    assert out["history"] == [] and out["prompt"] == "Hello" and out["mode"] == "chat"
    c2 = Controls(*[out[n] for n in NAMES])
    new = list(h.run.generate(*c2.values(), REQ, out["history"]))[-1]["record"]
    assert new.prompt_ids == rec.prompt_ids and new.answer_text.startswith("Sure thing")
    turn = h.run.after_run(new, out["history"], REQ)["history"]
    assert [{k: m[k] for k in ("role", "content")} for m in turn] == [
        {"role": "user", "content": "Hello"}, {"role": "assistant", "content": new.answer_text}]


def test_bad_edits_are_one_line_refusals(h):
    root, _ = run(h, Controls(**SETTINGS))
    for text, message in (("", "the edited text is empty"), ("x" * 10**6, "the edited text is 1,000,000 characters")):
        with pytest.raises(Exception, match=message) as e:
            h.edit.edit_continue(root, text, [], [])
        assert "\n" not in str(e.value)
    with pytest.raises(Exception, match="Let the run end"):
        h.edit.edit_continue(None, "x", [], [])
    with pytest.raises(Exception, match="edited text or prefix ids, not both"):
        list(h.edit.continue_edit(*Controls(**{**SETTINGS, "prefix_ids": "5"}).values(), "x", REQ))


def test_after_a_continue_the_table_is_the_edit_of_the_run_it_edited_and_says_so(h, tiny_engine):
    """The box then holds the new run's text: the table is labelled as the edit this run continued
    from, its tokens the edited run's (not the box's); typing again compares with the new run;
    an undo shows the table of the run it goes back to. Every event that sets the box, the run or
    the undo stack shows what edit_preview gives for them, whichever comes last."""
    tok = tiny_engine.tokenizer
    dot = tok.encode_continuation(".")[0]
    root, after = run(h, Controls(**{**SETTINGS, "prompt": "The quick", "temperature": 0.0,
                                     "logit_bias": f"{dot}:100"}))
    assert after["edit_seam"] == "" and h.edit.edit_preview(root, root.answer_text, after["edit_undo_stack"]) == ""
    typed = h.edit.edit_preview(root, "Thee", after["edit_undo_stack"])
    assert "Your text against the run on view" in typed and "the run's tokens" in typed
    out, _, first, after = continue_from(h, root, "Thee", after["edit_undo_stack"])
    undo = after["edit_undo_stack"]
    assert after["edit_box"] == first.answer_text != "Thee" and first.answer_text.startswith("Thee")
    seam = after["edit_seam"]
    assert "This run continued from your edit of the run before it" in seam and "the edited run's tokens" in seam
    assert "Your text against the run on view" not in seam
    # Its left column is the edited run's tokens (dots), its right the edit's, as the tokenizer writes "Thee".
    (row,) = re.findall(r"<tr class='[^']*'>(.*?)</tr>", seam)
    left, right = (re.findall(r"<sub>(\d+)</sub>", cell) for cell in row.split("</td>")[1:3])
    assert [int(i) for i in left] == root.generated_before(len(root.steps)) == [dot] * len(root.steps)
    assert [int(i) for i in right] == tok.encode_continuation("Thee")
    assert out["edit_seam"] == seam  # shown from the click on, as the run starts
    # The box's own change event (the run's end set it) shows the same table.
    assert h.edit.edit_preview(first, first.answer_text, undo) == seam
    # An edit of the new run is compared with the new run, not the one before it.
    more = h.edit.edit_preview(first, first.answer_text + "!", undo)
    assert "Your text against the run on view" in more and "continued from" not in more
    (row,) = re.findall(r"<tr class='[^']*'>(.*?)</tr>", more)
    assert row.split("</td>")[1].count("<sub>") == 0  # nothing of the run's own tokens changed: "!" added
    # Undo: back to the run before, which was no continue: no table.
    back = h.edit.edit_undo(undo)
    assert back["record"] is root and back["edit_seam"] == "" and back["edit_box"] == root.answer_text
    assert h.edit.edit_on_view(first, undo) == {"edit_box": first.answer_text, "edit_seam": seam}


def test_the_table_follows_every_change_of_the_box(tiny_engine):
    """Gradio's Textbox sends `input` on a key press only (not Backspace, Delete, paste or cut):
    the table follows the box's change event."""
    from ui.layout import build_ui
    config = build_ui(tiny_engine, Handlers(tiny_engine)).get_config_file()
    ids = {c["props"].get("elem_id"): c["id"] for c in config["components"]}
    (dep,) = [d for d in config["dependencies"] if ids["edit-seam"] in d["outputs"] and len(d["outputs"]) == 1]
    assert [tuple(t) for t in dep["targets"]] == [(ids["edit-text"], "change")] and dep["trigger_mode"] == "always_last"


def test_a_continue_after_an_edit_joins_the_branch_tree_where_the_edit_starts(h, tiny_engine):
    """The continuation of an edit is a branch of the run it edited, at the first
    token where its ids leave that run's; the tree is kept (not wiped), and a candidate branched
    from the continuation grows the same tree."""
    root, after = run(h, Controls(**SETTINGS))
    tree = h.branches.grow_tree(root, [])["branches"]
    cut = tiny_engine.tokenizer.decode([s.token_id for s in root.steps[:3]])
    out = h.edit.edit_continue(root, cut + " zebra", tree, [])
    assert [n["record"] for n in out["branches"]] == [root, None]
    c = Controls(*[out[n] for n in NAMES])
    new, _ = run(h, c, out["history"], out["edit_pending"], after["edit_undo_stack"])
    grown = h.branches.grow_tree(new, out["branches"])
    nodes = grown["branches"]
    assert [n["record"] for n in nodes] == [root, new] and nodes[1]["parent"] == 0
    ran = [s.token_id for s in root.steps]
    same = next((k for k, (a, b) in enumerate(zip(ran, new.given)) if a != b), min(len(ran), len(new.given)))
    assert nodes[1]["at"] == same <= 3  # within the 3 tokens kept (their text may tokenize otherwise)
    assert "edited to <b>" in grown["branch_view"] and "zebra" in grown["branch_view"]
    # A branch from the continuation's bars joins the same tree.
    step = new.steps[0]
    cand = next(c for c in step.top if c.id != step.token_id)
    picked = h.branches.branch(new, nodes, SimpleNamespace(value=f"0:{cand.id}"))
    assert [n["parent"] for n in picked["branches"]] == [None, 0, 1]
