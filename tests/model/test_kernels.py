"""The hand-written CPU kernels (inference/model/kernels) against float64 products and torch's
own operators, and the model through them against the model through torch's operators alone."""

import pytest
import torch
import torch.nn.functional as F

from inference.model import kernels

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C compiler here: torch's operators serve")


@pytest.mark.parametrize("out, inn", [(960, 576), (577, 576), (3, 5), (49, 1539), (1, 16)])
def test_gemv_equals_the_float64_product_to_float32_rounding(out, inn):
    gen = torch.Generator().manual_seed(out * inn)
    w, x = torch.randn(out, inn, generator=gen), torch.randn(inn, generator=gen)
    exact = w.double() @ x.double()
    got = kernels.gemv(w, x)
    assert got.dtype == torch.float32 and got.shape == (out,)
    # float32 products summed in float32: error of order sqrt(in) * eps * |w||x|
    bound = 1e-6 * (w.double().abs() @ x.double().abs()) * inn ** 0.5 + 1e-7
    assert ((got.double() - exact).abs() <= bound).all()


def test_gemv_reads_rows_a_stride_apart_and_refuses_what_it_cannot_read():
    gen = torch.Generator().manual_seed(1)
    big = torch.randn(64, 600, generator=gen)
    w, x = big[:, :576], torch.randn(576, generator=gen)  # rows 600 floats apart
    assert torch.allclose(kernels.gemv(w, x), w @ x, rtol=1e-5, atol=1e-5)
    assert kernels.gemv(w.t().contiguous().t(), x) is None  # column-major: not this kernel's layout
    assert kernels.gemv(w.double(), x.double()) is None


@pytest.mark.parametrize("heads, kv_heads, L", [(9, 3, 1), (9, 3, 37), (4, 4, 200), (8, 1, 17)])
def test_attend_one_equals_sdpa_and_float64(heads, kv_heads, L):
    d = 64
    gen = torch.Generator().manual_seed(L)
    q = torch.randn(heads, d, generator=gen)
    pool = torch.randn(L + 5, kv_heads, d, generator=gen)  # keys read in place from a larger pool
    k, v = pool[3:3 + L], torch.randn(L, kv_heads, d, generator=gen)
    scale = d ** -0.5
    got = kernels.attend_one(q, k, v, scale)
    sdpa = F.scaled_dot_product_attention(q[None, :, None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                          enable_gqa=heads != kv_heads)[0, :, 0]
    rep = heads // kv_heads
    kk, vv = k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)  # (L, heads, d)
    weights = torch.einsum("hd,lhd->hl", q.double(), kk).mul(scale).softmax(-1)
    exact = torch.einsum("hl,lhd->hd", weights, vv)
    assert (got.double() - exact).abs().max() < 1e-5
    assert (got - sdpa).abs().max() < 1e-5


def test_attend_one_reads_a_static_cache_layout():
    """keys (L, kv_heads, d) as a transposed view of a (kv_heads, capacity, d) cache."""
    gen = torch.Generator().manual_seed(3)
    cache_k, cache_v = torch.randn(2, 50, 32, generator=gen), torch.randn(2, 50, 32, generator=gen)
    q = torch.randn(6, 32, generator=gen)
    k, v = cache_k[:, :20].transpose(0, 1), cache_v[:, :20].transpose(0, 1)  # (20, 2, 32), strided
    sdpa = F.scaled_dot_product_attention(q[None, :, None], cache_k[None, :, :20], cache_v[None, :, :20],
                                          scale=0.3, enable_gqa=True)[0, :, 0]
    assert (kernels.attend_one(q, k, v, 0.3) - sdpa).abs().max() < 1e-5


def test_rms_norm_equals_torch():
    gen = torch.Generator().manual_seed(4)
    x, w = torch.randn(3, 1, 577, generator=gen) * 7, torch.randn(577, generator=gen)
    assert torch.allclose(kernels.rms_norm(x, w, 1e-5), F.rms_norm(x, (577,), w, 1e-5), rtol=1e-5, atol=1e-6)
    assert kernels.rms_norm(x[..., :500], w[:500], 1e-5) is None  # rows 577 floats apart


@pytest.mark.parametrize("name", ["gqa_tied", "linear_headdim", "qwen2", "gemma3_text"])
def test_a_model_decodes_the_same_through_the_kernels_as_through_torch(tiny_dirs, sp_model_bytes, tmp_path,
                                                                      monkeypatch, name):
    """Greedy tokens identical and every step's probabilities within 1e-5, a lone run through the
    engine's paged path past Gemma's window of 8, with and without the kernels."""
    from tiny_families import make_family_model

    from inference.events import StepEvent
    from inference.sampling.params import SamplingParams
    from inference.serving.engine import Engine
    directory = tiny_dirs[name] if name in tiny_dirs else make_family_model(tmp_path, name, sp_model_bytes)[0]

    def run():
        with Engine.from_hf_dir(directory, device="cpu", dtype="float32") as engine:
            ids = engine.tokenizer.encode("the history of computing")
            events = list(engine.generate_ids(ids, SamplingParams(temperature=0.0, max_new_tokens=12)))
        return [e for e in events if isinstance(e, StepEvent)]
    fast = run()
    monkeypatch.setattr(kernels, "_library", lambda: None)
    slow = run()
    assert [e.token_id for e in fast] == [e.token_id for e in slow] and len(fast) == 12
    for a, b in zip(fast, slow):
        assert abs(a.raw_prob - b.raw_prob) < 1e-5 and abs(a.entropy - b.entropy) < 1e-4
        assert [c.id for c in a.top[:3]] == [c.id for c in b.top[:3]]


def test_without_a_compiler_nothing_is_built_and_torch_serves(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(kernels.shutil, "which", lambda name: None)
    kernels._library.cache_clear()
    try:
        assert not kernels.available() and kernels.gemv(torch.ones(4, 4), torch.ones(4)) is None
        assert not (tmp_path / "token-lab").exists()
    finally:
        monkeypatch.undo()
        kernels._library.cache_clear()
    assert kernels.available()
