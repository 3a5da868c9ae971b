"""The plain dataclasses the engine yields while it generates. The UI and CLI only format them."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Candidate:
    id: int
    piece: str
    prob: float  # in the final distribution, the one sampled from
    raw_prob: float  # softmax of the model's logits at temperature 1, nothing filtered


@dataclass
class StepEvent:
    step: int  # 0 for the token sampled right after prefill
    token_id: int
    piece: str
    text: str  # new text this step adds to the output (may be "" while bytes or a stop are held)
    prob: float
    raw_prob: float
    top: list[Candidate]
    entropy: float  # of the raw distribution, in nats
    rank: int  # the chosen token's rank in the raw distribution (1 = most likely)
    kv_cache_bytes: int
    kv_cache_capacity_bytes: int
    ms: float  # wall time of this step: prefill + sample for step 0, one decode + sample after
    prefill_ms: float | None = None  # step 0 only (the time to first token)
    prompt_tokens: int | None = None  # step 0 only

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["top"] = [asdict(c) for c in self.top]
        for key in ("prefill_ms", "prompt_tokens"):
            if d[key] is None:
                d.pop(key)
        return d


@dataclass
class DoneEvent:
    reason: str  # "eos", "length", "stop", "context", "cancelled"
    text: str  # the whole generated text: every step's text, then `tail`
    tail: str  # text held back until the end (an incomplete character, a possible stop string)
    prompt_tokens: int
    generated_tokens: int
    ttft_ms: float
    decode_tokens_per_s: float
    seed: int
    max_new_tokens: int  # after capping at the context window
    capped: bool  # max_new_tokens was lowered to fit the context window
    done: bool = True

    def to_json(self) -> dict:
        return asdict(self)
