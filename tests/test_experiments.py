"""Sampling experiments: stage statistics, replay from stored logits, compare A/B, scoring."""

import math
from types import SimpleNamespace

import pytest
import torch

from inference.engine import Request
from inference.replay import KEEP, StepLogits, pipeline, replay
from inference.sampling import SamplingParams
from ui import format as fmt
from ui.handlers import Controls, Handlers

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def test_stage_counts_and_masses_by_hand():
    params = SamplingParams(temperature=1.0, top_k=3, top_p=0.7, min_p=0.0)
    stats, final = pipeline(PROBS.log(), params, torch.zeros(4, dtype=torch.bool), chosen=1)
    by = {s.name: s for s in stats}
    assert by["raw"].kept == 4 and by["raw"].chosen_rank == 2
    assert by["top-k"].kept == 3 and by["top-k"].mass_removed == pytest.approx(0.05)
    # After top-k: 0.5/0.95, 0.3/0.95, 0.15/0.95; top-p 0.7 keeps the first two (0.526 < 0.7).
    assert by["top-p"].kept == 2 and by["top-p"].mass_removed == pytest.approx(0.15 / 0.95)
    assert by["top-k"].chosen_prob == pytest.approx(0.3 / 0.95)  # renormalized after the stage
    assert by["top-p"].chosen_prob == pytest.approx(0.3 / 0.8)
    assert by["final (renormalized)"].chosen_prob == pytest.approx(0.3 / 0.8)
    assert final.tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0, 0])
    stats, _ = pipeline(PROBS.log(), SamplingParams(min_p=0.5), None, chosen=2)
    assert stats[-2].name == "min-p" and stats[-2].kept == 2 and stats[-2].chosen_rank is None
    assert stats[-2].mass_removed == pytest.approx(0.2)


def test_compact_logits_rebuild_the_tail_mass():
    logits = torch.randn(5000, generator=torch.Generator().manual_seed(0)) * 3
    top, ids = logits.topk(KEEP)
    rest = logits.scatter(0, ids, -math.inf).logsumexp(0).item()
    step = StepLogits(ids.int(), top, rest, 5000)
    rebuilt = step.full()
    assert torch.equal(rebuilt[ids], top)
    assert rebuilt.logsumexp(0).item() == pytest.approx(logits.logsumexp(0).item(), abs=1e-4)
    assert step.nbytes == KEEP * 8 + 16


def run(engine, **kw):
    events = list(engine.generate(Request("The quick brown", SamplingParams(**kw), top_n=5)))
    return events[:-1], events[-1]


def test_replay_equals_a_real_rerun_with_the_same_prefix(tiny_engine):
    a_params = dict(temperature=0.0, max_new_tokens=12, seed=3)
    b_params = dict(temperature=0.8, top_k=5, top_p=0.9, min_p=0.02, repetition_penalty=1.3,
                    max_new_tokens=12, seed=3)
    a, _ = run(tiny_engine, **a_params)
    b, _ = run(tiny_engine, **b_params)
    prompt = tiny_engine.tokenizer.encode("The quick brown")
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x.token_id != y.token_id), len(a))
    for k in range(0, same + 1):  # steps whose earlier tokens agree in both runs
        seen = prompt + [s.token_id for s in a[:k]]
        _, replayed = replay(a[k].logits, SamplingParams(**b_params), seen, a[k].token_id)
        for c in b[k].top:
            assert replayed[c.id].item() == pytest.approx(c.prob, abs=1e-5)
        assert replayed[b[k].token_id] > 0


def test_compare_marks_the_first_divergence(tiny_engine):
    h = Handlers(tiny_engine)
    c = Controls(prompt="The quick brown", temperature=0.0, max_new_tokens=15, seed="11")
    out_a, out_b, summary, bars_a, bars_b = h.compare(*c.values(), 1.5, 0, 1.0, 0.0, 1.0,
                                                      SimpleNamespace(session_hash="cmp"))
    a, _ = run(tiny_engine, temperature=0.0, max_new_tokens=15, seed=11)
    b, _ = run(tiny_engine, temperature=1.5, max_new_tokens=15, seed=11)
    expected = next(i for i, (x, y) in enumerate(zip(a, b)) if x.token_id != y.token_id)
    assert f"First divergence at step {expected}" in summary
    assert out_a[expected][1] == "diverges here" and out_b[expected][1] == "diverges here"
    assert sum(1 for _, cat in out_a if cat == "diverges here") == 1
    assert f"A at step {expected}" in bars_a and f"B at step {expected}" in bars_b
    assert "Seed 11 for both" in summary and "perplexity" in summary


