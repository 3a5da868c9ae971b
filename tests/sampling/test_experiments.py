"""Sampling experiments: stage statistics, replay from stored logits, compare A/B, scoring."""

from helpers import plain
import math
from types import SimpleNamespace

import pytest
import torch

from inference.sampling.state import RunState

from inference.serving.engine import Request
from inference.sampling.replay import pipeline
from inference.sampling.params import SamplingParams
from ui.run_state import RunRecord, run_summary
from ui.controls import Controls
from ui.handlers import Handlers
from ui.controls import shaping_values  # noqa: E402

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def test_stage_counts_and_masses_by_hand():
    params = SamplingParams(temperature=1.0, top_k=3, top_p=0.7, min_p=0.0)
    stats, final = pipeline(PROBS.log(), params, RunState.from_seen(torch.zeros(4, dtype=torch.bool)), chosen=1)
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


def run(engine, **kw):
    events = list(engine.generate(Request("The quick brown", SamplingParams(**kw), top_n=5)))
    return events[:-1], events[-1]


REPLAY_SETTINGS = [  # across the whole range the page offers, tails included
    dict(temperature=1.0), dict(temperature=2.0), dict(temperature=1.5, top_k=300),
    dict(temperature=0.3, top_p=0.5), dict(temperature=0.8, top_k=5, top_p=0.9, min_p=0.02,
                                           repetition_penalty=1.3),
    dict(temperature=1.2, min_p=0.1, repetition_penalty=0.7), dict(temperature=0.0),
    dict(temperature=1.9, top_k=384, top_p=1.0, repetition_penalty=2.0),
]


@pytest.mark.parametrize("settings", REPLAY_SETTINGS)
def test_replay_equals_a_real_run_with_the_same_tokens_before(tiny_engine, settings):
    """Replaying step k of a run under other settings gives the distribution a real run with
    those settings samples from at step k, given the same tokens before it: within 1e-5 for
    every candidate the real run reports (here the whole vocabulary)."""
    a, _ = run(tiny_engine, temperature=1.0, max_new_tokens=6, seed=3)
    prompt = tiny_engine.tokenizer.encode("The quick brown")
    vocab = tiny_engine.cfg.vocab_size
    for k in (0, 3, 5):
        context = prompt + [s.token_id for s in a[:k]]
        params = SamplingParams(**settings, max_new_tokens=1, seed=0)
        real = next(iter(tiny_engine.generate_ids(context, params, top_n=vocab)))
        _, replayed = tiny_engine.replay(tiny_engine.step_logits(context), params,
                                          RunState.at(params, context, [], vocab), a[k].token_id)
        expected = torch.zeros(vocab, dtype=torch.float64)
        for c in real.top:
            expected[c.id] = c.prob
        assert (replayed.double() - expected).abs().max().item() < 1e-5


def test_compare_marks_the_first_divergence(tiny_engine):
    h = Handlers(tiny_engine)
    c = Controls(prompt="The quick brown", temperature=0.0, max_new_tokens=15, seed="11")
    cmp = h.experiments.compare(*c.values(), *shaping_values(temperature=1.5), "", SimpleNamespace(session_hash="cmp"))
    out_a, out_b = cmp["out_a"], cmp["out_b"]
    summary, bars_a, bars_b = (plain(cmp[n]) for n in ("compare_md", "bars_a", "bars_b"))  # (the glossary's marks off)
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
    s = run_summary(RunRecord(steps=steps))
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
    rec = list(h.run.generate(*Controls(prompt="The quick", max_new_tokens=8, seed="4", temperature=1.0).values(),
                          SimpleNamespace(session_hash="r")))[-1]["record"]
    md, bars = (lambda r: (r["replay_md"], r["replay_bars"]))(h.experiments.replay_step(rec, 2, 1.0, 0, 0.5, 0.0, 1.0))
    assert rec._logits[0] == 2  # kept: the next replay of this step makes no forward pass
    assert "Step 2" in md and "| top-p (off in the run) |" in md and "final, replayed" in bars
    table = h.experiments.likelihood(rec, 3, " fox")
    assert "| **all" in table and "first 3 generated tokens" in table


def test_step_statistics_are_exact_even_for_a_tiny_tail_or_a_tail_pick(tiny_engine):
    """What each step reports, from crafted logits against float64 on the whole vocabulary:
    entropy (also when the tail's mass is ~1e-13), raw probability, and rank (also for a token
    sampled from deep in the tail)."""
    from inference.serving.step_stats import pick
    KEEP = 256
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
        p = exact.softmax(-1)
        for seed in seeds:
            seen = torch.zeros(vocab, dtype=torch.bool)
            gen = torch.Generator().manual_seed(seed)
            _, info = pick(logits, SamplingParams(temperature=1.0), RunState.from_seen(seen), gen, 10)
            i = info.token_id
            assert info.entropy == pytest.approx(-(p * p.log()).sum().item(), abs=1e-5)
            assert info.raw_prob == pytest.approx(p[i].item(), rel=1e-5)
            assert info.rank == int((exact > exact[i]).sum()) + 1
            tail_picks += int(exact[i] < exact[order[KEEP - 1]])
    assert tail_picks > 0  # the rank's slow path ran
