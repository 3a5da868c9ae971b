"""Byte tokens on the page: the bars and the output's popovers say which bytes of a character a
candidate's <0xNN> bytes are, and a character the run finished from byte tokens is named beside
its bytes ("<0xE6><0x9C><0x9B> = 望")."""

from inference.events import Candidate, DoneEvent, StepEvent
from ui.format import bars_html
from ui.shared.view import output_chips, output_html
from ui.run_state import RunRecord


def step(i, token_id, piece, text, top):
    return StepEvent(step=i, token_id=token_id, piece=piece, text=text, prob=0.5, raw_prob=0.5, top=top,
                     entropy=0.0, rank=1, kv_cache_bytes=0, kv_cache_capacity_bytes=0, ms=1.0)


def test_the_bars_label_byte_candidates_as_the_start_of_a_character():
    top = [Candidate(10, "<0xE5>", 0.4, 0.4), Candidate(11, "<0xE8><0x80>", 0.3, 0.3),
           Candidate(12, "<0xA4>", 0.2, 0.2), Candidate(13, "▁the", 0.1, 0.1)]
    html = bars_html(step(0, 10, "<0xE5>", "", top))
    assert "1st of 3 bytes" in html and "1–2 of 3 bytes" in html and "continues a character" in html
    assert "title='id 10 · 1st byte of a 3-byte character" in html
    assert "(1st byte of a 3-byte character)" in html  # the head: "chose <0xE5> (1st byte …)"
    # The two bytes of <0xE8><0x80> may break between them: never cut at a narrow width.
    assert "&lt;0xE8&gt;<wbr>&lt;0x80&gt;" in html
    row_the = html.split("id 13")[1].split("</div>")[0]
    assert "tl-byte-hint" not in row_the


def test_the_popover_of_a_character_made_of_byte_tokens_names_it(tiny_engine):
    tok = tiny_engine.tokenizer
    ids = tok.encode_continuation("a望")
    stream = tok.stream()
    steps = [step(i, t, tok.piece(t), stream.push(t), [Candidate(t, tok.piece(t), 0.5, 0.5)])
             for i, t in enumerate(ids)]
    stream.flush()
    done = DoneEvent("length", "".join(s.text for s in steps), "", 1, len(steps), 1.0, 1.0, 0, len(steps), False)
    rec = RunRecord(prompt_ids=[1], steps=steps, done=done)
    assert "望" in [c.text for c in output_chips(rec, tok)]
    page = output_html(rec, tok)
    assert "&lt;0xE6&gt;&lt;0x9C&gt;&lt;0x9B&gt; = 望" in page
    assert "1st of 3 bytes" in page  # its first step's candidate <0xE6>
    # Cut by the run's end: the popover says the character was not finished.
    cut = RunRecord(prompt_ids=[1], steps=steps[:-1], done=done)
    assert "the run ended before the character did" in output_html(cut, tok)


def test_a_chat_answer_with_bytes_that_make_no_character_shows_them_in_the_conversation(tiny_engine):
    """A turn whose answer has bytes that make no character (a character begun and left for
    another, one the end cut) shows their pieces in the conversation, never "\ufffd"; the text
    kept for the template is the tokenizer's."""
    from ui.shared.conversation import conversation_html, turn_if_answered
    tok = tiny_engine.tokenizer
    ids = tok.encode_continuation("a") + tok.encode_continuation("望")[:1] + tok.encode_continuation("b望")
    ids = ids[:-1]  # the end cuts the last character after its first byte token(s)
    stream = tok.stream()
    steps = [step(i, t, tok.piece(t), stream.push(t), []) for i, t in enumerate(ids)]
    stream.flush()
    done = DoneEvent("length", "".join(s.text for s in steps), "", 1, len(steps), 1.0, 1.0, 0, len(steps), False)
    assert "\ufffd" in done.text  # the stream's decoding of a character left unfinished mid-way
    rec = RunRecord(mode="chat", user_message="Hi", prompt_ids=[1], steps=steps, done=done)
    turn = turn_if_answered(rec, tok.token_bytes)
    assert turn[-1]["content"] == done.text
    shown = conversation_html(turn)
    assert "\ufffd" not in shown and "&lt;0xE6&gt;" in shown and "[cut off: &lt;0xE6&gt;" in shown, shown
