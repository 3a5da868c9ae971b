"""The plain dataclasses the engine yields while it generates. The UI and CLI only format them.

A number the engine cannot know is None (null in JSON), never a stand-in: in front of a model
server (inference/remote/engine.py) the entropy over the whole vocabulary, a rank beyond the returned
candidates, this run's KV-cache bytes, and whichever of the raw and final distributions the
server's log-probabilities are not."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class PoolStats:
    blocks_total: int
    blocks_used: int  # held by runs now
    blocks_reserved: int  # promised to admitted runs, held or not yet
    active_runs: int
    waiting_runs: int
    bytes_per_block: int
    blocks_cached: int = 0  # kept from finished runs for a prompt that starts the same way

    @property
    def bytes_used(self) -> int:
        return self.blocks_used * self.bytes_per_block


@dataclass
class Candidate:
    id: int
    piece: str
    prob: float | None  # in the final distribution, the one sampled from
    raw_prob: float | None  # softmax of the model's logits at temperature 1, nothing filtered
    forbidden: bool | None = False  # the run's constraint does not allow it here (None: not known, a server's)
    # The setting name of the sampling stage that removed it (final p 0): "top_k", "temperature"
    # (greedy); "" for one left in, None where not known (a server's).
    removed_by: str | None = ""


@dataclass
class StepEvent:
    step: int  # 0 for the token sampled right after prefill
    token_id: int
    piece: str
    text: str  # new text this step adds to the output (may be "" while bytes or a stop are held)
    prob: float | None  # as Candidate's
    raw_prob: float | None
    top: list[Candidate]
    entropy: float | None  # of the raw distribution, in nats
    rank: int | None  # the chosen token's rank in the raw distribution (1 = most likely)
    kv_cache_bytes: int | None  # this run's positions held in the KV cache, in bytes
    kv_cache_capacity_bytes: int | None  # this run's KV blocks, in bytes
    ms: float  # wall time of this step: prefill + sample for step 0, one decode + sample after
    # (in front of a server: the wait for this token at the page; 0 for one that came with the last)
    prefill_ms: float | None = None  # step 0 only: the time to first token, from admission
    prompt_tokens: int | None = None  # step 0 only
    wait_ms: float | None = None  # step 0 only: time queued before admission
    prompt_tokens_reused: int | None = None  # step 0 only: prompt positions found in the prefix cache
    kv_blocks: int | None = 0  # this run's blocks of the server's KV pool
    pool: "PoolStats | None" = None  # the server's pool at this step (all runs)
    # The run's sampling state this step was sampled in that replay cannot recompute from the
    # ids (Mirostat's μ), or None.
    sampler_state: dict | None = None
    # The raw probability mass the run's constraint removed at this step: 1 - the sum of the raw
    # probabilities of the tokens it allows (0 without a constraint; None: not known, a server's).
    masked_mass: float | None = 0.0
    # The final probability of every token not among `top`, summed (exactly 0 where the stages
    # removed them all; None: not known, a server's).
    unlisted_prob: float | None = None
    # What the run's constraint cost at this step (None: no constraint, or not known: a server's):
    # KL(constrained ‖ free) of the final distributions in nats (inf where the constrained one can
    # draw a token the free one's stages removed), the chosen token's probability in the free final
    # distribution (the same stages without the constraint), and the free distribution's top tokens
    # the constraint forbade (prob: their free probability).
    constraint_kl: float | None = None
    free_prob: float | None = None
    constraint_removed: list[Candidate] | None = None

    def to_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "pool"}
        d["top"] = [asdict(c) for c in self.top]
        if self.constraint_removed is not None:
            d["constraint_removed"] = [asdict(c) for c in self.constraint_removed]
        if self.pool is not None:
            d["pool_blocks_used"], d["pool_blocks_total"] = self.pool.blocks_used, self.pool.blocks_total
            d["pool_active_runs"] = self.pool.active_runs
        for key in ("prefill_ms", "prompt_tokens", "wait_ms", "prompt_tokens_reused", "sampler_state", "unlisted_prob",
                    "constraint_kl", "free_prob", "constraint_removed"):
            if d[key] is None:
                d.pop(key)
        return d


@dataclass
class WaitEvent:
    """The run is queued: the KV pool cannot hold it beside the runs already admitted."""
    position: int  # 1 = next to be admitted
    waited_ms: float
    pool: "PoolStats"
    blocks_needed: int  # what the run may grow to


@dataclass
class PrefillEvent:
    """A prompt longer than one chunk is being read, a chunk a step: how far it has come."""
    done: int  # prompt tokens in the KV cache
    total: int


@dataclass
class DoneEvent:
    # "eos", "length", "stop", "context", "cancelled" ("interrupted": the CLI's, Ctrl-C), "complete"
    # (the constraint ended with an end-of-sequence token the engine does not stop at), "constraint"
    # (the stages kept no token the constraint allows: emptied_by names the one that removed the last)
    reason: str
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
    stop_string: str | None = None  # reason "stop": the stop string that ended the run
    constraint_complete: bool | None = None  # the output is a whole match of the constraint (None: no constraint)
    # reason "constraint": the stage (its setting's name) that removed the last token the constraint allowed
    emptied_by: str | None = None
    # A constrained run's log-probability (None: no constraint): the sum of log p of its tokens in
    # the distributions it sampled from (the constraint's renormalisation included), and in the
    # same stages' distributions without the constraint (-inf once one gave its token 0).
    logprob: float | None = None
    free_logprob: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class PromptToken:
    """One prompt token scored teacher-forced: its log-probability in the model's own
    distribution given the tokens before it, its rank there (1 = most likely), and the top
    candidates there as (id, log p), most likely first."""
    token_id: int
    logprob: float
    rank: int | None  # None where a server does not say
    top: list[tuple[int, float]]


@dataclass
class TokenScore:
    """One token of a scored text (Engine.score_ids): how likely the model found it given the
    tokens before it. The first token of a text has nothing before it: its numbers are None."""
    id: int
    piece: str
    logprob: float | None  # natural log of its probability in the model's own distribution
    rank: int | None  # 1 = the model's top choice there; None where unknown
    top: list["Candidate"]  # the tokens the model preferred there, most likely first (prob = raw_prob)

    @property
    def prob(self) -> float | None:
        return None if self.logprob is None else math.exp(self.logprob)

    @property
    def surprisal_bits(self) -> float | None:
        """-log2 p: how surprised the model was, in bits."""
        return None if self.logprob is None else -self.logprob / math.log(2)

    def to_json(self) -> dict:
        return {"id": self.id, "piece": self.piece, "prob": self.prob, "logprob": self.logprob,
                "rank": self.rank, "surprisal_bits": self.surprisal_bits,
                "top": [{"id": c.id, "piece": c.piece, "prob": c.raw_prob} for c in self.top]}


def token_scores(ids: list[int], scored: list[PromptToken], pieces: dict[int, str]) -> list[TokenScore]:
    """A text's TokenScores from its tokens after the first, scored teacher-forced (an engine's
    prompt_logprobs); pieces: {id: piece} of every id named. The first token has none."""
    out = [TokenScore(ids[0], pieces[ids[0]], None, None, [])]
    for p in scored:
        top = [Candidate(j, pieces[j], math.exp(v), math.exp(v)) for j, v in p.top]
        out.append(TokenScore(p.token_id, pieces[p.token_id], p.logprob, p.rank, top))
    return out


def perplexity(scores: list[TokenScore]) -> float | None:
    """exp of the mean surprisal (nats) over the tokens that have a probability; None if none has."""
    known = [s.logprob for s in scores if s.logprob is not None]
    return math.exp(-sum(known) / len(known)) if known else None


@dataclass
class BeamStepEvent:
    """One step of a beam search: every continuation it considered (decoding.beams.Hypothesis),
    best first, with the pieces of their tokens."""
    step: int
    hypotheses: list  # [Hypothesis]
    pieces: list[str]  # each hypothesis's token, as the tokenizer shows it
    ms: float  # wall time of this step (step 0: from admission, the prompt's reading included)
    kv_blocks: int  # the pool's blocks the live beams hold, each shared block once
    kv_blocks_unshared: int  # what they would hold without sharing their prefix
    blocks_copied: int  # blocks copied on write this step (a beam writing into a shared block)
    pool: "PoolStats | None" = None

    def to_json(self) -> dict:
        return {"step": self.step, "ms": self.ms, "kv_blocks": self.kv_blocks,
                "kv_blocks_unshared": self.kv_blocks_unshared, "blocks_copied": self.blocks_copied,
                "hypotheses": [{**asdict(h), "piece": p} for h, p in zip(self.hypotheses, self.pieces)]}


@dataclass
class BeamDoneEvent:
    """A beam search's end: its finished beams, best first (the first is the result)."""
    # "length" (the token cap), "eos" (no live beam could beat the finished), "cancelled", or
    # "unscored" (no beam finished: decoding.beams.unscored_message says why)
    reason: str
    beams: list  # [decoding.beams.Finished]
    texts: list[str]  # each beam's text
    prompt_tokens: int
    steps: int
    num_beams: int
    length_penalty: float
    max_new_tokens: int
    capped: bool
    done: bool = True

    def to_json(self) -> dict:
        return {"reason": self.reason, "steps": self.steps, "num_beams": self.num_beams,
                "length_penalty": self.length_penalty, "prompt_tokens": self.prompt_tokens,
                "max_new_tokens": self.max_new_tokens, "capped": self.capped, "done": True,
                "beams": [{"rank": i + 1, "text": t, "token_ids": b.tokens, "logprob": b.logprob, "score": b.score}
                          for i, (b, t) in enumerate(zip(self.beams, self.texts))]}


