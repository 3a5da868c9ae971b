"""Weights in a GGUF file's own blocks (model/quant.py, kernels/quant.c): every block type against
gguf's own dequantization, products against float32 products of the dequantized matrix, a row's
numbers alone and beside others, the fallback without the kernels, and whole models against the
float32 path and transformers."""

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize

from inference.model import kernels, quant
from inference.model.quant import Part, QuantWeight

TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "F16"]
SHAPES = [(1, 1), (37, 2), (5, 3)]  # (rows, blocks a row): one block, many rows, odd shapes


# Where each type's float16 scales lie in its block (gguf cannot quantize these in numpy): bytes.
SCALES_AT = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,),
             "IQ4_NL": (0,), "IQ4_XS": (0,)}


def random_blocks(name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """(rows, bytes a row) of valid blocks: quantized by gguf where it can, else random bytes (any
    bits are valid weights, scales and mins) with random finite float16 scales."""
    rng = np.random.default_rng(seed)
    q = gguf.GGMLQuantizationType[name]
    if name in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16"):
        return quantize(rng.standard_normal((rows, cols)).astype(np.float32), q).view(np.uint8).reshape(rows, -1)
    block, size = gguf.GGML_QUANT_SIZES[q]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for at in SCALES_AT[name]:  # float16 scales in [0.001, 0.1)
        raw[..., at:at + 2] = rng.uniform(0.001, 0.1, size=(rows, cols // block, 1)).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def weight(name: str, rows: int, n_blocks: int, seed: int = 0) -> tuple[QuantWeight, torch.Tensor]:
    """A QuantWeight of random blocks, and gguf's dequantization of them (rows, cols) float32."""
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]][0]
    cols = n_blocks * (256 if block == 256 else 32)
    raw = random_blocks(name, rows, cols, seed)
    ref = dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(rows, cols).astype(np.float32)
    return (QuantWeight([Part(int(gguf.GGMLQuantizationType[name]), torch.from_numpy(raw))], cols),
            torch.from_numpy(ref))


def assert_product(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """y = x w^T to within float32 summation: 1e-5 of the sum of the products' magnitudes."""
    ref = x.double() @ w.double().T
    bound = 1e-5 * (x.double().abs() @ w.double().abs().T) + 1e-30
    assert ((y.double() - ref).abs() <= bound).all(), ((y.double() - ref).abs() / bound).max().item()


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("rows, n_blocks", SHAPES)
def test_blocks_dequantize_as_gguf_does(name, rows, n_blocks):
    w, ref = weight(name, rows, n_blocks)
    # The same float32 operations as gguf's numpy code: equal within one rounding (rtol 1e-7).
    torch.testing.assert_close(w.dequantize(), ref, rtol=1e-7, atol=0)
    torch.testing.assert_close(w.rows(rows // 2, rows), ref[rows // 2:], rtol=1e-7, atol=0)
    ids = torch.tensor([[rows - 1, 0], [rows // 2, rows - 1]])
    torch.testing.assert_close(w.gather(ids), ref[ids], rtol=1e-7, atol=0)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("rows, n_blocks", SHAPES)
def test_products_equal_float32_products_of_the_dequantized_matrix(name, rows, n_blocks):
    w, ref = weight(name, rows, n_blocks, seed=1)
    x = torch.randn(8, w.in_features, generator=torch.Generator().manual_seed(2))
    for n in (1, 2, 5, 8):  # a decode step's rows: on the blocks (in fours, pairs and alone)
        assert_product(w.matmul(x[:n], kernel_rows=16), x[:n], ref)
    # each row the same bits alone as beside others
    together = w.matmul(x, kernel_rows=16)
    for i in range(8):
        assert torch.equal(w.matmul(x[i:i + 1], kernel_rows=16)[0], together[i])


def test_many_rows_go_through_float32_tiles(monkeypatch):
    w, ref = weight("Q4_1", 37, 3, seed=3)
    monkeypatch.setattr(quant, "TILE_BYTES", 4 * 96 * 8)  # tiles of 8 rows: five of them, the last short
    x = torch.randn(20, w.in_features, generator=torch.Generator().manual_seed(4))
    assert_product(w.matmul(x, kernel_rows=16), x, ref)
    assert_product(w.matmul(x.view(4, 5, -1), kernel_rows=16).view(20, -1), x, ref)


def test_fused_weight_of_several_types_and_float32_rows():
    a, ra = weight("Q5_0", 6, 2, seed=5)
    b, rb = weight("Q8_0", 3, 2, seed=6)
    c = torch.randn(4, 64, generator=torch.Generator().manual_seed(7))
    w = QuantWeight.cat([a, b, QuantWeight.of_float(c), b])
    assert w.types() == ["Q5_0", "Q8_0", "F32", "Q8_0"] and w.shape == (16, 64)
    ref = torch.cat([ra, rb, c, rb])
    torch.testing.assert_close(w.dequantize(), ref, rtol=1e-7, atol=0)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(8))
    assert_product(w.matmul(x, kernel_rows=16), x, ref)
    assert w.nbytes == 6 * 2 * 22 + 2 * 3 * 2 * 34 + 4 * 64 * 4


def test_without_the_kernels_the_same_numbers(monkeypatch):
    w, ref = weight("Q4_K", 9, 2, seed=9)
    x = torch.randn(3, w.in_features, generator=torch.Generator().manual_seed(10))
    fast, fast_rows = w.matmul(x, kernel_rows=16), w.gather(torch.tensor([4, 0]))
    monkeypatch.setattr(kernels, "_library", lambda: None)
    assert kernels.qrows(w.desc, x, w.out_features) is None  # really the fallback
    # torch's product sums in another order: each within float32 summation of the reference
    assert_product(w.matmul(x, kernel_rows=16), x, ref)
    assert_product(fast, x, ref)
    torch.testing.assert_close(w.gather(torch.tensor([4, 0])), fast_rows, rtol=1e-7, atol=0)
    torch.testing.assert_close(w.dequantize(), ref, rtol=1e-7, atol=0)


def test_out_of_range_rows_are_refused():
    w, _ = weight("Q8_0", 4, 1)
    with pytest.raises(IndexError):
        w.gather(torch.tensor([4]))


# ---------------------------------------------------------------- whole models
MODELS = [("llama", "Q4_1", None), ("llama", "Q8_0", None), ("qwen2", "Q5_0", "Q4_K"), ("gemma3_text", "Q4_0", "Q6_K")]


def greedy_steps(engine, ids, n=6):
    from inference.events import StepEvent
    from inference.sampling.params import SamplingParams
    events = engine.generate_ids(ids, SamplingParams(temperature=0.0, max_new_tokens=n), top_n=5)
    return [e for e in events if isinstance(e, StepEvent)]


@pytest.mark.parametrize("family, qtype, kquant", MODELS, ids=[f"{m[0]}-{m[1]}" for m in MODELS])
def test_a_gguf_model_decodes_on_its_blocks_as_on_float32(tmp_path, sp_model_bytes, tiny_dirs, family, qtype, kquant):
    """By default an imported GGUF model computes on the file's blocks (no float32 matrices held);
    --dtype float32 on the expanded weights gives the same probabilities within 1e-5."""
    from gguf_files import write_gguf
    from inference.loading.gguf_import import import_gguf
    from inference.model.layers import Linear
    from inference.serving.engine import Engine
    from tiny_families import make_family_model

    if family == "llama":
        src = tiny_dirs["gqa_tied"] if qtype == "Q4_1" else tiny_dirs["mha"]
    else:
        changes = dict(num_hidden_layers=6, layer_types=None, query_pre_attn_scalar=32, final_logit_softcapping=None,
                       rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}
                       ) if family == "gemma3_text" else {}
        src, _ = make_family_model(tmp_path, family, sp_model_bytes, intermediate_size=256, **changes)
    write_gguf(src, tmp_path / "m.gguf", qtype, kquant=kquant)
    model_dir = import_gguf(tmp_path / "m.gguf", tmp_path / "imported", progress=False)
    with Engine.from_hf_dir(model_dir) as blocks, Engine.from_hf_dir(model_dir, dtype="float32") as f32:
        linears = [m for m in blocks.model.modules() if isinstance(m, Linear)]
        assert blocks.model.quantized and all(m.weight is None and m.qweight is not None for m in linears)
        assert not f32.model.quantized
        if family == "llama":  # the whole decode step in one call, on the blocks
            assert blocks.model.decode_step is not None
        ids = blocks.tokenizer.encode("the history of computing")
        a, b = greedy_steps(blocks, ids), greedy_steps(f32, ids)
    assert [e.token_id for e in a] == [e.token_id for e in b] and len(a) == 6
    for x, y in zip(a, b):
        assert abs(x.raw_prob - y.raw_prob) <= 1e-5
        assert [c.id for c in x.top] == [c.id for c in y.top]
        assert max(abs(c.raw_prob - d.raw_prob) for c, d in zip(x.top, y.top)) <= 1e-5


@pytest.mark.parametrize("cols", [96, 50])  # whole chunks of 32 (AVX2's lanes), and not (through a buffer)
def test_bfloat16_decode_copies_are_read_as_their_float32_values(cols):
    w = torch.randn(33, cols, generator=torch.Generator().manual_seed(11))
    q, ref = QuantWeight.bfloat16(w), w.to(torch.bfloat16).float()
    assert q.types() == ["BF16"] and q.nbytes == 33 * cols * 2
    torch.testing.assert_close(q.dequantize(), ref, rtol=0, atol=0)  # widening bfloat16 is exact
    x = torch.randn(8, cols, generator=torch.Generator().manual_seed(12))
    together = q.matmul(x, kernel_rows=16)  # in fours, then pairs
    assert_product(q.matmul(x[:3], kernel_rows=16), x[:3], ref)
    assert_product(together, x, ref)
    for i in range(8):  # each row the same bits alone as beside others
        assert torch.equal(q.matmul(x[i:i + 1], kernel_rows=16)[0], together[i])


def test_a_decode_steps_bytes_are_the_blocks_it_reads(tiny_dirs, tmp_path):
    """Inside one token's and the run's byte counts on a Q4_1 file: by hand, 20 bytes per 32
    weights (the tied Q4_1 embedding is the LM head), float32 norms and KV cache."""
    from gguf_files import write_gguf
    from inference.loading.gguf_import import import_gguf
    from inference.model.anatomy import decode_cost
    from inference.serving.engine import Engine

    write_gguf(tiny_dirs["gqa_tied"], tmp_path / "m.gguf", "Q4_1")
    with Engine.from_hf_dir(import_gguf(tmp_path / "m.gguf", tmp_path / "imported", progress=False)) as engine:
        info = engine.describe()
    cfg, ctx = info.cfg, 9
    h, L = cfg.hidden_size, cfg.n_layers
    q4_1 = lambda values: values // 32 * 20  # noqa: E731
    matrices = L * q4_1(h * (cfg.q_dim + 2 * cfg.kv_dim) + cfg.q_dim * h + 3 * h * cfg.intermediate_size)
    head = q4_1(cfg.vocab_size * h)
    kv_and_norms = L * (2 * ctx * cfg.kv_dim * 4 + 2 * h * 4) + h * 4
    assert decode_cost(cfg, ctx, 4, 4, info.stored_bytes).bytes == matrices + head + q4_1(h) + kv_and_norms
    f32 = decode_cost(cfg, ctx, 4, 4).bytes  # the float32 figure shown beside it
    assert f32 == 4 * (L * (h * (cfg.q_dim + 2 * cfg.kv_dim) + cfg.q_dim * h + 3 * h * cfg.intermediate_size)
                       + cfg.vocab_size * h + h) + kv_and_norms


def test_an_imported_gguf_keeps_no_copy_of_its_weights(tiny_dirs, tmp_path):
    """The import writes config and tokenizer only; the model computes on the file's own blocks
    (no float32 copy of a quantized matrix, in memory or on disk); float32 is made only when asked;
    the file gone, the directory is refused in one line."""
    from gguf_files import write_gguf
    from inference.errors import ModelError
    from inference.loading.gguf_import import import_gguf
    from inference.model.layers import Linear
    from inference.serving.engine import Engine

    write_gguf(tiny_dirs["mha"], tmp_path / "m.gguf", "Q8_0")
    model_dir = import_gguf(tmp_path / "m.gguf", tmp_path / "imported", progress=False)
    assert not list(model_dir.glob("*.safetensors"))
    assert sum(f.stat().st_size for f in model_dir.iterdir()) < (tmp_path / "m.gguf").stat().st_size / 4
    with Engine.from_hf_dir(model_dir) as engine:
        linears = [m for m in engine.model.modules() if isinstance(m, Linear)]
        assert engine.model.quantized
        assert all(m.weight is None and m.qweight.types() == ["Q8_0"] for m in linears)
        assert all(not isinstance(getattr(m, "decode_weight", None), torch.Tensor) for m in linears)
        blocks = engine.step_logits([1, 5, 9])
    with Engine.from_hf_dir(model_dir, dtype="float32") as engine:  # asked for: float32, from the file
        assert not engine.model.quantized
        assert (engine.step_logits([1, 5, 9]) - blocks).abs().max() < 1e-4
    (tmp_path / "m.gguf").unlink()
    with pytest.raises(ModelError, match="imported from is gone"):
        Engine.from_hf_dir(model_dir)


def test_a_mapped_files_pages_given_back_read_the_same_bytes(tmp_path):
    """arena.release_pages on a private mapping never written: its pages leave resident memory,
    and a later read maps the file's bytes again (what gguf_weights relies on)."""
    import sys

    from inference.model.arena import release_pages

    data = np.random.default_rng(0).integers(0, 256, 3 * 4096 + 100, dtype=np.uint8)
    (tmp_path / "f").write_bytes(data.tobytes())
    mapped = np.memmap(tmp_path / "f", dtype=np.uint8, mode="c")
    view = mapped[50:]
    assert np.array_equal(view, data[50:])  # touched
    assert release_pages(view.ctypes.data, view.nbytes) == sys.platform.startswith("linux")
    assert np.array_equal(view, data[50:]) and np.array_equal(mapped, data)
