"""Byte tokens in words: a piece such as "<0xE5>" or "<0xE8><0x80>" holds bytes of a UTF-8
character that the tokens after it finish. These functions say which bytes of which character
a piece holds, and name the character once the run has finished it. Pure functions of pieces
as Tokenizer.piece writes them (bytes of a split character as <0xNN>), no tokenizer needed."""

from __future__ import annotations

import re

HEX_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def piece_bytes(piece: str) -> bytes:
    """The bytes a piece stands for: each <0xNN> one byte, any other text its UTF-8."""
    out, at = bytearray(), 0
    for m in HEX_PIECE.finditer(piece):
        out += piece[at:m.start()].encode("utf-8")
        out.append(int(m.group(1), 16))
        at = m.end()
    out += piece[at:].encode("utf-8")
    return bytes(out)


def char_length(lead: int) -> int | None:
    """How many bytes the UTF-8 character that starts with byte `lead` has; None for a byte
    that starts none (a continuation byte, 0x80–0xBF, or one UTF-8 never uses)."""
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return None


def _is_continuation(b: int) -> bool:
    return 0x80 <= b <= 0xBF


def _ordinals(have: int) -> str:
    return "1st byte" if have == 1 else ("1st and 2nd bytes" if have == 2 else f"1st–{_nth(have)} bytes")


def _nth(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def split_bytes(piece: str) -> tuple[int, int, int] | None:
    """A piece's bytes of split characters: (continuation bytes it begins with, which end a
    character begun before; bytes of the character it ends inside; that character's length),
    (0, 0, 0) for a piece of whole characters, None for one holding a byte no UTF-8 character has."""
    if not HEX_PIECE.search(piece):
        return 0, 0, 0
    data = piece_bytes(piece)
    if any(char_length(b) is None and not _is_continuation(b) for b in data):
        return None
    lead = 0
    while lead < len(data) and _is_continuation(data[lead]):
        lead += 1
    i = lead
    while i < len(data):
        n = char_length(data[i]) or 1  # (a stray continuation byte inside: taken as one)
        if i + n > len(data):
            return lead, len(data) - i, n
        i += n
    return lead, 0, 0


def byte_hint(piece: str) -> str:
    """What the bytes of a split character in a piece are, in words ("" for a piece of whole
    characters): "1st byte of a 3-byte character" for <0xE5>, "1st and 2nd bytes of a 3-byte
    character" for <0xE8><0x80>, "a continuation byte of a character begun before" for <0xA4>;
    a piece with other text says "begins with ..." / "ends with ..."."""
    split = split_bytes(piece)
    if split is None:
        return "holds a byte no UTF-8 character has"
    lead, tail, need = split
    only = len(piece_bytes(piece)) == lead + tail
    parts = []
    if lead:
        cont = ("a continuation byte" if lead == 1 else f"{lead} continuation bytes") + " of a character begun before"
        parts.append(cont if only and not tail else "begins with " + cont)
    if tail:
        own = f"{_ordinals(tail)} of a {need}-byte character"
        parts.append(own if only and not lead else "ends with the " + own)
    return ", ".join(parts)


def short_hint(piece: str) -> str:
    """byte_hint in a few words, for a narrow column: "1st of 3 bytes", "1–2 of 3 bytes",
    "continues a character" ("" for a piece of whole characters)."""
    split = split_bytes(piece)
    if split is None:
        return "not UTF-8"
    lead, tail, need = split
    if tail:
        return f"1st of {need} bytes" if tail == 1 else f"1–{tail} of {need} bytes"
    return "continues a character" if lead else ""


def byte_label(piece: str) -> str:
    """The piece with what its bytes are: "<0xE5> (1st byte of a 3-byte character)"; a piece of
    whole characters as it is."""
    hint = byte_hint(piece)
    return f"{piece} ({hint})" if hint else piece


def completed_label(pieces: list[str], char: str) -> str:
    """The byte tokens of a character the run finished, and the character:
    "<0xE5><0xA5><0xBD> = 好"."""
    return f"{''.join(pieces)} = {char}"


def unfinished_tail(pieces: list[str]) -> bytes:
    """The bytes of a character the last pieces begin and do not finish (b"": none): what a run
    made of these tokens leaves cut off."""
    return unfinished_tail_bytes(b"".join(piece_bytes(p) for p in pieces))


def unfinished_tail_bytes(data: bytes) -> bytes:
    """The bytes of a character the end of data begins and does not finish (b"": none)."""
    import codecs
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    utf8.decode(data)
    return utf8.getstate()[0]


def hex_pieces(data: bytes) -> str:
    """Bytes written as pieces are: <0xE5><0xA4>."""
    return "".join(f"<0x{b:02X}>" for b in data)


def readable_text(data: bytes) -> str:
    """UTF-8 text where bytes that make no character are written as their pieces
    ("ab<0xE5><0xA4>c"), never as "\ufffd": a reader sees which bytes the model made."""
    out, at = [], 0
    while True:
        try:
            out.append(data[at:].decode("utf-8"))
            return "".join(out)
        except UnicodeDecodeError as e:  # e.start, e.end: the bad bytes within data[at:]
            out.append(data[at:at + e.start].decode("utf-8") + hex_pieces(data[at + e.start:at + e.end]))
            at += e.end
