"""Generation on a tiny checkpoint: events, stop reasons, KV accounting, seeds, chat, cancel."""

import threading

import pytest
from engine_hold import wait_until
import torch

from inference.serving.engine import Request
from inference.errors import InputError
from inference.events import DoneEvent, PrefillEvent, StepEvent
from inference.sampling.params import SamplingParams


def run(engine, prompt="The quick brown fox", cancel=None, **kw):
    top_n = kw.pop("top_n", 5)
    chat = kw.pop("chat", False)
    events = list(engine.generate(Request(prompt, SamplingParams(**kw), chat=chat, top_n=top_n), cancel))
    progress = [e for e in events if isinstance(e, PrefillEvent)]  # a long prompt's chunks, first
    steps = events[len(progress):-1]
    assert isinstance(events[-1], DoneEvent) and all(isinstance(e, StepEvent) for e in steps)
    return steps, events[-1]


def test_greedy_matches_a_hand_rolled_argmax_loop(tiny_engine):
    steps, done = run(tiny_engine, temperature=0.0, max_new_tokens=12)
    ids = tiny_engine.tokenizer.encode("The quick brown fox")
    model = tiny_engine.model
    with torch.inference_mode():
        for s in steps:  # a full forward over everything so far, no cache reuse
            logits = model(torch.tensor([ids]), model.new_cache(len(ids)), 0)[0]
            assert s.token_id == int(logits.argmax())
            assert s.prob == 1.0
            assert s.raw_prob == pytest.approx(logits.softmax(-1).max().item(), abs=1e-6)
            ids.append(s.token_id)
    assert done.reason == "length" and done.generated_tokens == 12