@dataclass
class TreeStepEvent:
    """One level of a tree of continuations (decoding/tree.py): the nodes it added (TreeNode),
    most probable path first, and the pool as a beam search's step says it."""
    step: int
    nodes: list  # [decoding.tree.TreeNode]
    ms: float  # wall time of this step (step 0: from admission, the prompt's reading included)
    kv_blocks: int  # the pool's blocks the nodes still to expand hold, each shared block once
    kv_blocks_unshared: int  # what they would hold without sharing their prefix
    blocks_copied: int  # blocks copied on write this step
    pool: "PoolStats | None" = None

    def to_json(self) -> dict:
        return {"step": self.step, "ms": self.ms, "kv_blocks": self.kv_blocks,
                "kv_blocks_unshared": self.kv_blocks_unshared, "blocks_copied": self.blocks_copied,
                "nodes": [n.to_json() for n in self.nodes]}


@dataclass
class TreeDoneEvent:
    """A tree's end: every node, the root (the point it grew from) first, each after its parent."""
    reason: str  # "depth", "budget", "complete" (nothing left above the threshold), "cancelled"
    nodes: list  # [decoding.tree.TreeNode]
    prompt_tokens: int  # the ids it grew from (prompt and given)
    steps: int
    depth: int
    max_nodes: int
    top_k: int | None
    min_prob: float | None
    done: bool = True

    def to_json(self) -> dict:
        return {"reason": self.reason, "prompt_tokens": self.prompt_tokens, "steps": self.steps, "depth": self.depth,
                "max_nodes": self.max_nodes, "top_k": self.top_k, "min_prob": self.min_prob, "done": True,
                "nodes": [n.to_json() for n in self.nodes]}
