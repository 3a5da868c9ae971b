"""A run's tokens and numbers do not depend on who else runs: 32 seeded sampled runs alone, then all
at once beside a beam search of width 8, eight samples of another prompt and a long prompt's
prefill, give the very same texts and probabilities, bit for bit. Here == is the point: the same
computation on the same machine must give the same bits whatever else is in its step (every row's
products, norms, attention and sampling computed alone: docs/design.md)."""

import threading

import pytest

from gguf_files import write_gguf
from inference.events import DoneEvent, StepEvent
from inference.loading.gguf_import import import_gguf
from inference.model import kernels
from inference.request import prepare_run
from inference.sampling.params import SamplingParams
from inference.serving.engine import Engine

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C compiler here: torch's operators serve")

SETTINGS = [dict(temperature=1.0), dict(temperature=0.8, top_k=20, top_p=0.9),
            dict(temperature=1.1, min_p=0.02, repetition_penalty=1.1), dict(temperature=0.7, top_k=5)]
PROMPTS = ["The quick", "Once upon a time", "1, 2, 3,", "Hello there, how are"]


def record(events) -> tuple:
    """Every number a run's events show: its tokens, probabilities and candidates, and its text."""
    steps, text = [], None
    for ev in events:
        if isinstance(ev, StepEvent):
            steps.append((ev.token_id, ev.prob, ev.raw_prob, ev.entropy, ev.rank,
                          tuple((c.id, c.prob, c.raw_prob) for c in ev.top)))
        elif isinstance(ev, DoneEvent):
            text = ev.text
    return tuple(steps), text


def requests(engine) -> list[tuple[list[int], SamplingParams]]:
    return [(engine.tokenizer.encode(PROMPTS[i % 4]),
             SamplingParams(**SETTINGS[i % 4], seed=100 + i, max_new_tokens=10)) for i in range(32)]


def together(engine, reqs, others: bool) -> list[tuple]:
    """The runs all at once (a thread each), with the others started first where asked."""
    out, threads = [None] * len(reqs), []

    def one(i, ids, params):
        out[i] = record(engine.generate_ids(ids, params, top_n=5))

    def drain(events):
        last = list(events)[-1]
        ends.append(last[1] if isinstance(last, tuple) else last)  # generate_many's are (k, event)
    ends = []
    if others:  # a prompt of 200 tokens: read in chunks beside the runs' decode rows
        long_prompt = engine.tokenizer.encode("the cat sat on the mat and looked at the dog " * 30)[:200]
        beam = prepare_run(engine, {"num_beams": 8, "max_new_tokens": 12}, prompt="A story about")
        threads += [threading.Thread(target=drain, args=(engine.run(beam),)),
                    threading.Thread(target=drain, args=(engine.generate_many(
                        engine.tokenizer.encode("Eight samples"), SamplingParams(temperature=1.0, seed=7,
                                                                                 max_new_tokens=12), 8),)),
                    threading.Thread(target=drain, args=(engine.generate_ids(
                        long_prompt, SamplingParams(temperature=0.0, max_new_tokens=3)),))]
    threads += [threading.Thread(target=one, args=(i, ids, p)) for i, (ids, p) in enumerate(reqs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ends) == (3 if others else 0) and all(e.reason for e in ends)  # the others ran to their end
    return out


@pytest.fixture(scope="module")
def q4_engine(tiny_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("invariance")
    write_gguf(tiny_dirs["gqa_tied"], root / "m.gguf", "Q4_0")
    with Engine.from_hf_dir(import_gguf(root / "m.gguf", root / "imported", progress=False),
                            products="integer", prefill_chunk=64) as engine:
        yield engine


def test_seeded_runs_are_the_same_bits_alone_and_beside_a_beam_samples_and_a_long_prefill(q4_engine):
    reqs = requests(q4_engine)
    alone = [record(q4_engine.generate_ids(ids, p, top_n=5)) for ids, p in reqs]
    assert len({a[1] for a in alone}) > 4  # the runs differ from each other: the test can tell them apart
    beside = together(q4_engine, reqs, others=True)
    for i, (a, b) in enumerate(zip(alone, beside)):
        assert a == b, f"run {i} ({PROMPTS[i % 4]!r}, {SETTINGS[i % 4]}) changed beside the others"
    # Read again, its prompt now from the prefix cache: the same bits too.
    assert together(q4_engine, reqs[:4], others=False) == alone[:4]


def test_float_weights_keep_a_rows_bits_in_steps_of_up_to_64_rows(tiny_dirs):
    """On float32 weights a decode row's products go through our kernels in steps of up to 64 rows
    (layers.SAME_BITS_ROWS): beside a beam search and samples, the same bits."""
    with Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32") as engine:
        reqs = requests(engine)[:12]
        alone = [record(engine.generate_ids(ids, p, top_n=5)) for ids, p in reqs]
        out, threads = [None] * len(reqs), []
        beam = prepare_run(engine, {"num_beams": 8, "max_new_tokens": 12}, prompt="A story about")
        drains = [engine.run(beam), engine.generate_many(engine.tokenizer.encode("Eight"),
                                                         SamplingParams(temperature=1.0, seed=7, max_new_tokens=12), 8)]
        threads = [threading.Thread(target=lambda ev=ev: [None for _ in ev]) for ev in drains]
        threads += [threading.Thread(target=lambda i=i, ids=ids, p=p: out.__setitem__(
            i, record(engine.generate_ids(ids, p, top_n=5)))) for i, (ids, p) in enumerate(reqs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, (a, b) in enumerate(zip(alone, out)):
            first = next((k for k, (x, y) in enumerate(zip(a[0], b[0])) if x != y), None)
            assert a == b, (i, first, a[0][first][:5] if first is not None else None, b[0][first][:5] if first is not None else None)
