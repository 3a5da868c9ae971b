"""The served model's tokenizer, through the server's /tokenize and /detokenize."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from inference.errors import ServerError
from inference.remote.http import ServerHTTP


class RemoteTokenizer:
    """The served model's tokenizer, through the server: /tokenize, and each token's piece from
    /detokenize (cached: a piece never changes). What the server does not say is None
    (inference.contract's Tokenizer)."""
    vocab_size = None  # the server checks its own ids
    bos_token = eos_token = chat_template = None
    token_bytes = None

    def __init__(self, http: ServerHTTP, model: str):
        self._http, self._model = http, model
        self._pieces: dict[int, str] = {}  # at most one a token of the vocabulary
        self._lock = threading.Lock()
        self._prefix: tuple[int, str] | None = None

    def encode(self, text: str, add_bos: bool | None = None, controls: bool = True) -> list[int]:
        """Ids as the server feeds the model (add_bos=False: no special tokens added). Whether
        control-token text becomes the token is the server's tokenizer's to say (vLLM's: it does)."""
        body = {"model": self._model, "prompt": text, "add_special_tokens": add_bos is not False}
        return token_ids(self._http.post_json("/tokenize", body, root=True))

    def encode_continuation(self, text: str, controls: bool = True) -> list[int]:
        return self.encode(text, add_bos=False)

    def decode(self, ids: list[int]) -> str:
        return _text(self._http.post_json("/detokenize", {"model": self._model, "tokens": list(ids)},
                                          root=True))

    def continuation_text(self, ids: list[int]) -> str:
        """The server's own decoding of them."""
        return self.decode(ids) if ids else ""

    def piece(self, token_id: int) -> str:
        return self.pieces([token_id])[token_id]

    def char_groups(self, ids: list[int]) -> list[tuple[range, bool]]:
        """Each token on its own: the server does not give a token's bytes, so byte tokens of
        one character are not grouped (their text arrives whole with the last of them)."""
        return [(range(i, i + 1), True) for i in range(len(ids))]

    def is_control(self, token_id: int) -> bool:
        """Not known: the server does not say which tokens are control tokens."""
        return False

    def pieces(self, ids) -> dict[int, str]:
        """{id: piece} for ids, fetching the ones not seen yet (a few requests at a time)."""
        missing = [i for i in dict.fromkeys(ids) if i not in self._pieces]
        if len(missing) > 4:
            with ThreadPoolExecutor(4) as pool:
                found = list(pool.map(self._fetch_piece, missing))
        else:
            found = [self._fetch_piece(i) for i in missing]
        with self._lock:
            self._pieces.update(zip(missing, found))
            return {i: self._pieces[i] for i in ids}

    def _fetch_piece(self, token_id: int) -> str:
        # Decoded after a fixed token and cut after that token's text: a sentencepiece decoder
        # drops the leading space of the first token only, so " Paris" keeps its space.
        if self._prefix is None:
            first = self.encode("a", add_bos=False)[:1]
            self._prefix = (first[0], self.decode(first)) if first else (-1, "")
        pid, ptext = self._prefix
        if pid >= 0:
            text = self.decode([pid, token_id])
            if text.startswith(ptext):
                return text[len(ptext):]
        return self.decode([token_id])


def token_ids(answer) -> list[int]:
    try:
        ids = answer["tokens"]
        return [int(i) for i in ids]
    except (KeyError, TypeError, ValueError):
        raise ServerError("the model server's /tokenize answer has no token ids") from None


def _text(answer) -> str:
    if not isinstance(answer, dict) or not isinstance(answer.get("prompt"), str):
        raise ServerError("the model server's /detokenize answer has no text")
    return answer["prompt"]
