"""Each added sampler stage against an independent reference: transformers' warpers where they
exist (typical-p, epsilon, eta), and hand-worked cases following the reference implementation's
documented semantics otherwise (OpenAI/vLLM penalties, llama.cpp's top-nσ, dynamic temperature,
XTC and Mirostat v2, text-generation-webui's DRY). Also: the order, and the state's update."""

import json
import math

import pytest
import torch

from inference.errors import InputError
from inference.sampling.cutoffs import apply_epsilon, apply_eta, apply_top_n_sigma, apply_typical_p
from inference.sampling.dynamic import apply_mirostat, apply_xtc, dynamic_temperature
from inference.sampling.params import SamplingParams
from inference.sampling.penalties import apply_logit_bias, apply_presence_frequency, dry_penalties
from inference.sampling.settings import DEFAULT_ORDER, decode_logit_bias, order
from inference.sampling.stages import final_logits, stages
from inference.sampling.state import RunState, xtc_coin

INF = math.inf


def rows(n=6, vocab=500):
    """Logit rows from flat to peaked, with -inf entries (an earlier filter) in some."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        x = torch.randn(vocab, generator=g) * (0.5 + i)
        if i % 2:
            x[torch.randperm(vocab, generator=g)[:vocab // 3]] = -INF
        out.append(x)
    return out


def max_diff(a, b):
    """Largest difference between two logit rows; both -inf at the same places or it is inf."""
    if not torch.equal(torch.isinf(a), torch.isinf(b)):
        return INF
    finite = torch.isfinite(a)
    return float((a[finite] - b[finite]).abs().max()) if finite.any() else 0.0


DIFFS = {}  # stage -> the largest difference measured against its reference (printed with -s)


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    for name, d in DIFFS.items():
        print(f"\n{name}: max |ours - reference| = {d:.3g}")


@pytest.mark.parametrize("name, ours, warper, values", [
    ("typical_p", apply_typical_p, "TypicalLogitsWarper", (0.2, 0.5, 0.9, 0.99)),
    ("epsilon_cutoff", apply_epsilon, "EpsilonLogitsWarper", (1e-4, 3e-3, 0.02, 0.2)),
    ("eta_cutoff", apply_eta, "EtaLogitsWarper", (1e-4, 3e-3, 0.02, 0.2)),
])
def test_cutoffs_equal_transformers_warpers(name, ours, warper, values):
    transformers = pytest.importorskip("transformers")
    cls = getattr(transformers, warper)
    worst = 0.0
    for v in values:
        ref = cls(v, min_tokens_to_keep=1) if name == "typical_p" else cls(v, min_tokens_to_keep=1)
        for x in rows():
            expected = ref(None, x.clone().unsqueeze(0))[0]
            d = max_diff(ours(x, v), expected)
            assert d == 0.0, (name, v)
            worst = max(worst, d)
    DIFFS[name] = worst


def test_presence_and_frequency_penalties_by_hand():
    """OpenAI's formula: logit - count * frequency - (count > 0) * presence, generated tokens only."""
    logits = torch.tensor([1.0, 2.0, 3.0, 4.0])
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    state = RunState.at(params, [0, 0, 0], [1, 3, 3], 4)  # the prompt's tokens do not count
    out = final_logits(logits, params, state)
    expected = torch.tensor([1.0, 2.0 - 0.25 - 0.5, 3.0, 4.0 - 2 * 0.25 - 0.5])
    assert torch.equal(out, expected)
    assert torch.equal(apply_presence_frequency(logits, -1.0, 0.0, state.counts), torch.tensor([1.0, 3.0, 3.0, 5.0]))
    DIFFS["presence/frequency"] = float((out - expected).abs().max())


def test_logit_bias_adds_and_bans():
    logits = torch.tensor([0.0, 1.0, 2.0, 3.0])
    bias = decode_logit_bias("1:2.5, 3:-100 2:-0.5")
    assert bias == ((1, 2.5), (3, -100.0), (2, -0.5))
    assert apply_logit_bias(logits, bias).tolist() == [0.0, 3.5, 1.5, -INF]
    assert decode_logit_bias("1:1 1:-2") == ((1, -2.0),)  # the later entry wins
    for bad in ("7", "x:1", "1:inf", "-1:2"):
        with pytest.raises(InputError, match="logit_bias"):
            SamplingParams(logit_bias=bad)


