"""The one-call decode step (inference/model/decode_step.py, kernels.c's token_lab_decode): the
same bits as the model's layer-by-layer path, row by row whoever else is in the step, read
through block tables or in place, and the float32 model against transformers."""

import pytest
import torch

from inference.events import StepEvent
from inference.model import kernels
from inference.model.decode_step import DecodeStep
from inference.sampling.params import SamplingParams
from inference.serving.engine import Engine
from inference.serving.static_step import StaticDecode

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C compiler here: torch's operators serve")

FAMILIES = ["gqa_tied", "linear_headdim", "qwen2", "qwen2_window", "mistral", "qwen3", "gemma3_text",
            "phi4_mini"]  # biases, windows, head dims, q/k norms, norms after each branch, RoPE on 12 of 16 dims


def model_dir(name, tiny_dirs, tmp_path, sp_model_bytes):
    from tiny_families import make_family_model
    return tiny_dirs[name] if name in tiny_dirs else make_family_model(tmp_path, name, sp_model_bytes)[0]


def count_calls(monkeypatch) -> list[tuple[int, bool]]:
    """Each step the one-call path ran: its rows, and whether it read its keys in place (no block table)."""
    calls, decode = [], kernels.decode

    def counted(dims, *args):
        ran = decode(dims, *args)
        calls.append((dims[0] if ran else 0, dims[9] == 0))
        return ran
    monkeypatch.setattr(kernels, "decode", counted)
    return calls


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("threads", [1, None])
def test_the_step_is_the_layer_paths_bits_for_every_row(tiny_dirs, tmp_path, sp_model_bytes, monkeypatch,
                                                       name, threads):
    """1, 3 (a bucket of 4) and 7 (of 8) runs at positions past the window of 8, over scattered
    blocks of a pool of random keys: logits and every written slot the same bits through the one
    call as through the layers; each run's row the same bits alone as beside the others. On one
    thread, and on the threads the step picks (in a fresh process all of torch's for a size's first
    call, one for its second)."""
    with Engine.from_hf_dir(model_dir(name, tiny_dirs, tmp_path, sp_model_bytes), "cpu", "float32") as engine:
        model, pool = engine.model, engine.scheduler.pool
        step, calls = model.decode_step, count_calls(monkeypatch)
        assert step is not None
        static = StaticDecode(model, pool, capture=False)
        blocks = [pool.take() for _ in range(9)]
        gen = torch.Generator().manual_seed(3)
        pool.k.copy_(torch.randn(pool.k.shape, generator=gen))
        pool.v.copy_(torch.randn(pool.v.shape, generator=gen))
        start_k, start_v = pool.k.clone(), pool.v.clone()
        positions = [20, 33, 5, 47, 9, 16, 40]
        tables = [[blocks[(3 * r + j) % 9] for j in range(p // 16 + 1)] for r, p in enumerate(positions)]
        slots = [t[p // 16] * 16 + p % 16 for t, p in zip(tables, positions)]
        tokens = [3, 4, 5, 6, 7, 8, 9]
        before = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)

        def run(n, one_call):
            pool.k.copy_(start_k)
            pool.v.copy_(start_v)
            model.decode_step = step if one_call else None
            with torch.inference_mode():
                logits = static(tokens[:n], positions[:n], slots[:n], tables[:n]).clone()
            return logits, pool.k.clone(), pool.v.clone()
        try:
            for n in (1, 3, 7):
                for _ in range(2):  # fresh: a size's first call on all threads, its second on one
                    fused, layers = run(n, True), run(n, False)
                    assert all(torch.equal(a, b) for a, b in zip(fused, layers))
                alone = [run(1, True)[0][0]] if n > 1 else []
                assert all(torch.equal(a, fused[0][0]) for a in alone)
                assert torch.isfinite(fused[0]).all() and fused[0].std() > 0
        finally:
            torch.set_num_threads(before)
            model.decode_step = step
            pool.give_back(blocks)
        assert {1, 4, 8} == {rows for rows, _ in calls} and not any(in_place for _, in_place in calls)


@pytest.mark.parametrize("name", ["gqa_tied", "qwen2_window", "mistral", "qwen3", "gemma3_text", "phi4_mini"])
def test_a_lone_run_read_in_place_matches_transformers_and_the_layers(tiny_dirs, tmp_path, sp_model_bytes,
                                                                      monkeypatch, name):
    """A lone run reads its consecutive blocks in place: 24 greedy tokens past the window through
    the one call, each step's probabilities within 1e-4 of transformers' float32 forward over the
    same tokens, and the same bits as the layer-by-layer path."""
    transformers = pytest.importorskip("transformers")
    directory = model_dir(name, tiny_dirs, tmp_path, sp_model_bytes)
    with Engine.from_hf_dir(directory, "cpu", "float32") as engine:
        calls = count_calls(monkeypatch)
        ids = engine.tokenizer.encode("the history of computing")
        params = SamplingParams(temperature=0.0, max_new_tokens=24)

        def run():
            engine.scheduler.prefix_cache.evict(engine.scheduler.pool.n_blocks)  # each reads its prompt afresh
            return [e for e in engine.generate_ids(ids, params, top_n=5) if isinstance(e, StepEvent)]
        fused = run()
        # every decode step (the first token comes from the prompt's pass), past the window of 8
        assert calls == [(1, True)] * (len(fused) - 1) and len(ids) + len(fused) > 16
        step, engine.model.decode_step = engine.model.decode_step, None
        layers = run()
        engine.model.decode_step = step
    assert [e.token_id for e in fused] == [e.token_id for e in layers]
    for a, b in zip(fused, layers):
        assert (a.raw_prob, a.entropy, [c.raw_prob for c in a.top]) == (b.raw_prob, b.entropy, [c.raw_prob for c in b.top])
    ref = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    with torch.inference_mode():
        logits = ref(torch.tensor([ids + [e.token_id for e in fused]])).logits[0]  # (T, vocab)
    probs = logits[len(ids) - 1:-1].double().softmax(-1)  # the distribution each token was drawn from
    for p, event in zip(probs, fused):
        assert abs(p[event.token_id].item() - event.raw_prob) <= 1e-4
        assert max(abs(p[c.id].item() - c.raw_prob) for c in event.top) <= 1e-4


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_runs_the_one_call(tiny_dirs, tmp_path, sp_model_bytes, name):
    """Every family's float32 model, and one with bfloat16 decode copies (the kernels read them as
    a GGUF file's blocks: kernels/quant.c), decodes in the one call."""
    directory = model_dir(name, tiny_dirs, tmp_path, sp_model_bytes)
    with Engine.from_hf_dir(directory, "cpu", "float32") as engine:
        assert isinstance(engine.model.decode_step, DecodeStep)
    with Engine.from_hf_dir(directory, "cpu", "float32", decode_dtype="bfloat16") as engine:
        assert isinstance(engine.model.decode_step, DecodeStep)
