"""A run's sampling state: what its stages read besides the logits, and its one update.

Built by the scheduler when a run starts and by replay from a run's recorded ids, so step s of
a replay reads exactly what step s of the run read. Stages only read it; `advance` is the one
place it changes, after a token is sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.errors import InputError
from inference.sampling.settings import decode_breakers, decode_logit_bias

COIN_STREAM = 0x5854_43  # "XTC": keeps XTC's generator apart from the draw's


def xtc_coin(seed: int, step: int) -> float:
    """XTC's coin at `step`, uniform in [0, 1): the first draw of a generator seeded from the
    run's seed and the step. A seed reproduces it, replay draws the same one, and the run's
    generator for the token draw is untouched (a run without XTC samples as before)."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + step * 7919 + COIN_STREAM) % 2**63)
    return float(torch.rand(1, generator=g, dtype=torch.float64))


def breaker_ids(text: str, tokenizer) -> frozenset[int]:
    """DRY's sequence breakers as token ids, as text-generation-webui finds them: the last token
    of 'a' + the breaker's text."""
    if tokenizer is None:
        return frozenset()
    return frozenset(tokenizer.encode(f"a{b}", add_bos=False)[-1] for b in decode_breakers(text.strip()))


def check_vocab(params, vocab: int, tokenizer=None) -> None:
    """Logit bias names token ids of this vocabulary (its text, encoded by `tokenizer`); a
    one-line InputError otherwise."""
    for tid, _ in decode_logit_bias(params.logit_bias, tokenizer):
        if tid >= vocab:
            raise InputError(f"logit_bias names token {tid} but the vocabulary has {vocab} tokens",
                             field="logit_bias")


@dataclass
class RunState:
    """What one run's stages read at a step besides its logits."""
    seen: torch.Tensor  # (vocab,) bool: the prompt's and generated tokens (repetition penalty)
    counts: torch.Tensor  # (vocab,) float32: times each token was generated (presence, frequency)
    history: list[int]  # the prompt and generated ids, in order (DRY)
    breakers: frozenset[int]  # DRY's sequence-breaker token ids
    seed: int  # the run's seed (XTC's coin)
    step: int = 0  # tokens generated before this step
    mu: float | None = None  # Mirostat's μ entering this step (None: Mirostat off)
    coin: float | None = None  # XTC's coin this step (None: XTC off)
    tokenizer: object = None  # encodes logit bias's text (None: the bias names token ids only)
    constraint: object = None  # constrain.Matcher: the tokens the run's constraint allows (None: none)

    @classmethod
    def at(cls, params, prompt_ids: list[int], generated: list[int], vocab: int, seed: int = 0,
           mu: float | None = None, tokenizer=None, device=None) -> "RunState":
        """The state entering the step after `generated`: a run's start (generated empty), or a
        replay's (mu: the μ the run recorded for that step; None: Mirostat's start, 2τ)."""
        ids = list(prompt_ids) + list(generated)
        seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        counts = torch.zeros(vocab, dtype=torch.float32, device=device)
        if ids:
            seen[torch.tensor(ids, device=device)] = True
        if generated:
            counts.index_add_(0, torch.tensor(generated, device=device), torch.ones(len(generated), device=device))
        breakers = breaker_ids(params.dry_sequence_breakers, tokenizer) if params.dry_multiplier else frozenset()
        state = cls(seen, counts, ids, breakers, seed, len(generated), tokenizer=tokenizer)
        if params.mirostat_tau > 0:
            state.mu = mu if mu is not None else 2.0 * params.mirostat_tau
        state.coin = xtc_coin(seed, state.step) if params.xtc_probability > 0 else None
        if params.constraint:
            from inference.sampling.constrain import matcher
            state.constraint = matcher(params.constraint, params.constraint_text, tokenizer, vocab, generated)
        return state

    @classmethod
    def from_seen(cls, seen: torch.Tensor) -> "RunState":
        """A state that knows only which tokens were seen (nothing generated yet)."""
        return cls(seen, torch.zeros(seen.shape, dtype=torch.float32, device=seen.device), [], frozenset(), 0)

    def advance(self, token: int, final_prob: float, params) -> None:
        """Take the token sampled at this step (final_prob: its probability in the distribution
        sampled from) and move to the next step."""
        if self.seen.device.type == "cpu":  # through numpy: with torch's index assignments a step's
            self.seen.numpy()[token] = True  # events at 8 runs took 0.71-0.78 ms, with numpy's 0.56-0.58
            self.counts.numpy()[token] += 1  # (float32 either way: the same number)
        else:
            self.seen[token] = True
            self.counts[token] += 1
        self.history.append(token)
        self.step += 1
        if self.mu is not None:  # Mirostat v2: μ -= η (surprise - τ), surprise in bits
            surprise = -torch.log2(torch.tensor(max(final_prob, 1e-45), dtype=torch.float64)).item()
            self.mu -= params.mirostat_eta * (surprise - params.mirostat_tau)
        if self.coin is not None:
            self.coin = xtc_coin(self.seed, self.step)
        if self.constraint is not None and not self.constraint.accept(token):
            raise InputError(f"the constraint does not allow token {token} ({self.tokenizer.piece(token)!r}) at step "
                             f"{self.step - 1}: the stages before it kept no token it allows")

    def recorded(self) -> dict | None:
        """What a step must record for replay to start from the same state (None: nothing)."""
        return None if self.mu is None else {"mirostat_mu": self.mu}
