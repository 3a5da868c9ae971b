"""Beam search (inference/decoding/beams.py in the scheduler): the same beams and scores as
transformers' beam search on the same weights, prefix blocks shared in the paged pool, and
batched beside other runs without changing their tokens."""

import threading

import pytest
import torch

from helpers import hf_beams, hf_reference
from inference.errors import InputError
from inference.events import BeamDoneEvent, BeamStepEvent, DoneEvent, StepEvent
from inference.request import prepare_run
from inference.sampling.params import SamplingParams

PROMPTS = ["The quick brown fox", "Once upon a time there was a little model that"]


@pytest.fixture(scope="module")
def hf(tiny_dirs):
    return hf_reference(tiny_dirs["gqa_tied"])


def beam_run(engine, prompt, width, penalty, max_new):
    request = prepare_run(engine, {"num_beams": width, "length_penalty": penalty, "max_new_tokens": max_new},
                          prompt=prompt)
    events = list(engine.run(request))
    assert isinstance(events[-1], BeamDoneEvent)
    return request, events


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("penalty", [1.0, 0.5, 2.0])
@pytest.mark.parametrize("eos", ["model", "frequent"])
def test_beams_equal_transformers_beam_search(tiny_engine, hf, width, penalty, eos):
    """The finished beams, best first, and their scores, for widths 2-4 and three length penalties;
    with the model's own end-of-sequence ids and with a frequent token as the end (so that
    beams finish early and the search stops by transformers' heuristic, not only at the cap)."""
    saved = tiny_engine.eos_ids
    try:
        if eos == "frequent":  # the model's second choice after the first prompt ends a beam
            ids = tiny_engine.tokenizer.encode(PROMPTS[0])
            tiny_engine.eos_ids = {torch.topk(tiny_engine.step_logits(ids), 2).indices[1].item()}
        ended, early = set(), set()
        for prompt in PROMPTS:
            request, events = beam_run(tiny_engine, prompt, width, penalty, max_new=8)
            done = events[-1]
            ours = [(b.tokens, b.score) for b in done.beams]
            seqs, scores = hf_beams(hf, list(request.prompt_ids), width, penalty, 8, tiny_engine.eos_ids)
            assert [t for t, _ in ours] == seqs, prompt
            assert max(abs(s - r) for (_, s), r in zip(ours, scores)) < 1e-4
            for b in done.beams:  # a beam's score is its log-probability over its length^penalty
                assert abs(b.score - b.logprob / len(b.tokens) ** penalty) < 1e-5
            ended.add(done.reason)
            early |= {e.step for e in events if isinstance(e, BeamStepEvent) and e.step < 7
                      and any(h.status == "finished" for h in e.hypotheses)}
        if eos == "frequent":
            assert early  # beams finished before the cap: that path is tested
    finally:
        tiny_engine.eos_ids = saved


def test_the_tree_records_every_hypothesis_with_its_cumulative_log_probability(tiny_engine):
    request, events = beam_run(tiny_engine, PROMPTS[0], 3, 1.0, 5)
    steps = [e for e in events if isinstance(e, BeamStepEvent)]
    assert [s.step for s in steps] == list(range(len(steps))) and len(steps) == 5
    ids = list(request.prompt_ids)
    # Step 0: the prompt's distribution; a hypothesis's cumulative log-probability is its token's.
    logp = torch.log_softmax(tiny_engine.step_logits(ids).float(), -1)
    for h in steps[0].hypotheses:
        assert h.parent == 0 and abs(h.cumulative - logp[h.token_id].item()) < 1e-4
    kept = max(2, 1 + len(tiny_engine.eos_ids)) * 3  # candidates a step: enough to keep 3 beams past every end token
    assert [h.token_id for h in steps[0].hypotheses] == torch.topk(logp, kept).indices.tolist()
    # Later steps: each kept beam's cumulative is its parent's plus its token's log-probability,
    # recomputed by a forward pass over its whole sequence.
    live = {h.beam: [h.token_id] for h in steps[0].hypotheses if h.status == "kept"}
    sums = {h.beam: h.cumulative for h in steps[0].hypotheses if h.status == "kept"}
    for s in steps[1:]:
        assert len(s.hypotheses) == kept and {h.status for h in s.hypotheses} <= {"kept", "pruned", "finished"}
        assert sum(h.status == "kept" for h in s.hypotheses) <= 3
        nxt, nsums = {}, {}
        for h in s.hypotheses:
            lp = torch.log_softmax(tiny_engine.step_logits(ids + live[h.parent]).float(), -1)[h.token_id].item()
            assert abs(h.logprob - lp) < 1e-4 and abs(h.cumulative - (sums[h.parent] + h.logprob)) < 1e-4
            if h.status == "kept":
                nxt[h.beam], nsums[h.beam] = live[h.parent] + [h.token_id], h.cumulative
        live, sums = nxt, nsums
        scores = [h.cumulative for h in s.hypotheses]
        assert scores == sorted(scores, reverse=True)


