"""What a server's log-probabilities say about one generated token, in the engine's terms.

vLLM returns, per new token, the log-probabilities of its top N candidates and of the chosen
token (N = the request's `logprobs`, at most the server's --max-logprobs). Which distribution
those numbers come from depends on the server's --logprobs-mode and on the request:

- raw_logprobs (vLLM's default): the model's own distribution, before any sampling setting;
- processed_logprobs: after repetition penalty, temperature, min-p, top-k and top-p, i.e. the
  distribution sampled from; for a greedy request, after the penalty only (no temperature).

Our StepEvent has two: `raw_prob` (the model's own) and `prob` (the one sampled from). A number
fills a field only where the settings make the two the same distribution; otherwise the field is
None. Greedy's distribution sampled from is all on the chosen token, as the local engine reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inference.errors import ServerError
from inference.events import Candidate
from inference.sampling.settings import BY_NAME

MODES = ("raw", "processed")
_ID_PREFIX = "token_id:"


@dataclass(frozen=True)
class Meaning:
    """What the server's numbers are for one request's settings."""
    raw: bool  # they are the model's own distribution (temperature 1, nothing filtered)
    final: bool  # they are the distribution sampled from
    one_hot: bool  # greedy: the distribution sampled from is 1 on the chosen token
    ranked: bool  # their order is the raw distribution's order (a rank among them is the rank)


def meaning(mode: str, params) -> Meaning:
    greedy = params.greedy
    # No stage that reorders tokens (the repetition penalty) moves them.
    no_penalty = all(BY_NAME[n].keeps_order for n in params.changed)
    plain = params.plain  # the distribution sampled from is the model's own
    if mode == "raw":
        return Meaning(raw=True, final=plain, one_hot=greedy, ranked=True)
    if greedy:  # processed, greedy: the penalised logits, no temperature applied
        return Meaning(raw=no_penalty, final=False, one_hot=True, ranked=no_penalty)
    # processed, sampled: temperature and the filters keep the order; the penalty does not.
    return Meaning(raw=plain, final=True, one_hot=False, ranked=no_penalty)


def token_id(key: str) -> int:
    """'token_id:7042' -> 7042 (the form asked for with return_tokens_as_token_ids)."""
    if not key.startswith(_ID_PREFIX):
        raise ServerError(f"the server named a token {key!r} instead of its id: it ignored "
                          "return_tokens_as_token_ids (Token Lab needs vLLM's OpenAI API)")
    return int(key[len(_ID_PREFIX):])


@dataclass
class TokenNumbers:
    """One generated token's numbers, each None where the server's answer does not give it."""
    prob: float | None
    raw_prob: float | None
    rank: int | None
    top: list[tuple[int, float | None, float | None]]  # (id, prob, raw_prob), most likely first


def token_numbers(chosen: int, chosen_logprob: float | None, top_logprobs: dict | None,
                  top_n: int, m: Meaning) -> TokenNumbers:
    """The chosen token's numbers and its top_n candidates (the chosen one always listed)."""
    if top_logprobs is None or chosen_logprob is None:
        return TokenNumbers(None, None, None, [])

    def pair(i: int, logprob: float) -> tuple[float | None, float | None]:
        p = math.exp(logprob)  # vLLM writes -inf (filtered) as -9999: exp gives 0
        final = (1.0 if i == chosen else 0.0) if m.one_hot else (p if m.final else None)
        return final, (p if m.raw else None)

    entries = sorted(((token_id(k), float(v)) for k, v in top_logprobs.items()),
                     key=lambda e: (-e[1], e[0]))
    shown = entries[:top_n]
    in_top = any(i == chosen for i, _ in shown)
    # Among the top N every more likely token is listed: the rank is exact. Beyond them it is not.
    rank = 1 + sum(v > chosen_logprob for _, v in shown) if (in_top and m.ranked) else None
    top = [(i, *pair(i, v)) for i, v in shown]
    if not in_top:
        top.append((chosen, *pair(chosen, chosen_logprob)))
    prob, raw_prob = pair(chosen, chosen_logprob)
    return TokenNumbers(prob, raw_prob, rank, top)


def split_text(text: str, pieces: list[str]) -> list[str]:
    """A chunk's new text shared among its tokens: by their pieces when these spell it exactly,
    else all of it on the last token (the text arrived with it)."""
    if not pieces:
        return []
    if "".join(pieces) == text:
        return list(pieces)
    return [""] * (len(pieces) - 1) + [text]


def candidates(top: list[tuple[int, float | None, float | None]], pieces: dict[int, str],
               constrained: bool = False) -> list[Candidate]:
    """The server's candidates; under a constraint, which it forbade is not known (None), nor
    which stage removed one."""
    return [Candidate(i, pieces[i], p, r, None if constrained else False, None) for i, p, r in top]
