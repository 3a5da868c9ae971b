"""Tokenizer: encode/decode against sentencepiece itself, and streaming that never breaks a character."""

import sentencepiece as spm

from inference.serving.engine import Request
from inference.sampling.params import SamplingParams
from inference.loading.tokenizer import StreamDecoder, load_tokenizer

TEXTS = ["今天天气真冷，量子力学很难。", "Emoji 😀🎉🚀 mixed with 中文 and text", "plain ascii\nnew line"]


def stream_all(tok, ids):
    dec = tok.stream()
    deltas = [dec.push(i) for i in ids]
    return deltas, dec.flush()


def test_encode_and_decode_agree_with_sentencepiece(tiny_dirs, sp_model_bytes):
    tok = load_tokenizer(tiny_dirs["mha"])
    sp = spm.SentencePieceProcessor(model_proto=sp_model_bytes)
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == [tok.bos_id] + sp.EncodeAsIds(text)
        assert tok.decode(ids[1:]).lstrip(" ") == sp.DecodeIds(ids[1:])


def test_chinese_and_emoji_stream_without_broken_characters(tiny_dirs, sp_model_bytes):
    tok = load_tokenizer(tiny_dirs["mha"])
    sp = spm.SentencePieceProcessor(model_proto=sp_model_bytes)
    for text in TEXTS:
        ids = tok.encode(text, add_bos=False)
        assert any(sp.IsByte(i) for i in ids) or text.isascii()  # byte fallback is exercised
        deltas, tail = stream_all(tok, ids)
        assert all("\ufffd" not in d for d in deltas)
        assert tail == ""
        assert "".join(deltas).lstrip(" ") == sp.DecodeIds(ids) == text
        # A split character is held back: some deltas are empty while its bytes arrive.
        if not text.isascii():
            assert "" in deltas


def test_an_unfinished_tail_is_cut_not_replaced():
    table = [b"a", b"\xe4\xbb", b"\x8a", b"\xff"]
    dec = StreamDecoder(table)
    assert dec.push(0) == "a"
    assert dec.push(1) == ""  # two of three bytes of 今
    assert dec.push(2) == "今"
    assert dec.push(1) == "" and dec.held == b"\xe4\xbb"
    assert dec.flush() == "" and dec.cut == b"\xe4\xbb"  # bytes the stream did not finish: no U+FFFD
    dec = StreamDecoder(table)
    assert dec.push(3) == "\ufffd"  # a byte that can never start a character
    assert dec.flush() == "" and dec.cut == b""


def test_generated_stream_equals_one_shot_decode(tiny_engine):
    """Random tiny-model output is full of stray bytes: streaming must still equal decode()."""
    for seed in range(5):
        events = list(tiny_engine.generate(Request("今天天气真", SamplingParams(
            temperature=1.3, max_new_tokens=40, seed=seed))))
        ids = [e.token_id for e in events[:-1] if e.token_id not in tiny_engine.eos_ids]
        assert events[-1].text == tiny_engine.tokenizer.decode(ids, unfinished="")


def test_display_pieces_mark_split_bytes(tiny_dirs):
    tok = load_tokenizer(tiny_dirs["mha"])
    byte_id = tok.raw_pieces.index("<0xE4>")
    assert tok.piece(byte_id) == "<0xE4>"
    assert tok.piece(tok.bos_id) == "<s>"


def test_both_tokenizers_keep_the_contract(tiny_engine):
    """The local tokenizer and a server's offer every member of contract.Tokenizer (the page
    and the API use no other); a server's says None for what it cannot know."""
    import inspect
    from inference.contract import Tokenizer
    from inference.remote.tokenizer import RemoteTokenizer
    members = [n for n in dir(Tokenizer) if not n.startswith("_")] + list(Tokenizer.__annotations__)
    remote = RemoteTokenizer(http=None, model="m")
    for tok in (tiny_engine.tokenizer, remote):
        assert isinstance(tok, Tokenizer)
        missing = [n for n in members if not hasattr(tok, n)]
        assert not missing, (type(tok).__name__, missing)
    assert (remote.vocab_size, remote.token_bytes, remote.chat_template) == (None, None, None)
    assert remote.continuation_text([]) == ""
    assert "continuation_text" in members and "token_bytes" in members
    # The local one: a piece's leading space kept, as a run streams it.
    tok = tiny_engine.tokenizer
    ids = tok.encode_continuation(" the cat")
    assert tok.continuation_text(ids) == "".join(tok.token_bytes[i].decode("utf-8", "replace") for i in ids)
    assert inspect.signature(tok.continuation_text).parameters.keys() == {"ids"}