def test_run_summary_by_hand():
    steps = [SimpleNamespace(prob=p, raw_prob=r, entropy=h) for p, r, h in
             ((0.5, 0.5, 1.0), (1.0, 0.25, 2.0), (0.25, 0.125, 0.0))]
    s = fmt.run_summary(fmt.RunRecord(steps=steps))
    assert s["tokens"] == 3 and s["mean_p"] == pytest.approx(1.75 / 3) and s["mean_entropy"] == 1.0
    assert s["perplexity"] == pytest.approx(4.0)  # (1/2 · 1/4 · 1/8) ** (-1/3)


def test_step_entropy_and_rank_against_one_teacher_forced_forward(tiny_engine):
    steps, _ = run(tiny_engine, temperature=1.0, max_new_tokens=6, seed=2)
    prompt = tiny_engine.tokenizer.encode("The quick brown")
    ids = prompt + [x.token_id for x in steps]
    with torch.inference_mode():
        logits = tiny_engine.model(torch.tensor([ids]), tiny_engine.model.new_cache(len(ids)), 0,
                                   all_logits=True)[0, len(prompt) - 1:-1]
    for x, row in zip(steps, logits):
        p = row.softmax(-1)
        assert x.entropy == pytest.approx(-(p * p.log()).sum().item(), abs=1e-4)
        assert x.rank == int((row > row[x.token_id]).sum()) + 1


def test_score_equals_transformers_teacher_forced(tiny_dirs, tiny_engine):
    transformers = pytest.importorskip("transformers")
    ref = transformers.LlamaForCausalLM.from_pretrained(tiny_dirs["gqa_tied"], dtype=torch.float32).eval()
    context = tiny_engine.tokenizer.encode("The quick brown")
    scores = tiny_engine.score(context, " fox jumps 😀")
    cont = [i for i, _, _ in scores]
    with torch.inference_mode():
        logp = ref(torch.tensor([context + cont])).logits[0].log_softmax(-1)
    expected = [logp[len(context) - 1 + j, t].item() for j, t in enumerate(cont)]
    assert [lp for _, _, lp in scores] == pytest.approx(expected, abs=1e-4)


def test_score_cli_sums(tiny_dirs, capsys):
    import json
    from inference.cli import main
    assert main(["score", "--model", str(tiny_dirs["mha"]), "--prompt", "The quick", "--continuation",
                 " brown fox", "--jsonl"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines[-1]["done"] and lines[-1]["sum_logprob"] == pytest.approx(sum(x["logprob"] for x in lines[:-1]))
    assert main(["score", "--model", str(tiny_dirs["mha"]), "--prompt", "x", "--continuation", ""]) == 2


def test_replay_and_likelihood_handlers(tiny_engine):
    h = Handlers(tiny_engine)
    rec = list(h.generate(*Controls(prompt="The quick", max_new_tokens=8, seed="4", temperature=1.0).values(),
                          SimpleNamespace(session_hash="r")))[-1][-1]
    md, bars = h.replay_step(rec, 2, 1.0, 0, 0.5, 0.0, 1.0)
    assert "Step 2" in md and "| top-p |" in md and "final, replayed" in bars
    table = h.likelihood(rec, 3, " fox")
    assert "| **all" in table and "first 3 generated tokens" in table


def test_step_statistics_are_exact_even_for_a_tiny_tail_or_a_tail_pick(tiny_engine):
    """What each step reports, from crafted logits against float64 on the whole vocabulary:
    log-sum-exp of the tokens outside the kept top 256 (also when their mass is ~1e-13),
    entropy, raw probability, and rank (also when the token was sampled from outside the top 256)."""
    from inference.replay import KEEP
    vocab = tiny_engine.cfg.vocab_size
    assert vocab > KEEP
    g = torch.Generator().manual_seed(0)
    tiny_tail = torch.cat([torch.rand(KEEP, generator=g) * 10 + 10, torch.full((vocab - KEEP,), -20.0)])
    flat = torch.cat([torch.full((KEEP,), 0.05), torch.zeros(vocab - KEEP)])
    tail_picks = 0
    for logits, seeds in ((tiny_tail, range(3)), (flat, range(12))):
        logits = logits[torch.randperm(vocab, generator=g)]
        exact = logits.double()
        order = exact.argsort(descending=True)
        rest = exact[order[KEEP:]].logsumexp(-1).item()
        p = exact.softmax(-1)
        for seed in seeds:
            seen = torch.zeros(vocab, dtype=torch.bool)
            gen = torch.Generator().manual_seed(seed)
            _, pick = tiny_engine._pick(logits, SamplingParams(temperature=1.0), seen, gen, 10)
            i = pick.token_id
            assert pick.logits.rest_lse == pytest.approx(rest, abs=1e-6)
            assert pick.entropy == pytest.approx(-(p * p.log()).sum().item(), abs=1e-5)
            assert pick.raw_prob == pytest.approx(p[i].item(), rel=1e-5)
            assert pick.rank == int((exact > exact[i]).sum()) + 1
            tail_picks += int(exact[i] < exact[order[KEEP - 1]])
    assert tail_picks > 0  # the rank's slow path ran
