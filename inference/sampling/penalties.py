"""Stages that move the logits of tokens by what the context holds: logit bias, the
repetition, presence and frequency penalties, and DRY."""

from __future__ import annotations

import math

import torch

from inference.sampling.registry import stage
from inference.sampling.settings import decode_logit_bias

BAN = -100.0  # a bias at or below it bans the token
DRY_MAX_MATCH = 50  # text-generation-webui's cap on a repeat's length (keeps base^n finite)


def apply_logit_bias(logits: torch.Tensor, bias: tuple[tuple[int, float], ...]) -> torch.Tensor:
    """Add each (id, bias) to its token's logit; a bias of -100 or less bans the token (-inf)."""
    if not bias:
        return logits
    ids = torch.tensor([i for i, _ in bias], device=logits.device)
    add = torch.tensor([-math.inf if b <= BAN else b for _, b in bias], dtype=logits.dtype, device=logits.device)
    return logits.index_add(-1, ids, add.expand(*logits.shape[:-1], -1))


def apply_repetition_penalty(logits: torch.Tensor, penalty: float, seen: torch.Tensor | None) -> torch.Tensor:
    """Divide positive logits and multiply negative ones of every seen token by `penalty`.

    `seen` is a bool mask over the vocabulary: the prompt's and generated tokens (None: none known).
    """
    if penalty == 1.0 or seen is None:
        return logits
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


def apply_presence_frequency(logits: torch.Tensor, presence: float, frequency: float,
                             counts: torch.Tensor | None) -> torch.Tensor:
    """OpenAI's and vLLM's: logit - frequency * count - presence * (count > 0), counts over the
    generated tokens only."""
    if (presence == 0 and frequency == 0) or counts is None:
        return logits
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def dry_penalties(history: list[int], multiplier: float, base: float, allowed: int, last_n: int,
                  breakers: frozenset[int]) -> dict[int, float]:
    """DRY as text-generation-webui implements it: for each earlier occurrence of the last
    token, the repeat ending there is extended backwards (not across a sequence breaker, at most
    50 tokens); the token that followed it would continue the repeat, and is penalized by
    multiplier * base^(length - allowed) when the longest such repeat is >= allowed. Returns
    token id -> the amount subtracted from its logit."""
    ids = history[-last_n:] if last_n > 0 else history
    if multiplier == 0 or not ids or ids[-1] in breakers:
        return {}
    last, longest = ids[-1], {}
    for i in (i for i, t in enumerate(ids[:-1]) if t == last):
        nxt = ids[i + 1]
        if nxt in breakers:
            continue
        n = 1
        while n < DRY_MAX_MATCH:
            j = i - n
            if j < 0:
                break
            prev = ids[-(n + 1)]
            if ids[j] != prev or prev in breakers:
                break
            n += 1
        longest[nxt] = max(n, longest.get(nxt, 0))
    return {t: multiplier * base ** (n - allowed) for t, n in longest.items() if n >= allowed}


def apply_dry(logits: torch.Tensor, penalties: dict[int, float]) -> torch.Tensor:
    if not penalties:
        return logits
    ids = torch.tensor(list(penalties), device=logits.device)
    return logits.index_add(-1, ids, -torch.tensor(list(penalties.values()), dtype=logits.dtype, device=logits.device))


@stage("logit_bias")
def _logit_bias(logits, p, state):
    return apply_logit_bias(logits, decode_logit_bias(p.logit_bias.strip(), state and state.tokenizer))


@stage("repetition_penalty")
def _repetition(logits, p, state):
    return apply_repetition_penalty(logits, p.repetition_penalty, None if state is None else state.seen)


@stage("presence_penalty")
def _presence(logits, p, state):
    return apply_presence_frequency(logits, p.presence_penalty, 0.0, None if state is None else state.counts)


@stage("frequency_penalty")
def _frequency(logits, p, state):
    return apply_presence_frequency(logits, 0.0, p.frequency_penalty, None if state is None else state.counts)


@stage("dry_multiplier")
def _dry(logits, p, state):
    if p.dry_multiplier == 0 or state is None:
        return logits
    return apply_dry(logits, dry_penalties(state.history, p.dry_multiplier, p.dry_base,
                                           p.dry_allowed_length, p.dry_penalty_last_n, state.breakers))
