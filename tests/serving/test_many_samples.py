"""Many samples at once (Engine.generate_many, `generate --n`): sample k is the single run with
seed s + k, the first step's distribution is transformers' float32 one, and Stop ends them all."""

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from engine_hold import wait_until
from inference.cli import main
from inference.errors import InputError
from inference.events import DoneEvent, StepEvent
from inference.sampling.params import SamplingParams

SETTINGS = [dict(temperature=1.0),
            dict(temperature=0.8, top_k=40, top_p=0.95, repetition_penalty=1.2),
            # XTC's coin comes from the seed: each sample's differs, as its single run's does.
            dict(temperature=1.2, xtc_probability=0.5, xtc_threshold=0.02, min_p=0.01)]


def collect(events):
    steps, done = {}, {}
    for k, ev in events:
        if isinstance(ev, StepEvent):
            steps.setdefault(k, []).append(ev)
        elif isinstance(ev, DoneEvent):
            done[k] = ev
    return steps, done


def single(engine, ids, seed, **settings) -> list[StepEvent]:
    params = SamplingParams(**settings, max_new_tokens=12, seed=seed)
    return [ev for ev in engine.generate_ids(ids, params, top_n=5) if isinstance(ev, StepEvent)]


@pytest.mark.parametrize("settings", SETTINGS)
def test_sample_k_is_the_single_run_with_seed_s_plus_k(tiny_engine, settings):
    ids = tiny_engine.tokenizer.encode("The quick")
    n, s = 8, 1000
    steps, done = collect(tiny_engine.generate_many(ids, SamplingParams(**settings, max_new_tokens=12, seed=s), n,
                                                    top_n=5))
    assert sorted(done) == list(range(n)) and [done[k].seed for k in range(n)] == [s + k for k in range(n)]
    worst = 0.0
    for k in range(n):
        alone = single(tiny_engine, ids, s + k, **settings)
        assert [e.token_id for e in steps.get(k, [])] == [e.token_id for e in alone], k
        for a, b in zip(steps.get(k, []), alone):
            assert [c.id for c in a.top] == [c.id for c in b.top]
            worst = max(worst, abs(a.prob - b.prob), abs(a.raw_prob - b.raw_prob),
                        *(abs(x.prob - y.prob) for x, y in zip(a.top, b.top)))
    # Batched with the others, a sample's rows go through multi-row matmuls, a single run's
    # through a matrix-vector product: the same numbers but for float32 rounding.
    assert worst < 1e-5
    texts = {done[k].text for k in range(n)}
    assert len(texts) > 1  # the samples differ: the comparison above could fail


def test_samples_are_one_batch_and_leave_one_prefix(tiny_engine, monkeypatch):
    """All n runs are in the scheduler together (each pass holds every sample's row), and only
    sample 0's blocks go to the prefix cache."""
    sched = tiny_engine.scheduler
    widest, step = [0], sched._step

    def counted(active):
        widest[0] = max(widest[0], len(active))
        return step(active)

    monkeypatch.setattr(sched, "_step", counted)
    before = len(sched.prefix_cache._entries)
    ids = tiny_engine.tokenizer.encode("Once upon a time there was a little model" * 2)  # over one block
    assert len(ids) > 16
    collect(tiny_engine.generate_many(ids, SamplingParams(temperature=1.0, max_new_tokens=4, seed=3), 16))
    assert widest[0] == 16
    assert len(sched.prefix_cache._entries) - before <= 1


def test_bad_numbers_of_samples_are_refused(tiny_engine):
    ids = tiny_engine.tokenizer.encode("Hi")
    for n, message in [(0, "from 1 to 64, got 0"), (65, "from 1 to 64, got 65"), (2.5, "got 2.5")]:
        with pytest.raises(InputError, match=message):
            next(tiny_engine.generate_many(ids, SamplingParams(), n))
    with pytest.raises(InputError, match="pass 2\\^63 - 1"):
        next(tiny_engine.generate_many(ids, SamplingParams(seed=2**63 - 2), 4))
    assert tiny_engine.active_runs == 0


