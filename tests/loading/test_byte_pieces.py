"""Byte tokens in words (inference/loading/byte_pieces.py): which bytes of which character a
piece holds, and the character once a run has finished it."""

import pytest

from inference.loading.byte_pieces import (byte_hint, byte_label, char_length, completed_label, hex_pieces,
                                           piece_bytes, readable_text, short_hint, split_bytes, unfinished_tail)


def test_a_piece_stands_for_its_bytes():
    assert piece_bytes("<0xE5><0xA5><0xBD>") == "好".encode()
    assert piece_bytes("a<0xE5>") == b"a\xe5"
    assert piece_bytes("▁the") == "▁the".encode()
    assert hex_pieces(b"\xe5\xa4") == "<0xE5><0xA4>"


@pytest.mark.parametrize("lead,n", [(0x41, 1), (0xC3, 2), (0xE5, 3), (0xF0, 4), (0xA4, None), (0xC0, None), (0xFF, None)])
def test_a_lead_byte_gives_its_characters_length(lead, n):
    assert char_length(lead) == n


@pytest.mark.parametrize("piece,label,short", [
    ("<0xE5>", "<0xE5> (1st byte of a 3-byte character)", "1st of 3 bytes"),
    ("<0xE7>", "<0xE7> (1st byte of a 3-byte character)", "1st of 3 bytes"),
    ("<0xE8><0x80>", "<0xE8><0x80> (1st and 2nd bytes of a 3-byte character)", "1–2 of 3 bytes"),
    ("<0xEF><0xBC>", "<0xEF><0xBC> (1st and 2nd bytes of a 3-byte character)", "1–2 of 3 bytes"),
    ("<0xF0><0x9F><0x98>", "<0xF0><0x9F><0x98> (1st–3rd bytes of a 4-byte character)", "1–3 of 4 bytes"),
    ("<0xA4>", "<0xA4> (a continuation byte of a character begun before)", "continues a character"),
    ("<0xA4><0xBD>", "<0xA4><0xBD> (2 continuation bytes of a character begun before)", "continues a character"),
    ("a<0xE5>", "a<0xE5> (ends with the 1st byte of a 3-byte character)", "1st of 3 bytes"),
    ("<0xBD>a", "<0xBD>a (begins with a continuation byte of a character begun before)", "continues a character"),
    ("<0xFF>", "<0xFF> (holds a byte no UTF-8 character has)", "not UTF-8"),
])
def test_byte_pieces_are_labelled_as_parts_of_a_character(piece, label, short):
    assert byte_label(piece) == label
    assert short_hint(piece) == short


@pytest.mark.parametrize("piece", ["the", "▁Paris", "好", "<|im_end|>", "", "😀"])
def test_whole_characters_have_no_label(piece):
    assert byte_hint(piece) == short_hint(piece) == "" and byte_label(piece) == piece
    assert split_bytes(piece) == (0, 0, 0)


def test_a_finished_character_is_named_and_an_unfinished_tail_found():
    assert completed_label(["<0xE5>", "<0xA5>", "<0xBD>"], "好") == "<0xE5><0xA5><0xBD> = 好"
    assert unfinished_tail(["今", "<0xE5>", "<0xA4>"]) == b"\xe5\xa4"
    assert unfinished_tail(["<0xE5>", "<0xA5>", "<0xBD>"]) == b""
    assert unfinished_tail(["a<0xF0><0x9F>"]) == b"\xf0\x9f"


@pytest.mark.parametrize("data", [b"plain", "今天".encode(), b"a\xe5\xa4b", b"\xe5\xa4", b"x\xff\xfe\xe4\xbd\xa0",
                                  "好".encode()[:2] + b"\xe4\xbd\xa0"])
def test_readable_text_writes_bytes_that_make_no_character_as_pieces(data):
    """Never "\ufffd": the text reads back to the very bytes (piece_bytes), and where the bytes
    are valid UTF-8 it is their decoding."""
    text = readable_text(data)
    assert "\ufffd" not in text and piece_bytes(text) == data
    if data.decode("utf-8", errors="replace").count("\ufffd") == 0:
        assert text == data.decode("utf-8")
    assert readable_text(b"a\xe5\xa4b") == "a<0xE5><0xA4>b"