def test_logit_bias_text_biases_each_token_the_tokenizer_encodes(tiny_engine):
    """'"text":BIAS' biases each token of the text as the engine's own tokenizer encodes text
    that continues the output (no BOS, no dummy-prefix space); ids and text mix, a later entry
    for an id replaces an earlier one."""
    tok = tiny_engine.tokenizer
    ids = tok.encode_continuation(" Paris is")
    assert len(ids) >= 2 and tok.bos_id not in ids
    assert decode_logit_bias('" Paris is":-100', tok) == tuple((i, -100.0) for i in dict.fromkeys(ids))
    quoted = tok.encode_continuation('say "hi"\n')  # JSON escapes inside the quotes
    assert decode_logit_bias('5:1.5, "say \\"hi\\"\\n":2', tok) == ((5, 1.5), *((i, 2.0) for i in dict.fromkeys(quoted) if i != 5))
    assert dict(decode_logit_bias(f'" Paris is":3 {ids[0]}:-1', tok))[ids[0]] == -1.0
    # The syntax is checked without a tokenizer; resolving text needs one: one-line messages.
    SamplingParams(logit_bias='" Paris":-100')
    for bad in ('" Paris"', '" Paris":x', '"":2', '" Paris:2', '"\\q":1'):
        with pytest.raises(InputError, match="logit_bias") as e:
            SamplingParams(logit_bias=bad)
        assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="needs the model's tokenizer"):
        decode_logit_bias('" Paris":2')


def test_a_run_with_text_logit_bias_never_samples_a_banned_token(tiny_engine):
    """The engine encodes the text (page and CLI alike): a banned text's tokens are never
    sampled and have final probability 0 at every step."""
    tok, vocab = tiny_engine.tokenizer, tiny_engine.cfg.vocab_size
    prompt = tok.encode(PROMPT)
    free = list(tiny_engine.generate_ids(prompt, SamplingParams(max_new_tokens=4, seed=1, temperature=0.0), top_n=vocab))[:-1]
    banned = tok.piece(free[0].token_id)  # greedy's first choice, written as text
    params = SamplingParams(max_new_tokens=4, seed=1, temperature=0.0, logit_bias=f"{json.dumps(banned)}:-100")
    ids = {i for i, _ in decode_logit_bias(params.logit_bias, tok)}
    assert free[0].token_id in ids
    events = list(tiny_engine.generate_ids(prompt, params, top_n=vocab))[:-1]
    assert all(e.token_id not in ids for e in events)
    assert all(c.prob == 0.0 for e in events for c in e.top if c.id in ids)
    with pytest.raises(InputError, match=f"logit_bias names token {vocab} but the vocabulary has {vocab}"):
        next(iter(tiny_engine.generate_ids(prompt, SamplingParams(logit_bias=f'" Paris":1 {vocab}:1'), top_n=0)))


def test_top_n_sigma_by_hand():
    """llama.cpp: keep logits >= max - n * σ, σ the population std of the finite logits."""
    x = torch.tensor([4.0, 3.0, 1.0, 0.0, -INF])  # mean 2, σ = sqrt((4 + 1 + 1 + 4) / 4) = 1.5811
    sigma = math.sqrt(10 / 4)
    assert apply_top_n_sigma(x, 1.0).tolist() == [4.0, 3.0, -INF, -INF, -INF]  # cut 2.42
    assert apply_top_n_sigma(x, 2.0).tolist() == [4.0, 3.0, 1.0, -INF, -INF]  # cut 0.84
    assert 4 - 2 * sigma > 0.0 and 4 - 2 * sigma < 1.0
    DIFFS["top_n_sigma"] = 0.0


def test_dynamic_temperature_by_hand():
    """llama.cpp's temp_ext: T = lo + (hi - lo) * (H / log n)^exponent over the finite candidates."""
    x = torch.tensor([2.0, 1.0, 0.0, -INF])
    p = torch.tensor([2.0, 1.0, 0.0]).softmax(-1)
    h = float(-(p * p.log()).sum())
    t = 0.5 + (1.5 - 0.5) * (h / math.log(3)) ** 2.0  # temperature 1, range 0.5, exponent 2
    out = dynamic_temperature(x, 1.0, 0.5, 2.0)
    d = max_diff(out, torch.tensor([2.0 / t, 1.0 / t, 0.0, -INF]))
    assert d < 1e-6
    DIFFS["dynatemp"] = d