def test_stop_ends_every_sample_and_frees_the_pool(tiny_engine, hold):
    held = hold(tiny_engine)
    ids = tiny_engine.tokenizer.encode("The quick")
    cancel = threading.Event()
    used = tiny_engine.scheduler.stats().blocks_used
    events = tiny_engine.generate_many(ids, SamplingParams(temperature=1.0, max_new_tokens=200, seed=1), 6,
                                       cancel=cancel)
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(collect, events)
        held.step(2)
        cancel.set()
        steps, ended = done.result(timeout=60)
    assert sorted(ended) == list(range(6)) and {e.reason for e in ended.values()} == {"cancelled"}
    assert all(len(v) <= 3 for v in steps.values())
    wait_until(lambda: tiny_engine.active_runs == 0, "every sample's end")
    assert tiny_engine.scheduler.stats().blocks_used <= used  # cancelled runs leave nothing cached


def test_cli_n_lines_carry_sample_and_seed_and_match_single_runs(tiny_dirs, capsys):
    model = str(tiny_dirs["mha"])
    base = ["generate", "--model", model, "--prompt", "The quick", "--max-new-tokens", "6", "--top", "3",
            "--temperature", "1", "--jsonl"]
    assert main(base + ["--n", "4", "--seed", "20"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all({"sample", "seed"} <= set(line) for line in lines)
    assert all(line["seed"] == 20 + line["sample"] for line in lines)
    summaries = {line["sample"]: line for line in lines if line.get("done")}
    assert sorted(summaries) == [0, 1, 2, 3]
    for k in range(4):
        steps = [line for line in lines if line["sample"] == k and "step" in line]
        assert [s["step"] for s in steps] == list(range(len(steps)))
        assert main(base + ["--seed", str(20 + k)]) == 0
        alone = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [s["token_id"] for s in steps] == [s["token_id"] for s in alone[:-1]]
        assert summaries[k]["text"] == alone[-1]["text"] and alone[-1]["seed"] == 20 + k


def test_cli_n_first_step_is_transformers_float32_distribution(tiny_dirs, capsys):
    transformers = pytest.importorskip("transformers")
    from inference.serving.engine import Engine
    model = tiny_dirs["gqa_tied"]
    assert main(["generate", "--model", str(model), "--prompt", "Paris is the", "--max-new-tokens", "2",
                 "--temperature", "0.7", "--top-p", "1", "--top", "8", "--n", "5", "--jsonl"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    firsts = [line for line in lines if line.get("step") == 0]
    assert len(firsts) == 5 and len({line["seed"] for line in firsts}) == 5
    with Engine.from_hf_dir(model) as engine:
        ids = engine.tokenizer.encode("Paris is the")
    ref = transformers.LlamaForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0, -1].double()  # (vocab,)
    raw, final = logits.softmax(-1), (logits / 0.7).softmax(-1)
    for line in firsts:
        assert len(line["top"]) >= 8
        for c in line["top"]:
            assert abs(c["raw_prob"] - float(raw[c["id"]])) <= 1e-4
            assert abs(c["prob"] - float(final[c["id"]])) <= 1e-4
        assert abs(line["prob"] - float(final[line["token_id"]])) <= 1e-4


def test_cli_n_plain_text_and_bad_n(tiny_dirs, capsys):
    model = str(tiny_dirs["mha"])
    assert main(["generate", "--model", model, "--prompt", "Hi", "--max-new-tokens", "3", "--n", "3",
                 "--seed", "7"]) == 0
    out, err = capsys.readouterr()
    assert sorted(line for line in out.splitlines() if line.startswith("--- sample")) == [
        f"--- sample {k} (seed {7 + k}) ---" for k in range(3)]
    assert err.count("[sample ") == 3
    assert main(["generate", "--model", model, "--prompt", "Hi", "--n", "65"]) == 2
    assert capsys.readouterr().err.strip() == "error: --n must be from 1 to 64, got 65"