def test_events_report_kv_bytes_and_first_step_extras(tiny_engine):
    steps, done = run(tiny_engine, max_new_tokens=6, seed=1)
    cfg = tiny_engine.cfg
    per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4  # float32
    n_prompt = done.prompt_tokens
    assert steps[0].prompt_tokens == n_prompt and steps[0].prefill_ms > 0
    assert all(s.prompt_tokens is None for s in steps[1:])
    for s in steps:
        assert s.kv_cache_bytes == (n_prompt + s.step) * per_token
        blocks = -(-(n_prompt + s.step) // 16)  # the paged cache holds 16-position blocks
        assert s.kv_blocks == blocks and s.kv_cache_capacity_bytes == blocks * 16 * per_token
        assert 1 <= len(s.top) <= 6 and s.token_id in [c.id for c in s.top]
        assert sum(c.raw_prob for c in s.top) <= 1 + 1e-6
    assert done.text == "".join(s.text for s in steps) + done.tail


def test_seed_reproduces_and_differs(tiny_engine):
    kw = dict(temperature=1.5, max_new_tokens=20)
    a, _ = run(tiny_engine, seed=123, **kw)
    b, _ = run(tiny_engine, seed=123, **kw)
    c, _ = run(tiny_engine, seed=124, **kw)
    assert [s.token_id for s in a] == [s.token_id for s in b]
    assert [s.token_id for s in a] != [s.token_id for s in c]
    # Without a seed the run draws one, and the one it reports reproduces it.
    d, done = run(tiny_engine, **kw)
    again, _ = run(tiny_engine, seed=done.seed, **kw)
    assert [s.token_id for s in d] == [s.token_id for s in again]


def test_top_k_one_equals_greedy(tiny_engine):
    g, _ = run(tiny_engine, temperature=0.0, max_new_tokens=8)
    k, _ = run(tiny_engine, temperature=1.0, top_k=1, max_new_tokens=8, seed=5)
    assert [s.token_id for s in g] == [s.token_id for s in k]


def test_eos_stops_and_is_not_emitted(tiny_engine, monkeypatch):
    steps, _ = run(tiny_engine, temperature=0.0, max_new_tokens=8)
    eos = steps[3].token_id
    monkeypatch.setattr(tiny_engine, "eos_ids", {eos})
    steps2, done = run(tiny_engine, temperature=0.0, max_new_tokens=8)
    first = next(i for i, s in enumerate(steps) if s.token_id == eos)
    assert done.reason == "eos" and len(steps2) == first + 1
    assert steps2[-1].text == ""


def test_stop_string_is_not_emitted(tiny_engine):
    steps, done = run(tiny_engine, temperature=0.0, max_new_tokens=30)
    text = done.text
    stop = text[5:8]
    assert len(stop) == 3 and stop.strip()
    _, done2 = run(tiny_engine, temperature=0.0, max_new_tokens=30, stop=(stop,))
    assert done2.reason == "stop"
    assert done2.text == text[:text.index(stop)]


def test_max_new_tokens_capped_at_context(tiny_engine):
    ctx = tiny_engine.cfg.max_seq_len
    prompt = " ".join(["fox"] * 400)
    ids = tiny_engine.tokenizer.encode(prompt)
    assert len(ids) > ctx  # too long: a clear error with both counts
    with pytest.raises(InputError, match=rf"{len(ids)} tokens.*context window is {ctx}"):
        tiny_engine.generate(Request(prompt, SamplingParams()))
    short = tiny_engine.tokenizer.decode(ids[1:ctx - 3]).strip()  # leaves a few positions
    n = len(tiny_engine.tokenizer.encode(short))
    steps, done = run(tiny_engine, prompt=short, temperature=0.0, max_new_tokens=50)
    assert done.capped and done.max_new_tokens == ctx - n
    assert done.reason in ("context", "eos") and len(steps) <= ctx - n


@pytest.mark.parametrize("prompt", ["", "   \n\t "])
def test_empty_prompt_is_rejected(tiny_engine, prompt):
    with pytest.raises(InputError, match="empty"):
        tiny_engine.generate(Request(prompt, SamplingParams()))


def test_cancel_ends_within_one_step_and_frees_the_cache(tiny_engine, hold, monkeypatch):
    monkeypatch.setattr(tiny_engine, "eos_ids", set())  # still going at token 3
    held = hold(tiny_engine)
    cancel = threading.Event()
    gen = tiny_engine.generate(Request("The quick", SamplingParams(max_new_tokens=50, seed=1)), cancel)
    held.allow(3)
    seen = [next(gen) for _ in range(3)]
    wait_until(lambda: held.started > 3, "the 4th pass to be held")
    assert tiny_engine.active_runs == 1
    cancel.set()  # the pass in progress (the 4th token) ends, then the run
    seen += list(gen)
    assert isinstance(seen[-1], DoneEvent) and seen[-1].reason == "cancelled"
    assert len(seen) == 4 + 1 and tiny_engine.active_runs == 0
    assert tiny_engine.scheduler.stats().blocks_used == 0


def test_closing_the_generator_frees_the_cache(tiny_engine):
    gen = tiny_engine.generate(Request("The quick", SamplingParams(max_new_tokens=50, seed=1)))
    next(gen)
    assert tiny_engine.active_runs == 1
    gen.close()
    assert tiny_engine.active_runs == 0


def test_chat_mode_renders_the_template(tiny_engine):
    ids = tiny_engine.prompt_ids("hello", chat=True, system="be brief")
    tok = tiny_engine.tokenizer
    start = tok.special_tokens["<|im_start|>"]
    assert ids[0] == start and ids.count(start) == 3  # system, user, assistant header
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")


def test_chat_template_runs_sandboxed():
    from inference.loading.chat import render_chat
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(InputError, match="chat template failed"):
        render_chat(evil, [{"role": "user", "content": "x"}])
    with pytest.raises(InputError, match="chat template failed"):
        render_chat("{{ raise_exception('no system role') }}", [])


@pytest.mark.parametrize("kernels_built", [True, False])
def test_cpu_weights_are_laid_out_for_few_rows_and_the_file_is_let_go(tiny_dirs, monkeypatch, kernels_built):
    """On a CPU each linear weight is stored row-major for our matrix-vector kernel, or
    column-major for MKL's where the kernel is not built (same values as in the file either way),
    the tied embedding shares the LM head's copy, and no tensor keeps the checkpoint file mapped."""
    from safetensors.torch import load_file

    from inference.model import kernels
    from inference.serving.engine import Engine
    if not kernels_built:
        monkeypatch.setattr(kernels, "_library", lambda: None)
    elif not kernels.available():
        pytest.skip("no C compiler here")
    path = tiny_dirs["gqa_tied"] / "model.safetensors"
    engine = Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32")
    model = engine.model
    wo = model.layers[0].attention.wo.weight
    assert wo.is_contiguous() == kernels_built and wo.t().is_contiguous() != kernels_built
    assert torch.equal(wo, load_file(str(path))["model.layers.0.self_attn.o_proj.weight"])
    assert model.tok_embeddings.weight is model.output.weight
    try:
        maps = open("/proc/self/maps").read()
    except OSError:
        pytest.skip("no /proc/self/maps here")
    assert str(path) not in maps


def test_several_rows_use_onednn_copy_with_float32_results(tiny_dirs, monkeypatch):
    """On a float32 CPU model each linear layer keeps a oneDNN copy for products of two rows or
    more; its results equal the float32 product on the weight itself (to float32 rounding), and
    one row still reads the weight. The copy is skipped when it would take more than a quarter
    of the memory available. (Where our kernels are built, 2 to 16 rows use them instead:
    tests/model/test_kernels.py; here, a machine without a C compiler.)"""
    from inference.model import kernels
    from inference.serving.engine import Engine
    from inference.model.transformer import Linear
    monkeypatch.setattr(kernels, "_library", lambda: None)
    model = Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32").model
    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN in this build of torch")
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert all(m.rows_weight is not None for m in linears)
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for m in (model.layers[0].attention.wqkv, model.layers[1].feed_forward.w2, model.output):
            w64 = m.weight.double()
            for rows in (1, 2, 8, 33):
                x = torch.randn(1, rows, m.in_features, generator=gen)
                exact = (x.double() @ w64.t()).float()  # (1, rows, out_features)
                got = m(x)
                assert got.shape == exact.shape
                assert torch.allclose(got, exact, rtol=1e-5, atol=1e-5)
        # Which copy each row count reads: a copy of twice the weight doubles 2 rows, not 1.
        head, copy = model.output, model.output.rows_weight
        head.rows_weight = torch.ops.mkldnn._reorder_linear_weight(2 * head.weight.detach(), 8)
        x = torch.randn(1, 2, head.in_features, generator=gen)
        assert torch.allclose(head(x[:, :1]), x[:, :1] @ head.weight.t(), rtol=1e-5, atol=1e-5)
        assert torch.allclose(head(x), 2 * (x @ head.weight.t()), rtol=1e-5, atol=1e-5)
        head.rows_weight = copy
        size = sum(m.weight.numel() * m.weight.element_size() for m in linears)
        for m in linears:
            m.rows_weight = None
        assert not model.keep_rows_copies(4 * size - 1)
        assert all(m.rows_weight is None for m in linears)
        assert model.keep_rows_copies(4 * size) and all(m.rows_weight is not None for m in linears)
        for m in linears:
            m.rows_weight = None

        def missing(*args):  # a build of torch without the operator
            raise RuntimeError("no such operator")
        monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", missing)
        assert not model.keep_rows_copies(4 * size) and all(m.rows_weight is None for m in linears)
        x = torch.randn(1, 8, model.output.in_features, generator=gen)
        assert torch.allclose(model.output(x), x @ model.output.weight.t(), rtol=1e-5, atol=1e-5)
