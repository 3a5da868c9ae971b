"""A run that ends inside a multi-byte character: its text never ends with U+FFFD (the engine's
text leaves the unfinished bytes out), and every place that shows the run says they were cut:
the output, the branch tree's label, the JSONL download; Copy text copies the finished text."""

import json

from inference.serving.engine import Request
from inference.sampling.params import SamplingParams
from ui.shared.tree import node
from ui.shared.tree import tree_html
from ui.controls import Controls
from ui.handlers import Handlers
from ui.shared.view import highlighted_output, output_html, output_tokens
from ui.run_state import run_jsonl

import ui.shared.view as run_render


def byte_id(tok, piece: str) -> int:
    return next(i for i in range(tok.vocab_size) if tok.piece(i) == piece)


def cut_run(engine):
    """A run of one token, the first byte of a 3-byte character (a logit bias makes it)."""
    e5 = byte_id(engine.tokenizer, "<0xE5>")
    h = Handlers(engine)
    c = Controls(prompt="今天天气", temperature=0.0, max_new_tokens=1, seed="1", logit_bias=f"{e5}:100")
    rec = list(h.run.generate(*c.values(), None))[-1]["record"]
    assert [s.token_id for s in rec.steps] == [e5] and rec.done.reason == "length"
    return rec


def test_the_engine_text_of_a_run_cut_mid_character_has_no_replacement_character(tiny_engine):
    e5 = byte_id(tiny_engine.tokenizer, "<0xE5>")
    events = list(tiny_engine.generate(Request("今天", SamplingParams(
        temperature=0.0, max_new_tokens=1, seed=1, logit_bias=f"{e5}:100"))))
    done = events[-1]
    assert events[0].token_id == e5
    assert done.text == "" and done.tail == ""


def test_every_text_of_the_page_says_the_bytes_were_cut(tiny_engine):
    tok = tiny_engine.tokenizer
    rec = cut_run(tiny_engine)
    assert rec.cut_off == "<0xE5>"
    # The output says it (as before) and holds no U+FFFD.
    shown = "".join(t for t, _ in highlighted_output(rec, tok))
    assert shown == "[cut off: <0xE5>]"
    assert "\ufffd" not in "".join(t["token"] for t in output_tokens(rec, tok))
    # Copy text (the output's data-text): the finished text, no U+FFFD.
    page = output_html(rec, tok)
    assert "\ufffd" not in page and "data-text=''" in page
    # The branch tree's label says the character was cut.
    tree = tree_html([node(rec)], 0)
    assert "\ufffd" not in tree and "[cut off: &lt;0xE5&gt;]" in tree
    # The JSONL's text has no U+FFFD; its cut_off names the bytes.
    last = json.loads(run_jsonl(rec).splitlines()[-1])
    assert last["text"] == "" and last["tail"] == "" and last["cut_off"] == "<0xE5>"


def test_a_finished_run_says_nothing_was_cut(tiny_engine):
    h = Handlers(tiny_engine)
    rec = list(h.run.generate(*Controls(prompt="The quick brown", temperature=0.0, max_new_tokens=3,
                                    seed="1").values(), None))[-1]["record"]
    groups = tiny_engine.tokenizer.char_groups([s.token_id for s in rec.steps])
    if groups[-1][1]:  # the run's last character is whole
        assert rec.cut_off == ""
        assert "cut_off" not in json.loads(run_jsonl(rec).splitlines()[-1])
        assert "cut off" not in tree_html([node(rec)], 0)
    assert not any(c.cut for c in run_render.output_chips(rec, tiny_engine.tokenizer)[:-1])