def test_xtc_by_hand():
    """Tokens of p >= threshold: all but the least likely of them go, when the coin < probability."""
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    x = p.log()
    assert apply_xtc(x, 0.15, 0.5, coin=0.2).isinf().tolist() == [True, True, False, False]
    assert torch.equal(apply_xtc(x, 0.15, 0.5, coin=0.7), x)  # the coin fell the other way
    assert torch.equal(apply_xtc(x, 0.35, 1.0, coin=0.0), x)  # one top choice: nothing to cut
    assert xtc_coin(7, 3) == xtc_coin(7, 3) and xtc_coin(7, 3) != xtc_coin(7, 4)
    DIFFS["xtc"] = 0.0


def test_dry_by_hand():
    """text-generation-webui's DRY. Context a b c d a b c: the last token c occurred at 2, the
    repeat 'a b c' (length 3) ends there, followed by d: d is penalized mult * base^(3 - 2)."""
    a, b, c, d, e = 1, 2, 3, 4, 5
    assert dry_penalties([a, b, c, d, a, b, c], 0.8, 1.75, 2, 0, frozenset()) == {d: pytest.approx(0.8 * 1.75)}
    # allowed length 4: the repeat of 3 is allowed
    assert dry_penalties([a, b, c, d, a, b, c], 0.8, 1.75, 4, 0, frozenset()) == {}
    # a breaker inside the repeat ends it: b breaks, so the repeat is 'c' alone (length 1 < 2)
    assert dry_penalties([a, b, c, d, a, b, c], 0.8, 1.75, 2, 0, frozenset({b})) == {}
    # two earlier repeats with different followers: each by its own length
    got = dry_penalties([b, c, d, e, a, c, e, b, c], 1.0, 2.0, 1, 0, frozenset())
    assert got == {d: pytest.approx(2.0 ** 1), e: pytest.approx(2.0 ** 0)}  # 'b c'->d (2), 'c'->e (1)
    # the range: only the last 4 tokens are searched (b c d a b c -> ... 'c' alone)
    assert dry_penalties([a, b, c, d, a, b, c], 1.0, 2.0, 1, 4, frozenset()) == {}
    # the last token a breaker: nothing
    assert dry_penalties([a, b, c, d, a, b, c], 0.8, 1.75, 2, 0, frozenset({c})) == {}
    DIFFS["dry"] = 0.0


def test_mirostat_v2_truncation_and_update_by_hand():
    """llama.cpp: keep tokens of surprise -log2 p <= μ (at least one); after the draw μ -= η (s - τ)."""
    p = torch.tensor([0.5, 0.25, 0.125, 0.125])  # surprises 1, 2, 3, 3 bits
    x = p.log()
    assert apply_mirostat(x, 2.5).isinf().tolist() == [False, False, True, True]
    assert apply_mirostat(x, 0.1).isinf().tolist() == [False, True, True, True]
    params = SamplingParams(mirostat_tau=3.0, mirostat_eta=0.1)
    state = RunState.at(params, [0], [], 4)
    assert state.mu == 6.0  # 2τ
    state.advance(1, 0.25, params)  # surprise 2 bits: μ = 6 - 0.1 * (2 - 3)
    assert state.mu == pytest.approx(6.1)
    assert state.recorded() == {"mirostat_mu": pytest.approx(6.1)}


def test_sampler_order():
    assert order("") == DEFAULT_ORDER
    assert order("top_k, temperature")[:2] == ("top_k", "temperature")
    assert sorted(order("min_p")) == sorted(DEFAULT_ORDER)
    for bad in ("nope", "top_k,top_k", "max_new_tokens"):
        with pytest.raises(InputError, match="sampler_order"):
            SamplingParams(sampler_order=bad)
    # min-p before temperature keeps a different set than after it
    x = torch.tensor([3.0, 2.0, 1.0, 0.0])
    after = final_logits(x, SamplingParams(temperature=2.0, min_p=0.3), None)
    before = final_logits(x, SamplingParams(temperature=2.0, min_p=0.3, sampler_order="min_p"), None)
    assert after.isinf().sum() == 1 and before.isinf().sum() == 2
    assert [n for n, _, _ in stages(SamplingParams(sampler_order="min_p,top_k"), None)][:3] == \
        ["min_p", "top_k", "constraint"]
    assert DEFAULT_ORDER[0] == "constraint"  # the mask before every other stage, as vLLM and llama.cpp


