"""Every text a visitor sends is checked for size before any expensive work: a prompt longer than
the context could hold, in characters, is refused without being tokenized or copied."""

import tracemalloc
from types import SimpleNamespace

import gradio as gr
import pytest

from inference.serving.engine import Engine
from inference.errors import InputError
from tiny_models import make_tiny_model
from ui.controls import MAX_STOP_TEXT, Controls, parse_seed, parse_stop
from ui.handlers import Handlers
from ui.controls import shaping_values  # noqa: E402

BIG = "fox " * 2_000_000  # 8 MB


@pytest.fixture
def no_tokenizing(tiny_engine, monkeypatch):
    """Any tokenizing or chat-template rendering fails the test: the refusal must come first."""
    tok = tiny_engine.tokenizer

    def forbidden(*a, **k):
        raise AssertionError("tokenized (or rendered) text that should have been refused by its length")

    for name in ("_encode_fn", "_continue_fn", "_template_fn"):
        monkeypatch.setattr(tok, name, forbidden)
    monkeypatch.setattr("inference.serving.engine.render_chat_segments", forbidden)
    return tiny_engine


def peak_bytes(fn) -> tuple[int, BaseException | None]:
    """Peak Python memory allocated while fn runs (beyond what exists before), and its error."""
    tracemalloc.start()
    err = None
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - returned to the test
        err = e
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, err


def test_longest_piece_bounds_the_characters_a_token_holds(tiny_dirs, tmp_path):
    from gguf_files import train_bpe_tokenizer_json
    from tiny_models import TRAIN_TEXT
    bpe = make_tiny_model(tmp_path, "gqa_tied", tokenizer_json=train_bpe_tokenizer_json(TRAIN_TEXT, 400),
                          dir_name="bpe")
    for d in (tiny_dirs["gqa_tied"], bpe):
        engine = Engine.from_hf_dir(d)
        tok = engine.tokenizer
        longest = max(tok.token_bytes, key=len).decode("utf-8", errors="replace")
        assert tok.max_token_chars == max(len(b.decode("utf-8", errors="replace")) for b in tok.token_bytes)
        # The bound is never below what text really takes: the longest piece repeated, the
        # training text, and text of single-byte tokens.
        for text in (longest * 50, " ".join(TRAIN_TEXT[:8]), "今天😀" * 30, "\x00\x01" * 40):
            ids = tok.encode(text, add_bos=False)
            assert len(text) <= engine.max_chars(len(ids)), (d.name, text[:20])


def test_an_8_mb_prompt_is_refused_untokenized_with_the_over_long_message(no_tokenizing):
    engine = no_tokenizing
    ctx = engine.cfg.max_seq_len
    for chat, system in ((False, ""), (True, ""), (True, "be brief")):
        peak, err = peak_bytes(lambda: engine.prompt_ids(BIG, chat, system))
        assert isinstance(err, InputError), err
        message = str(err)
        # The same message as a prompt found too long after tokenizing: sizes and the context.
        assert message.startswith("the prompt") and f"context window is {ctx}" in message, message
        assert "8,000,0" in message and "\n" not in message and len(message) < 200
        assert peak < 64 * 1024, f"{peak} bytes allocated to refuse it"  # no copy of the 8 MB
        print(f"8 MB prompt refused, {peak} bytes allocated")
    with pytest.raises(InputError, match="context window is"):  # a system prompt alone too
        engine.prompt_ids("hi", True, BIG)


def test_a_prompt_just_inside_the_bound_is_tokenized(tiny_engine):
    """The check refuses only what cannot fit: at the bound the tokenizer decides."""
    n = tiny_engine.max_chars(tiny_engine.cfg.max_seq_len - 1)
    with pytest.raises(InputError, match=r"tokens but the context window is"):
        tiny_engine.prompt_ids("x" * n)
    with pytest.raises(InputError, match=r"characters but the context window is"):
        tiny_engine.prompt_ids("x" * (n + 1))


def test_a_long_continuation_is_refused_untokenized(no_tokenizing):
    engine = no_tokenizing
    peak, err = peak_bytes(lambda: engine.score([1, 5, 6], BIG))
    assert isinstance(err, InputError) and "continuation" in str(err) and "context window" in str(err)
    assert peak < 64 * 1024


def test_every_page_input_is_refused_cheaply(tiny_engine, no_tokenizing):
    h = Handlers(tiny_engine)
    req = SimpleNamespace(session_hash="big", client=SimpleNamespace(host="198.51.100.1"), username=None)
    cases = {
        "prompt": dict(prompt=BIG),
        "system": dict(mode="chat", system=BIG),
        "stop strings": dict(stop=BIG),
        "seed": dict(seed="9" * 8_000_000),
        "mode": dict(mode=BIG),
        "model": dict(model=BIG),
    }
    for name, kw in cases.items():
        c = Controls(**{"prompt": "The quick", **kw})
        for call in (lambda: list(h.run.generate(*c.values(), req)),
                     lambda: h.experiments.compare(*c.values(), *shaping_values(), "", req),
                     lambda: h.share.share_link(*c.values(), "http://x/", req)):
            peak, err = peak_bytes(call)
            assert isinstance(err, gr.Error), (name, err)
            assert "\n" not in str(err) and len(str(err)) < 300, (name, str(err)[:300])
            assert peak < 256 * 1024, (name, peak)
    rec = SimpleNamespace(steps=[object()], prompt_ids=[1, 5], seen_before=lambda i: [1, 5], model="")
    peak, err = peak_bytes(lambda: h.experiments.likelihood(rec, 0, BIG))
    assert isinstance(err, gr.Error) and "continuation" in str(err) and peak < 64 * 1024
    begun = h.run.begin(*Controls(prompt=BIG).values(), req)
    assert set(begun) == {"status"} and "prompt" in begun["status"]  # every panel kept; the status line says why


def test_parsers_refuse_long_text_before_reading_it():
    with pytest.raises(InputError, match="stop strings are"):
        parse_stop("a\n" * MAX_STOP_TEXT)
    assert len(parse_stop("\n".join(["\\n" * 256] * 16))) == 16  # the most the box may hold
    with pytest.raises(InputError, match="seed") as e:
        parse_seed("1" * 10_000)
    assert len(str(e.value)) < 150
