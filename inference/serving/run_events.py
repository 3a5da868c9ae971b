"""What a run's events say: a step's StepEvent from its sampled numbers, and its last event (a
DoneEvent, or a beam search's BeamDoneEvent)."""

from __future__ import annotations

import math

from inference.decoding.tree import TreeSearch
from inference.events import BeamDoneEvent, Candidate, DoneEvent, StepEvent, TreeDoneEvent
from inference.serving.kv_pool import BLOCK_SIZE, PoolStats
from inference.serving.run import Run
from inference.serving.step_stats import StepInfo, candidates


def step_event(run: Run, info: StepInfo, text: str, ms: float, tokenizer, bytes_per_block: int,
               pool: PoolStats, recorded) -> StepEvent:
    """The run's step just taken (its token already appended to run.generated): the token, its
    numbers, the KV cache it holds, and, for its first token, the prefill's times."""
    first = len(run.step_ms) == 1
    return StepEvent(
        step=len(run.step_ms) - 1, token_id=info.token_id, piece=tokenizer.piece(info.token_id), text=text,
        prob=info.prob, raw_prob=info.raw_prob, top=candidates(info, tokenizer.piece),
        entropy=info.entropy, rank=info.rank,
        kv_cache_bytes=run.table.length * (bytes_per_block // BLOCK_SIZE),
        kv_cache_capacity_bytes=len(run.table.blocks) * bytes_per_block,
        ms=ms, prefill_ms=ms if first else None, prompt_tokens=run.n_prompt if first else None,
        wait_ms=(run.admitted - run.submitted) * 1000 if first else None,
        prompt_tokens_reused=run.reused if first else None,
        kv_blocks=len(run.table.blocks), pool=pool, sampler_state=recorded, masked_mass=info.masked_mass,
        unlisted_prob=info.unlisted_prob, constraint_kl=info.constraint_kl, free_prob=info.free_prob,
        constraint_removed=None if info.constraint_removed is None else [
            Candidate(i, tokenizer.piece(i), p, raw, True, "constraint") for i, p, raw in info.constraint_removed])


def ending(run: Run, reason: str, tokenizer, eos_ids) -> DoneEvent | BeamDoneEvent | TreeDoneEvent:
    """The run's last event: a beam search's finished beams, a tree's nodes, or a run's DoneEvent."""
    if run.beams is None:
        return done_event(run, reason)
    if isinstance(run.beams, TreeSearch):
        return run.beams.done_event(reason, run.n_prompt, tokenizer)
    return run.beams.done_event(reason, run.n_prompt, tokenizer, run.max_new, run.capped)


def done_event(run: Run, reason: str) -> DoneEvent:
    """A run's DoneEvent: its text with the tokenizer's and the stop strings' tail, its timings."""
    tail = "" if reason == "stop" or run.stream is None else run.stops.push(run.stream.flush()) + run.stops.flush()
    decode_s = sum(run.step_ms[1:]) / 1000
    n = len(run.step_ms)
    return DoneEvent(
        reason=reason, text="".join(run.parts) + tail, tail=tail, prompt_tokens=run.n_prompt,
        generated_tokens=n, ttft_ms=run.step_ms[0] if n else 0.0,
        decode_tokens_per_s=(n - 1) / decode_s if decode_s > 0 else 0.0,
        seed=run.seed, max_new_tokens=run.max_new, capped=run.capped,
        stop_string=run.stops.matched if reason == "stop" else None,
        constraint_complete=None if run.state is None or run.state.constraint is None else run.state.constraint.complete,
        emptied_by=run.emptied_by if reason == "constraint" else None,
        **constrained_logprobs(run))


def constrained_logprobs(run: Run) -> dict:
    """A constrained run's log-probability with and without the constraint's renormalisation: the
    sums over its steps of log prob and log free_prob (DoneEvent's logprob, free_logprob)."""
    if run.state is None or run.state.constraint is None or not run.costs:
        return {}
    with_, free = zip(*run.costs)
    return {"logprob": sum(map(_log, with_)), "free_logprob": sum(map(_log, free))}


def _log(p: float) -> float:
    return math.log(p) if p > 0 else -math.inf