# ---------------------------------------------------------------- a real run, and its replay

EVERY = dict(temperature=0.9, top_k=200, top_p=0.97, min_p=0.005, repetition_penalty=1.1,
             presence_penalty=0.3, frequency_penalty=0.2, logit_bias="5:1.5, 6:-100", typical_p=0.98,
             epsilon_cutoff=1e-4, eta_cutoff=1e-4, top_n_sigma=4.0, dynatemp_range=0.3,
             xtc_probability=0.5, xtc_threshold=0.02, dry_multiplier=0.8, dry_allowed_length=1,
             mirostat_tau=6.0)
ONE_STAGE = [dict(presence_penalty=0.8), dict(frequency_penalty=0.6), dict(logit_bias="5:3, 6:-100, 7:-2"),
             dict(typical_p=0.8), dict(epsilon_cutoff=3e-3), dict(eta_cutoff=3e-3), dict(top_n_sigma=1.0),
             dict(dynatemp_range=0.5, dynatemp_exponent=2.0), dict(xtc_probability=0.7, xtc_threshold=0.01),
             dict(dry_multiplier=1.0, dry_allowed_length=1), dict(mirostat_tau=4.0, mirostat_eta=0.3)]
PROMPT = "the cat the cat the cat the"


def replay_diff(engine, settings, steps=(0, 3, 6)):
    """Largest difference, over every token of the vocabulary, between the distribution a run
    sampled from at each of `steps` and the replay of that step from the run's ids."""
    from inference.sampling.replay import replay_state
    params = SamplingParams(**settings, max_new_tokens=max(steps) + 1, seed=5)
    vocab = engine.cfg.vocab_size
    prompt = engine.tokenizer.encode(PROMPT)
    events = list(engine.generate_ids(prompt, params, top_n=vocab))[:-1]
    worst = 0.0
    for k in steps:
        ev, generated = events[k], [e.token_id for e in events[:k]]
        state = replay_state(params, params, prompt, generated, vocab, 5, ev.sampler_state, engine.tokenizer)
        _, replayed = engine.replay(engine.step_logits(prompt + generated), params, state, ev.token_id)
        ran = torch.zeros(vocab, dtype=torch.float64)
        for c in ev.top:
            ran[c.id] = c.prob
        worst = max(worst, float((replayed.double() - ran).abs().max()))
    return worst, events


@pytest.mark.parametrize("settings", ONE_STAGE + [EVERY, {**EVERY, "sampler_order":
                                                        "mirostat_tau,top_k,dry_multiplier,temperature,min_p"}],
                         ids=lambda s: "every-reordered" if "sampler_order" in s else
                         "every" if len(s) > 3 else next(iter(s)))
def test_replay_of_each_stage_equals_the_run(tiny_engine, settings):
    worst, _ = replay_diff(tiny_engine, settings)
    print(f"\nreplay vs run {sorted(settings) if len(settings) < 4 else 'every stage'}"
          f"{' reordered' if 'sampler_order' in settings else ''}: {worst:.3g}")
    assert worst <= 1e-5


def test_a_seeded_run_with_every_stage_on_reproduces_exactly(tiny_engine):
    a = replay_diff(tiny_engine, EVERY, steps=(5,))[1]
    b = replay_diff(tiny_engine, EVERY, steps=(5,))[1]
    assert [(e.token_id, e.prob, e.sampler_state) for e in a] == [(e.token_id, e.prob, e.sampler_state) for e in b]
    assert a[0].sampler_state["mirostat_mu"] == 12.0  # 2τ at the first step, then it moves
    assert len({e.sampler_state["mirostat_mu"] for e in a}) > 1


def test_every_stage_off_is_todays_sampling(tiny_engine):
    """Defaults leave a run as it was: no state recorded, the JSONL keys as before."""
    _, events = replay_diff(tiny_engine, {}, steps=(0,))
    assert all(e.sampler_state is None for e in events)
    assert "sampler_state" not in events[0].to_json()
