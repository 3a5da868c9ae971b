"""Tokenization: text <-> ids for sentencepiece and byte-level BPE, and streaming detokenization.

Both backends are reduced to one table, the bytes each token stands for, so that decoding,
display pieces and the streaming detokenizer work the same way for every model.
"""

from __future__ import annotations

import codecs
import json
import re
from pathlib import Path

from inference.errors import ModelError


def _hex_bytes(err: UnicodeDecodeError):
    return "".join(f"<0x{b:02X}>" for b in err.object[err.start:err.end]), err.end


codecs.register_error("tokenlab_hex", _hex_bytes)


def gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: each printable stand-in character -> its byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _metaspace_bytes(piece: str) -> bytes:
    """A sentencepiece-style piece: '<0xNN>' is one raw byte, '\u2581' is a space."""
    m = _BYTE_PIECE.match(piece)
    return bytes([int(m.group(1), 16)]) if m else piece.replace("\u2581", " ").encode("utf-8")


class StreamDecoder:
    """Turns a stream of token ids into text without ever emitting a broken character.

    Bytes of a multi-byte UTF-8 character split over several tokens are held until complete;
    bytes that can never form a character become U+FFFD. A character the stream ends inside
    is no text at all, never U+FFFD: flush() returns nothing for it and keeps its bytes in
    `cut`, so that whoever shows the text can say the run cut them off.
    """

    def __init__(self, token_bytes: list[bytes]):
        self._token_bytes = token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.cut = b""  # after flush(): the bytes of the character the stream ended inside

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._token_bytes[token_id])

    @property
    def held(self) -> bytes:
        """The bytes of a character begun and not yet finished (the decoder holds only bytes
        that some next byte could still finish: any others it has turned into U+FFFD)."""
        return self._utf8.getstate()[0]

    def flush(self) -> str:
        """The end of the stream: the text still to come, which is none. The bytes of a
        character it ended inside go to `cut`, not into the text."""
        self.cut = self.held
        self._utf8.reset()
        return ""


