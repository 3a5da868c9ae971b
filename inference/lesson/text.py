"""Chapter 1, Tokenize: the prompt's pieces and ids, and which characters each token makes."""

from __future__ import annotations

from inference.loading.byte_pieces import byte_hint, completed_label


def tokenize(tokenizer, text: str, ids: list[int]) -> dict:
    """The ids the model reads, their pieces, and the characters they make: a run of byte tokens
    that makes one character is named ("<0xE5><0xA5><0xBD> = 好"), a token of several characters
    says how many."""
    pieces = [tokenizer.piece(i) for i in ids]
    tokens = [{"position": p, "id": i, "piece": piece, "bytes": len(tokenizer.token_bytes[i]),
               "control": tokenizer.is_control(i), "byte_hint": byte_hint(piece)}
              for p, (i, piece) in enumerate(zip(ids, pieces))]
    groups = []
    for positions, complete in tokenizer.char_groups(ids):
        group_ids = [ids[p] for p in positions]
        chars = "" if any(tokenizer.is_control(i) for i in group_ids) else tokenizer.decode(group_ids, unfinished="")
        n = len(positions)
        label = (completed_label([pieces[p] for p in positions], chars) if n > 1 and complete
                 else "".join(pieces[p] for p in positions))
        groups.append({"positions": list(positions), "text": chars, "chars": len(chars), "tokens": n,
                       "complete": complete, "label": label,
                       "kind": ("control token" if not chars and n == 1 else
                                "one character in several byte tokens" if n > 1 else
                                "one token, several characters" if len(chars) > 1 else "one token, one character")})
    split = [g for g in groups if g["tokens"] > 1]
    merged = [g for g in groups if g["chars"] > 1]
    return {"text": text, "ids": list(ids), "pieces": pieces, "tokens": tokens, "groups": groups,
            "n_tokens": len(ids), "n_chars": len(text), "vocab_size": tokenizer.vocab_size,
            "tokenizer": tokenizer.kind, "byte_tokens": sum(1 for t in tokens if t["byte_hint"]),
            "examples": {"split_character": split[0]["label"] if split else None,
                         "multi_character_token": merged[0]["label"] if merged else None}}
