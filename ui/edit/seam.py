"""The edited output as token ids, and where its tokens differ from the run's: tokenizing the
edited text again can change the tokens of text the edit did not touch (the seam). Pure
functions of a tokenizer, no Gradio."""

from __future__ import annotations

import difflib
from dataclasses import dataclass


def edited_ids(tokenizer, prompt_text: str, prompt_ids: list[int], edited: str, chat: bool) -> list[int]:
    """The ids of the edited output after the prompt's ids, tokenized in context: the prompt's
    text and the edited text encoded together, the prompt's own ids then the rest. Where they
    would not keep the prompt's ids (the edit's first characters join the prompt's last token,
    or a chat template's control tokens, which typed text never encodes to), the edited text is
    encoded as text that continues the prompt (no BOS, no dummy-prefix space)."""
    if not chat:
        whole = tokenizer.encode(prompt_text + edited)
        if whole[:len(prompt_ids)] == list(prompt_ids):
            return whole[len(prompt_ids):]
    return tokenizer.encode_continuation(edited)


def token_bytes(tokenizer, token_id: int) -> bytes:
    """A token's bytes: the tokenizer's own table, else (a server's tokenizer) its decoded text."""
    table = tokenizer.token_bytes
    return table[token_id] if table is not None else tokenizer.decode([token_id]).encode("utf-8")


def spans(tokenizer, ids: list[int]) -> list[tuple[int, int]]:
    """Each token's [start, end) in the bytes of the ids' text."""
    out, at = [], 0
    for i in ids:
        n = len(token_bytes(tokenizer, i))
        out.append((at, at + n))
        at += n
    return out


@dataclass
class Change:
    """One place where the tokens differ: the run's tokens there (before) and the edited text's
    (after), as (id, piece). `near`: the place touches the edited text; `retokenized`: the
    run's tokens there whose text the edit did not touch. Away from the edit, the run's own
    tokens were not the tokenizer's way of writing their text (a model may spell a text in
    tokens the tokenizer never would)."""
    before: list[tuple[int, str]]
    after: list[tuple[int, str]]
    retokenized: int
    near: bool = True

    @property
    def seam(self) -> bool:
        """Text next to the edit, untouched by it, tokenized differently now."""
        return self.near and self.retokenized > 0


def edited_span(old: bytes, new: bytes) -> tuple[int, int]:
    """The [start, end) of the run's text (old) that the edit may have replaced. Where the
    common prefix and suffix overlap, the edit can sit anywhere in the overlap (" Asia and"
    put before " Europe" is "Asia and " put before "Europe"): the span covers every such place,
    so tokens there, whichever way the tokenizer split them, are the edit's own."""
    short = min(len(old), len(new))
    prefix = next((k for k, (a, b) in enumerate(zip(old, new)) if a != b), short)
    suffix = next((k for k in range(short) if old[-1 - k] != new[-1 - k]), short)
    # The edit read prefix first (the suffix what is left), and suffix first: the span of both.
    return min(prefix, short - suffix), len(old) - min(suffix, short - prefix)


def seam_changes(tokenizer, old_ids: list[int], new_ids: list[int]) -> list[Change]:
    """Where the edited text's tokens differ from the run's, in order. The edit is the bytes
    of the run's text between the texts' longest common prefix and suffix; a run's token in a
    changed place that lies wholly outside it is text the edit did not touch, tokenized
    differently now."""
    old = b"".join(token_bytes(tokenizer, i) for i in old_ids)
    new = b"".join(token_bytes(tokenizer, i) for i in new_ids)
    edited_start, edited_end = edited_span(old, new)
    old_spans = spans(tokenizer, old_ids) + [(len(old), len(old))]  # (an insertion at the end)
    piece = tokenizer.piece
    changes = []
    matcher = difflib.SequenceMatcher(None, old_ids, new_ids, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        start = old_spans[i1][0]
        end = old_spans[i2 - 1][1] if i2 > i1 else start  # (an insertion: where it goes)
        untouched = sum(1 for s, e in old_spans[i1:i2] if e <= edited_start or s >= edited_end)
        changes.append(Change([(i, piece(i)) for i in old_ids[i1:i2]], [(i, piece(i)) for i in new_ids[j1:j2]],
                              untouched, start <= edited_end and end >= edited_start))
    return changes