class Tokenizer:
    """encode/decode plus the per-token bytes and display pieces the engine reports."""

    def __init__(self, *, encode_fn, token_bytes: list[bytes], raw_pieces: list[str],
                 continue_fn=None, template_fn=None,
                 bos_id: int | None, eos_ids: tuple[int, ...], add_bos: bool,
                 special_tokens: dict[str, int], chat_template: str | None, kind: str,
                 normalizer_shrink: int = 1):
        """encode_fn and continue_fn encode text as text: a control token's spelling typed by a
        user stays characters. template_fn turns control-token text into its id (templates).
        normalizer_shrink: how many typed characters the tokenizer's normalizer may turn into
        one (1: it keeps every character; see max_token_chars)."""
        self._encode_fn = encode_fn
        self._continue_fn = continue_fn or encode_fn
        self._template_fn = template_fn or (lambda text, continuing=False: encode_fn(text))
        self.token_bytes = token_bytes
        self.raw_pieces = raw_pieces
        self.bos_id, self.eos_ids, self.add_bos = bos_id, eos_ids, add_bos
        self.special_tokens = special_tokens
        self.chat_template = chat_template
        self.kind = kind  # "sentencepiece" or "bpe"
        self._pieces = [b.decode("utf-8", errors="tokenlab_hex") for b in token_bytes]
        for text, i in special_tokens.items():
            self._pieces[i] = text
        self._control_ids = frozenset(special_tokens.values()) | {i for i in (bos_id, *eos_ids) if i is not None}
        # The most characters of typed text one token can stand for: the longest token's text
        # (each byte of a split character counts as a character), times what the normalizer
        # may merge. n tokens never hold more than n * max_token_chars characters, so longer
        # text is refused by its length alone, before any tokenizing (Engine.check_fits).
        longest = max((len(b.decode("utf-8", errors="replace")) for b in token_bytes), default=1)
        self.max_token_chars = max(1, longest) * max(1, normalizer_shrink)

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    @property
    def bos_token(self) -> str:
        return "" if self.bos_id is None else self.raw_pieces[self.bos_id]

    @property
    def eos_token(self) -> str:
        return self.raw_pieces[self.eos_ids[0]] if self.eos_ids else ""

    def pad_to(self, vocab_size: int) -> None:
        """Cover ids past the table (padding rows of a model's embedding): they decode to nothing."""
        for i in range(self.vocab_size, vocab_size):
            self.token_bytes.append(b"")
            self.raw_pieces.append("")
            self._pieces.append(f"<unused {i}>")

    def encode(self, text: str, add_bos: bool | None = None, controls: bool = False) -> list[int]:
        """The ids of text a user typed, BOS per config: text that spells a control token
        ("</s>", "<|im_end|>") is encoded as the characters it is, never as the control token;
        with `controls` as that token, as Hugging Face tokenizers and vLLM read a prompt (the API's)."""
        ids = self._template_fn(text, False) if controls else self._encode_fn(text)
        add = self.add_bos if add_bos is None else add_bos
        if add and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id] + ids
        return ids

    def encode_continuation(self, text: str, controls: bool = False) -> list[int]:
        """Ids of text that continues earlier text: no BOS, no sentencepiece dummy-prefix space;
        control-token spellings stay text unless `controls`, as in encode."""
        return self._template_fn(text, True) if controls else self._continue_fn(text)

    def encode_template(self, text: str, continuing: bool = False) -> list[int]:
        """Ids of text a chat template wrote: its control-token text becomes the token's id."""
        return self._template_fn(text, continuing)

    def decode(self, ids: list[int], unfinished: str = "\ufffd") -> str:
        """Text of the ids as a continuation: special tokens appear as their text. `unfinished`
        stands for the bytes of a character the last ids leave unfinished: U+FFFD by default (as
        Hugging Face tokenizers and vLLM decode), "" as a run's text has it (StreamDecoder)."""
        data = b"".join(self.token_bytes[i] for i in ids)
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = utf8.decode(data)
        return text + (unfinished if utf8.getstate()[0] else "")

    def unfinished_bytes(self, ids: list[int]) -> bytes:
        """The bytes of a character the last ids begin and do not finish (b"": none)."""
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        utf8.decode(b"".join(self.token_bytes[i] for i in ids))
        return utf8.getstate()[0]

    def piece(self, token_id: int) -> str:
        """A readable piece: the token's text, with bytes of a split character as <0xNN>."""
        return self._pieces[token_id]

    def continuation_text(self, ids: list[int]) -> str:
        """The text of tokens that follow a prompt, as a run streams it (a piece's leading space
        kept, which decoding them alone would drop). Bytes of a character the last of them leaves
        unfinished are not in it: the run that continues after them streams that character."""
        stream = self.stream()
        return "".join(stream.push(t) for t in ids)

    def stream(self) -> StreamDecoder:
        return StreamDecoder(self.token_bytes)

    def char_groups(self, ids: list[int]) -> list[tuple[range, bool]]:
        """Runs of consecutive tokens whose bytes make whole characters together: (positions in
        ids, complete). A token that is whole characters is a run of one; byte tokens of one
        character form one run; the last run is incomplete when ids end inside a character."""
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        groups, start = [], 0
        for i, token_id in enumerate(ids):
            utf8.decode(self.token_bytes[token_id])
            if not utf8.getstate()[0]:  # nothing held: the run ends here
                groups.append((range(start, i + 1), True))
                start = i + 1
        if start < len(ids):
            groups.append((range(start, len(ids)), False))
        return groups

    def is_control(self, token_id: int) -> bool:
        return token_id in self._control_ids


# ---------------------------------------------------------------- loading from a directory

def _token_content(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read {path.name}: {e}") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path.name}: expected a JSON object")
    return data


