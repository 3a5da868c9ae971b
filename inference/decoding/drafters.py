"""Drafters for speculative decoding: each proposes up to k next tokens after a context, and the
distribution q it drew each from (None: a deterministic proposal, q one-hot at the token).

- PromptLookup: the tokens that followed the latest earlier occurrence of the context's last
  n-gram (n from 3 down to 1) in the context itself; no model.
- ModelDrafter: a model's own forward passes over a KV cache of its own: a second model with the
  same tokenizer, or the target's first L layers through its final norm and LM head (early exit,
  the logit lens's computation). q is the run's stages over its logits, as the target's p is.
"""

from __future__ import annotations

import torch

from inference.errors import InputError, shown
from inference.model.kv_cache import KVCache
from inference.sampling.stages import final_probs, sample


class PromptLookup:
    """n-gram matches in the context (prompt lookup decoding)."""
    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3):
        self.max_ngram = max_ngram

    def propose(self, ids: list[int], k: int, params, generator) -> list[tuple[int, torch.Tensor | None]]:
        for n in range(min(self.max_ngram, len(ids) - 1), 0, -1):
            tail = ids[-n:]
            for start in range(len(ids) - n - 1, -1, -1):  # the latest match first
                if ids[start:start + n] == tail:
                    return [(t, None) for t in ids[start + n:start + n + k]]
        return []


def forward_layers(model, tokens: list[int], cache: KVCache, start: int, layers: int) -> torch.Tensor:
    """tokens at positions start.. through the model's first `layers` layers, then its final norm
    and LM head: the last position's float32 logits (vocab,). With every layer, the model's own."""
    x = torch.tensor([tokens], device=model.device)  # (1, T)
    h = model.embed(x)  # (1, T, hidden)
    ropes = model._ropes(slice(start, start + len(tokens)))
    for i in range(layers):
        cos, sin = ropes[model.cfg.rope_kind(i)]
        h = model.layers[i](h, cos, sin, cache.k[i], cache.v[i], start, None, i)
    cache.length = start + len(tokens)
    return model.head(h[:, -1])[0]  # from (1, hidden)


class ModelDrafter:
    """A model's (or its first `layers` layers') proposals, from a KV cache it keeps across
    rounds: only the tokens it has not read (the target's correction, say) are fed again."""

    def __init__(self, model, layers: int, capacity: int, name: str):
        self.model, self.layers, self.name = model, layers, name
        self.cache = model.new_cache(capacity)
        self.ids: list[int] = []  # the tokens whose keys and values its cache holds, in order

    def propose(self, ids: list[int], k: int, params, generator) -> list[tuple[int, torch.Tensor | None]]:
        same = 0
        while same < min(len(self.ids), len(ids) - 1) and self.ids[same] == ids[same]:
            same += 1
        logits = forward_layers(self.model, ids[same:], self.cache, same, self.layers)
        self.ids = list(ids)
        out = []
        for i in range(k):
            q = final_probs(logits, params, None)  # (vocab,)
            token = int(q.argmax()) if params.greedy else int(sample(q[None], generator)[0, 0])
            out.append((token, q))
            if i < k - 1:
                logits = forward_layers(self.model, [token], self.cache, len(self.ids), self.layers)
                self.ids.append(token)
        return out


def same_ids(draft, target) -> bool:
    """Whether a draft model's ids are the target's: the same bytes for every id, the same width."""
    return (draft.tokenizer.token_bytes[:target.tokenizer.vocab_size] == target.tokenizer.token_bytes
            and draft.cfg.vocab_size == target.cfg.vocab_size)


def make_drafter(spec: str, target, capacity: int, models=None):
    """The drafter a --speculative value names: "prompt-lookup", "early-exit:L" (the target's
    first L layers, 1 <= L < its layers), or "model:NAME" (models(NAME) -> an engine whose
    tokenizer must give every id the target's bytes). InputError otherwise."""
    if spec == "prompt-lookup":
        return PromptLookup()
    kind, _, arg = spec.partition(":")
    if kind == "early-exit":
        n = target.cfg.n_layers
        if not arg.isdigit() or not 1 <= int(arg) < n:
            raise InputError(f"early-exit:L takes a layer count L from 1 to {n - 1}, got {shown(arg)}", field="speculative")
        return ModelDrafter(target.model, int(arg), capacity, spec)
    if kind == "model" and arg:
        if models is None:
            raise InputError("a draft model needs a second model loaded beside the target", field="speculative")
        draft = models(arg)
        if not same_ids(draft, target):
            raise InputError(f"the draft model {shown(arg)} has another tokenizer: its ids are not the target's",
                             field="speculative")
        return ModelDrafter(draft.model, draft.cfg.n_layers, capacity, spec)
    raise InputError(f"--speculative takes prompt-lookup, early-exit:L or model:NAME, got {shown(spec)}",
                     field="speculative")