def test_beams_share_their_prefix_blocks_and_give_every_block_back(tiny_engine):
    pool = tiny_engine.scheduler.pool
    before = pool.blocks_used
    prompt = "Once upon a time there was a little model " * 3  # several whole blocks
    request, events = beam_run(tiny_engine, prompt, 4, 1.0, 6)
    steps = [e for e in events if isinstance(e, BeamStepEvent)]
    n = len(request.prompt_ids)
    assert n > 32
    first = steps[0]
    # Four beams of n + 1 positions each: the prompt's whole blocks are held once, not four times.
    assert first.kv_blocks_unshared == 4 * (-(-(n + 1) // 16))
    assert first.kv_blocks < first.kv_blocks_unshared and first.kv_blocks <= n // 16 + 4
    assert pool.blocks_used == before  # every beam's blocks, shared or copied, went back


def test_copy_on_write_keeps_each_beams_keys_and_values_its_own(tiny_engine):
    """A block two tables share is copied before one of them writes into it: the other's
    positions are unchanged and the writer's copy holds the shared positions."""
    from inference.serving.kv_pool import BLOCK_SIZE, BlockTable
    pool = tiny_engine.scheduler.pool
    a = BlockTable(pool, 40, torch.device("cpu"))
    a.grow_to(20)
    a.length = 20
    start = a.blocks[1] * BLOCK_SIZE
    pool.k[:, start:start + BLOCK_SIZE] = 1.0
    b = a.fork()
    assert b.blocks == a.blocks and pool.holders(a.blocks[1]) == 2
    assert b.own_from(20) == 1  # only the block it writes into, not the whole first one
    assert b.blocks[0] == a.blocks[0] and b.blocks[1] != a.blocks[1]
    copy = b.blocks[1] * BLOCK_SIZE
    assert torch.equal(pool.k[:, copy:copy + BLOCK_SIZE], pool.k[:, start:start + BLOCK_SIZE])
    pool.k[:, copy + 4] = 7.0  # b writes position 20
    assert bool((pool.k[:, start + 4] == 1.0).all())
    assert a.own_from(20) == 0  # a is the block's only holder now
    used = pool.blocks_used
    a.release()
    b.release()
    assert pool.blocks_used == used - 3


def test_a_beam_search_batched_beside_other_runs_leaves_their_tokens_as_alone(tiny_engine, monkeypatch):
    sched, tok = tiny_engine.scheduler, tiny_engine.tokenizer
    others = [(tok.encode("The quick"), SamplingParams(temperature=1.0, max_new_tokens=10, seed=5)),
              (tok.encode("Once upon a time"), SamplingParams(temperature=0.0, max_new_tokens=10, seed=1))]

    def alone(ids, params):
        return [e for e in tiny_engine.generate_ids(ids, params, top_n=5) if isinstance(e, StepEvent)]

    singles = [alone(ids, p) for ids, p in others]
    beam_alone = beam_run(tiny_engine, PROMPTS[1], 3, 1.0, 10)[1][-1]
    widest, step = [0], sched._step

    def counted(active):
        widest[0] = max(widest[0], len(active))
        return step(active)

    monkeypatch.setattr(sched, "_step", counted)
    beam_request = prepare_run(tiny_engine, {"num_beams": 3, "max_new_tokens": 10}, prompt=PROMPTS[1])
    with sched._cv:  # the scheduler's thread admits them together
        runs = [sched.submit(ids, p, 5, threading.Event(), p.max_new_tokens, False, p.seed) for ids, p in others]
        beam = sched.submit(beam_request.ids, beam_request.params, 5, threading.Event(), 10, False, beam_request.seed)
    results = []
    for run in [*runs, beam]:
        events = []
        while not events or not isinstance(events[-1], (DoneEvent, BeamDoneEvent)):
            ev = run.events.get(timeout=60)
            assert not isinstance(ev, BaseException), ev
            events.append(ev)
        results.append(events)
    assert widest[0] == 3  # one forward pass held all three
    for events, single in zip(results, singles):
        steps = [e for e in events if isinstance(e, StepEvent)]
        assert [e.token_id for e in steps] == [e.token_id for e in single]
        assert max(abs(a.prob - b.prob) for a, b in zip(steps, single)) < 1e-5
    batched = results[-1][-1]
    assert [b.tokens for b in batched.beams] == [b.tokens for b in beam_alone.beams]
    assert max(abs(a.score - b.score) for a, b in zip(batched.beams, beam_alone.beams)) < 1e-5


def test_beam_settings_that_cannot_apply_are_refused_in_one_line(tiny_engine):
    for settings, field in [({"num_beams": 2, "top_k": 5}, "top_k"),
                            ({"num_beams": 2, "temperature": 0.7}, "temperature"),
                            ({"num_beams": 9}, "num_beams")]:
        with pytest.raises(InputError) as e:
            prepare_run(tiny_engine, settings, prompt="Hi")
        assert e.value.field == field and "\n" not in str(e.value)
    with pytest.raises(InputError, match="stop strings"):
        prepare_run(tiny_engine, {"num_beams": 2}, prompt="Hi", stop=["x"])
    prepare_run(tiny_engine, {"num_beams": 2, "temperature": 0}, prompt="Hi")  # no draw asked: allowed


def test_cli_prints_the_best_beam_with_its_score_then_the_others(tiny_dirs, tiny_engine, hf, capsys):
    import json
    from inference.cli import main
    base = ["generate", "--model", str(tiny_dirs["gqa_tied"]), "--device", "cpu", "--dtype", "float32",
            "--prompt", PROMPTS[0], "--num-beams", "3", "--length-penalty", "0.5", "--max-new-tokens", "6"]
    assert main(base + ["--jsonl"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["step"] for x in lines[:-1]] == list(range(len(lines) - 1))
    assert all({"cumulative", "status", "parent", "piece"} <= set(h) for x in lines[:-1] for h in x["hypotheses"])
    summary = lines[-1]
    assert summary["num_beams"] == 3 and [b["rank"] for b in summary["beams"]] == [1, 2, 3]
    ids = tiny_engine.tokenizer.encode(PROMPTS[0])  # the same checkpoint: the same ids and end tokens
    eos = tiny_engine.eos_ids
    seqs, scores = hf_beams(hf, ids, 3, 0.5, 6, eos)
    assert [b["token_ids"] for b in summary["beams"]] == seqs
    assert max(abs(b["score"] - r) for b, r in zip(summary["beams"], scores)) < 1e-4
    assert main(base) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == summary["beams"][0]["text"] and f"score {summary['beams'][0]['score']:.4f}" in out[1]
    assert out[2] == "--- beam 2 ---" and out[3] == summary["beams"][1]["text"]


def test_a_beam_search_that_fails_or_is_closed_ends_alone_and_gives_its_blocks_back(tiny_engine, monkeypatch):
    from inference.decoding import beams
    pool = tiny_engine.scheduler.pool
    before = pool.blocks_used
    real = beams.BeamSearch.step

    def failing(self, logits):
        if self.steps == 2:
            raise RuntimeError("injected")
        return real(self, logits)

    monkeypatch.setattr(beams.BeamSearch, "step", failing)
    request = prepare_run(tiny_engine, {"num_beams": 3, "max_new_tokens": 6}, prompt=PROMPTS[1])
    with pytest.raises(RuntimeError, match="injected"):
        list(tiny_engine.run(request))
    assert pool.blocks_used == before
    monkeypatch.setattr(beams.BeamSearch, "step", real)
    events = tiny_engine.run(request)
    assert isinstance(next(events), BeamStepEvent)
    events.close()  # a closed stream: the search is cancelled, its shared and copied blocks go back
    assert pool.blocks_used == before
    plain = prepare_run(tiny_engine, {"temperature": 0, "max_new_tokens": 3}, prompt=PROMPTS[0])
    assert isinstance(list(tiny_engine.run(plain))[-1], DoneEvent)  # the engine serves on


# ------------------------------------------------ a beam opened as a run (RunRequest.forced)
NEUTRAL = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}


def test_a_beam_opened_as_a_run_makes_its_tokens_with_the_models_numbers(tiny_engine, hf):
    """The best beam, its tokens given to a run: the run makes exactly them, its KV cache grows a
    position a step, each step's raw probabilities are transformers' at that position (1e-4)
    and the chosen tokens' log-probabilities sum to the beam's own (1e-4); with the sampling
    stages neutral its final distribution is the raw one."""
    import math
    request, events = beam_run(tiny_engine, PROMPTS[1], 3, 1.0, max_new=8)
    best = events[-1].beams[0]
    opened = prepare_run(tiny_engine, {**NEUTRAL, "max_new_tokens": 1}, ids=list(request.prompt_ids),
                         forced=best.tokens, seed=5)
    assert opened.max_new == len(best.tokens)
    steps = [e for e in tiny_engine.run(opened) if isinstance(e, StepEvent)]
    assert [e.token_id for e in steps] == best.tokens
    assert abs(sum(math.log(e.raw_prob) for e in steps) - best.logprob) < 1e-4
    with torch.no_grad():
        ref = hf(torch.tensor([list(request.prompt_ids) + best.tokens])).logits[0].double().softmax(-1)
    n = len(request.prompt_ids)
    for k, e in enumerate(steps):
        assert abs(e.raw_prob - ref[n - 1 + k, e.token_id].item()) < 1e-4
        assert abs(e.prob - e.raw_prob) < 1e-6  # neutral stages: sampled from the raw distribution
        assert [c.id for c in e.top] == ref[n - 1 + k].topk(len(e.top)).indices.tolist()
        assert e.kv_cache_bytes == (n + k) * tiny_engine.describe().kv_bytes_per_position  # the positions read


def test_a_run_of_given_tokens_beside_sampled_runs_changes_none_of_theirs(tiny_engine, monkeypatch):
    """Admitted together and stepped in one forward pass: the sampled runs' tokens are those of
    their runs alone, and the forced run still makes its own."""
    sched = tiny_engine.scheduler
    params = {"temperature": 0.9, "top_k": 20, "max_new_tokens": 6}
    sampled = [prepare_run(tiny_engine, params, prompt=p, seed=11) for p in PROMPTS]
    alone = [[e.token_id for e in tiny_engine.run(r) if isinstance(e, StepEvent)] for r in sampled]
    forced = prepare_run(tiny_engine, {**NEUTRAL, "max_new_tokens": 1}, prompt=PROMPTS[0],
                         forced=[5, 17, 5, 300, 7, 41])  # none an end-of-sequence id
    widest, step = [0], sched._step

    def counted(active):
        widest[0] = max(widest[0], len(active))
        return step(active)

    monkeypatch.setattr(sched, "_step", counted)
    with sched._cv:  # the scheduler's thread admits them together
        runs = [sched.submit(r.ids, r.params, 5, threading.Event(), r.max_new, False, r.seed, forced=r.forced)
                for r in (*sampled, forced)]
    results = []
    for run in runs:
        tokens = []
        while True:
            ev = run.events.get(timeout=60)
            assert not isinstance(ev, BaseException), ev
            if isinstance(ev, DoneEvent):
                break
            if isinstance(ev, StepEvent):
                tokens.append(ev.token_id)
        results.append(tokens)
    assert widest[0] == 3  # one forward pass held all three
    assert results[:2] == alone and results[2] == list(forced.forced)


@pytest.mark.parametrize("settings, forced, field, words", [
    ({"temperature": 0.0}, [5], "temperature", "greedy"),
    ({"num_beams": 2}, [5], "num_beams", "Beams to 1"),
    ({"constraint": "regex", "constraint_text": "a+"}, [5], "constraint", "constrained"),
    ({}, [10 ** 6], None, "below the vocabulary"),
])
def test_a_run_of_given_tokens_is_refused_in_one_line(tiny_engine, settings, forced, field, words):
    with pytest.raises(InputError, match=words) as e:
        prepare_run(tiny_engine, {**NEUTRAL, **settings}, prompt=PROMPTS[0], forced=forced)
    assert e.value.field == field and "\n" not in str(e.value)
    with pytest.raises(InputError, match="do not fit"):
        prepare_run(tiny_engine, NEUTRAL, prompt=PROMPTS[0], forced=[5] * tiny_engine.max_seq_len)