def read_chat_template(model_dir: Path, tok_cfg: dict) -> str | None:
    """The chat template: chat_template.jinja, or tokenizer_config.json's chat_template."""
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.exists():
        return jinja_file.read_text(encoding="utf-8")
    tmpl = tok_cfg.get("chat_template")
    if isinstance(tmpl, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
        tmpl = named.get("default") or next(iter(named.values()), None)
    return tmpl if isinstance(tmpl, str) else None


def load_tokenizer(model_dir: Path, bos_id: int | None = None,
                   eos_ids: tuple[int, ...] = ()) -> Tokenizer:
    """Load tokenizer.json (tokenizers) or tokenizer.model (sentencepiece) plus its config."""
    model_dir = Path(model_dir)
    cfg_path = model_dir / "tokenizer_config.json"
    tok_cfg = _read_json(cfg_path) if cfg_path.exists() else {}
    if (model_dir / "tokenizer.json").exists():
        return _load_hf_tokenizers(model_dir, tok_cfg, bos_id, eos_ids)
    if (model_dir / "tokenizer.model").exists():
        return _load_sentencepiece(model_dir, tok_cfg, bos_id, eos_ids)
    raise ModelError(f"{model_dir}: no tokenizer.json or tokenizer.model")


def _resolve_special(tok_cfg: dict, lookup, bos_id, eos_ids):
    bos_text, eos_text = _token_content(tok_cfg.get("bos_token")), _token_content(tok_cfg.get("eos_token"))
    if bos_text is not None and lookup(bos_text) is not None:
        bos_id = lookup(bos_text)
    eos = lookup(eos_text) if eos_text is not None else None
    if eos is not None and eos not in eos_ids:
        eos_ids = (eos,) + tuple(eos_ids)
    return bos_id, tuple(eos_ids)


# A normalizer that may delete characters (collapse whitespace, strip accents or control
# characters) or a model that fuses unknown characters bounds nothing: its text is allowed this
# many characters per token of the longest, a bound typed text reaches only by padding.
UNBOUNDED_SHRINK = 16
# NFC/NFKC composition turns at most 4 code points into one (the longest canonical decomposition).
COMPOSITION_SHRINK = 4


def _hf_normalizer_shrink(spec: dict | None) -> int:
    """How many characters a tokenizers.json normalizer may turn into one."""
    if not spec:
        return 1
    kind = spec.get("type")
    if kind == "Sequence":
        out = 1
        for sub in spec.get("normalizers") or []:
            out *= _hf_normalizer_shrink(sub)
        return min(out, UNBOUNDED_SHRINK)
    if kind in ("NFD", "NFKD", "Lowercase", "Prepend"):
        return 1
    if kind in ("NFC", "NFKC"):
        return COMPOSITION_SHRINK
    if kind == "Replace":
        pattern = (spec.get("pattern") or {}).get("String")
        if isinstance(pattern, str) and pattern and len(spec.get("content") or "") >= len(pattern):
            return 1
    return UNBOUNDED_SHRINK


def _hf_shrink(spec: dict) -> int:
    model = spec.get("model") or {}
    absorbing = any(not t.get("special") and (t.get("lstrip") or t.get("rstrip"))
                    for t in spec.get("added_tokens") or [])
    if absorbing or (model.get("fuse_unk") and not model.get("byte_fallback")):
        return UNBOUNDED_SHRINK
    return _hf_normalizer_shrink(spec.get("normalizer"))


def _sentencepiece_shrink(proto) -> int:
    norm = proto.normalizer_spec
    if norm.remove_extra_whitespaces or not proto.trainer_spec.byte_fallback:
        return UNBOUNDED_SHRINK  # collapsed whitespace; runs of unknown characters in one <unk>
    if norm.name in ("identity", ""):
        return 1
    if norm.name in ("nfkc", "nfkc_cf"):
        return COMPOSITION_SHRINK
    return UNBOUNDED_SHRINK


def _load_hf_tokenizers(model_dir: Path, tok_cfg: dict, bos_id, eos_ids) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    path = model_dir / "tokenizer.json"
    try:
        tok = HFTokenizer.from_file(str(path))
        spec = json.loads(path.read_text(encoding="utf-8"))
    except Exception as e:  # the tokenizers library raises plain Exception subclasses
        raise ModelError(f"{path.name}: cannot load ({e})") from None
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    raw = [tok.id_to_token(i) or "" for i in range(vocab_size)]
    byte_level = "ByteLevel" in json.dumps(spec.get("decoder"))
    if byte_level:
        table = gpt2_byte_decoder()
        token_bytes = [bytes(table.get(c, 0) for c in p) if all(c in table for c in p)
                       else p.encode("utf-8") for p in raw]
    else:
        token_bytes = [_metaspace_bytes(p) for p in raw]
    added = {i: t for i, t in tok.get_added_tokens_decoder().items() if i < vocab_size}
    for i, t in added.items():
        token_bytes[i] = t.content.encode("utf-8")
    specials = {t.content: i for i, t in added.items() if t.special}
    bos_id, eos_ids = _resolve_special(tok_cfg, tok.token_to_id, bos_id, eos_ids)
    add_bos = tok_cfg.get("add_bos_token")
    if add_bos is None:  # decided by the post-processor, as transformers does
        with_special = tok.encode("a", add_special_tokens=True).ids
        add_bos = bos_id is not None and bool(with_special) and with_special[0] == bos_id
    as_text = HFTokenizer.from_file(str(path))
    as_text.encode_special_tokens = True  # control-token spellings are split like any text
    return Tokenizer(
        encode_fn=lambda text: as_text.encode(text, add_special_tokens=False).ids,
        template_fn=lambda text, continuing=False: tok.encode(text, add_special_tokens=False).ids,
        token_bytes=token_bytes, raw_pieces=raw, bos_id=bos_id, eos_ids=eos_ids,
        add_bos=bool(add_bos), special_tokens=specials,
        chat_template=read_chat_template(model_dir, tok_cfg), kind="bpe", normalizer_shrink=_hf_shrink(spec))


def _load_sentencepiece(model_dir: Path, tok_cfg: dict, bos_id, eos_ids) -> Tokenizer:
    import sentencepiece as spm

    path = model_dir / "tokenizer.model"
    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(str(path))
    except (OSError, RuntimeError) as e:
        raise ModelError(f"{path.name}: not a sentencepiece model ({e})") from None
    n = sp.GetPieceSize()
    raw = [sp.IdToPiece(i) for i in range(n)]
    token_bytes = []
    for i, p in enumerate(raw):
        if sp.IsControl(i):
            token_bytes.append(b"")
        elif sp.IsUnknown(i):
            token_bytes.append(" \u2047 ".encode("utf-8"))
        else:
            token_bytes.append(_metaspace_bytes(p))
    # Special tokens appear as text in rendered chat templates; sentencepiece would spell them
    # out letter by letter, so split them off and map them to their ids first.
    specials = {raw[i]: i for i in range(n) if sp.IsControl(i) and raw[i]}
    for key, value in (tok_cfg.get("added_tokens_decoder") or {}).items():
        content = _token_content(value)
        if content and str(key).isdigit() and int(key) < n:
            specials[content] = int(key)
    bos_id = sp.bos_id() if sp.bos_id() >= 0 and bos_id is None else bos_id
    if not eos_ids and sp.eos_id() >= 0:
        eos_ids = (sp.eos_id(),)
    bos_id, eos_ids = _resolve_special(tok_cfg, lambda t: specials.get(t), bos_id, eos_ids)
    pattern = re.compile("(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")") \
        if specials else None

    # Text after a special token continues a line: no dummy-prefix space there (as the
    # Hugging Face fast tokenizers do), so a second processor has the prefix switched off.
    from sentencepiece import sentencepiece_model_pb2 as pb
    proto = pb.ModelProto.FromString(path.read_bytes())
    proto.normalizer_spec.add_dummy_prefix = False
    sp_inner = spm.SentencePieceProcessor()
    sp_inner.LoadFromSerializedProto(proto.SerializeToString())

    def encode(text: str, continuing: bool = False, controls: bool = False) -> list[int]:
        """controls: control-token text becomes its id (a template's); else it stays text, its
        first character encoded apart so that no symbol of the model can match it."""
        if pattern is None:
            return (sp_inner if continuing else sp).EncodeAsIds(text)
        ids: list[int] = []
        for part in pattern.split(text):
            if part in specials and controls:
                ids.append(specials[part])
            elif part in specials:
                ids.extend((sp_inner if ids or continuing else sp).EncodeAsIds(part[0]))
                ids.extend(sp_inner.EncodeAsIds(part[1:]))
            elif part:
                ids.extend((sp_inner if ids or continuing else sp).EncodeAsIds(part))
        return ids

    return Tokenizer(
        encode_fn=encode, continue_fn=lambda text: encode(text, continuing=True),
        template_fn=lambda text, continuing=False: encode(text, continuing, controls=True),
        token_bytes=token_bytes, raw_pieces=raw, bos_id=bos_id, eos_ids=eos_ids,
        add_bos=bool(tok_cfg.get("add_bos_token", True)), special_tokens=specials,
        chat_template=read_chat_template(model_dir, tok_cfg), kind="sentencepiece",
        normalizer_shrink=_sentencepiece_shrink(proto))
