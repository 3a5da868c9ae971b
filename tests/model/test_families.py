"""Each family against transformers' own model class on tiny random checkpoints (float32):
logits and raw probabilities within 1e-4 and the same greedy path, through the static cache, and
through the paged pool with several runs batched together and prompts read in chunks. Windows of
8 positions under prompts of 30 make the sliding layers' masks bite."""

from concurrent.futures import ThreadPoolExecutor
import threading

import pytest
import torch

from inference.events import StepEvent
from inference.sampling.params import SamplingParams
from inference.sampling.state import RunState
from inference.serving.engine import Engine
from tiny_families import FAMILIES, make_family_model, make_gemma3_multimodal

transformers = pytest.importorskip("transformers")

TOL = 1e-4
NAMES = list(FAMILIES) + ["gemma3"]
PROMPT_LENGTHS = (30, 12, 21)
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, sp_model_bytes):
    """family -> (directory, transformers model in eager attention)."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for i, name in enumerate(NAMES):
        d, ref = (make_gemma3_multimodal(root, sp_model_bytes, seed=i) if name == "gemma3"
                  else make_family_model(root, name, sp_model_bytes, seed=i))
        ref.config._attn_implementation = "eager"
        out[name] = (d, ref)
    return out


def prompts(n_vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(5, n_vocab - 8, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


@torch.inference_mode()
def reference_greedy(ref, ids: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy path from ids, by a full forward per step, and each step's probabilities."""
    ids, chosen, probs = list(ids), [], []
    for _ in range(steps):
        p = ref(input_ids=torch.tensor([ids])).logits[0, -1].float().softmax(-1)
        probs.append(p)
        chosen.append(int(p.argmax()))
        ids.append(chosen[-1])
    return chosen, probs


@pytest.mark.parametrize("name", NAMES)
def test_static_cache_matches_transformers(checkpoints, name):
    d, ref = checkpoints[name]
    with Engine.from_hf_dir(d, device="cpu", dtype="float32") as engine:
        model = engine.model
        ids = torch.tensor([prompts(engine.cfg.vocab_size)[0]])  # (1, 30)
        with torch.inference_mode():
            expected = ref(input_ids=ids).logits[0]  # (30, vocab)
            whole = model(ids, model.new_cache(30), 0, all_logits=True)[0]
            cache = model.new_cache(30)
            steps = [model(ids[:, :10], cache, 0, all_logits=True)[0]]
            steps += [model(ids[:, p:p + 1], cache, p) for p in range(10, 30)]  # one cached decode step each
            cached = torch.cat(steps)
    for got in (whole, cached):
        diff = (got - expected).abs().max().item()
        prob_diff = (got.softmax(-1) - expected.softmax(-1)).abs().max().item()
        print(f"{name}: max |logit diff| {diff:.2e}, max |prob diff| {prob_diff:.2e}")
        assert diff <= TOL and prob_diff <= TOL
    assert expected.abs().max() > 1.0  # not a comparison of near-zero logits


@pytest.mark.parametrize("name", NAMES)
def test_paged_batched_runs_match_transformers(checkpoints, name, monkeypatch):
    """Three runs submitted together share forward passes over the paged pool; prompts are read
    7 tokens a chunk, so chunks start past the window too. Each run's greedy path and raw
    probabilities are transformers'."""
    d, ref = checkpoints[name]
    with Engine.from_hf_dir(d, device="cpu", dtype="float32", prefill_chunk=7) as engine:
        engine.eos_ids = set()  # random weights: every run goes to NEW_TOKENS
        runs = prompts(engine.cfg.vocab_size)
        go, step = threading.Event(), engine.scheduler._step

        def held(active):  # the first pass waits until every run is in
            go.wait(60)
            return step(active)
        monkeypatch.setattr(engine.scheduler, "_step", held)
        params = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)
        with ThreadPoolExecutor(len(runs)) as pool:
            futures = [pool.submit(lambda ids: list(engine.generate_ids(ids, params, top_n=5)), ids)
                       for ids in runs]
            while engine.active_runs < len(runs):
                threading.Event().wait(0.001)
            go.set()
            results = [[e for e in f.result() if isinstance(e, StepEvent)] for f in futures]
    assert max(e.pool.active_runs for run in results for e in run) == len(runs)
    worst = 0.0
    for ids, events in zip(runs, results):
        chosen, probs = reference_greedy(ref, ids, NEW_TOKENS)
        assert [e.token_id for e in events] == chosen
        worst = max([worst] + [abs(c.raw_prob - p[c.id].item()) for e, p in zip(events, probs) for c in e.top])
    print(f"{name}: paged, batched: max |raw prob diff| {worst:.2e}")
    assert worst <= TOL


def test_a_window_shorter_than_the_context_changes_the_numbers(checkpoints):
    """Full attention in place of Mistral's window of 8 is far off over a
    30-token prompt, so the tests above would catch it."""
    d, ref = checkpoints["mistral"]
    full = transformers.MistralForCausalLM(transformers.MistralConfig(
        **{**ref.config.to_dict(), "sliding_window": None})).eval()
    full.load_state_dict(ref.state_dict())
    ids = torch.tensor([prompts(ref.config.vocab_size)[0]])
    with torch.inference_mode():
        gap = (ref(input_ids=ids).logits[0, -1].softmax(-1) - full(input_ids=ids).logits[0, -1].softmax(-1))
    assert gap.abs().max().item() > 1e-3


@pytest.mark.parametrize("name", NAMES)
def test_inside_one_token_and_the_lens_run(checkpoints, name):
    """The logit lens's last layer is the model's own distribution; a sliding layer's captured
    attention puts nothing outside its window; pattern capture and replay run."""
    d, _ = checkpoints[name]
    with Engine.from_hf_dir(d, device="cpu", dtype="float32") as engine:
        ids = prompts(engine.cfg.vocab_size)[0]
        for layer in range(engine.cfg.n_layers):
            cap = engine.capture(ids, layer)
            assert torch.allclose(cap.attention.sum(-1), torch.ones(engine.cfg.n_heads), atol=1e-5)
            if engine.cfg.is_sliding(layer):
                assert cap.attention[:, :len(ids) - engine.cfg.sliding_window].abs().max() == 0
            pattern = engine.attention_pattern(ids, layer)
            assert pattern.shape == (engine.cfg.n_heads, len(ids), len(ids))
        last = cap.lens[-1]
        assert [i for i, _ in last] == cap.probs.topk(len(last)).indices.tolist()
        assert max(abs(p - cap.probs[i].item()) for i, p in last) < 1e-6
        logits = engine.step_logits(ids)
        params = SamplingParams(temperature=0.8, top_k=20)
        stages, final = engine.replay(logits, params, RunState.at(params, ids, [], len(logits)), int(logits.argmax()))
        assert stages and abs(final.sum().item() - 1) < 1e-5
