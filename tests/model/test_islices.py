"""The integer products (kernels/islices.c, model/products.py): a GGUF file's blocks repacked 16 rows
at a time read back as gguf dequantizes them; every output within the stated bound of the float32
product of the dequantized weights, on random rows and on the shipped models' real rows; the bound
broken when a slice is dropped; a row's result the same bits alone or in a batch of any size, on
one thread or two."""

import gguf
import numpy as np
import pytest
import torch

from inference.model import kernels
from inference.model.quant import Part, QuantWeight
from test_quant import random_blocks, weight

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C compiler here: no integer products")

TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]
U = 2.0 ** -24


def mins(name: str, raw: np.ndarray, cols: int) -> np.ndarray:
    """(rows, cols) float64: each weight's block min term |m| (Q4_1's and Q5_1's m, a K-quant
    sub-block's dmin mn: Q2_K's for each 16 weights), 0 for types without one: the bound's second
    sum counts it."""
    rows = raw.shape[0]
    if name in ("Q4_1", "Q5_1"):
        blocks = raw.reshape(rows, cols // 32, -1)
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)  # (rows, blocks)
        return np.repeat(np.abs(m), 32, axis=1)
    if name == "Q2_K":
        blocks = raw.reshape(rows, cols // 256, 84)
        dmin = blocks[..., 82:84].copy().view(np.float16)[..., 0].astype(np.float64)  # (rows, blocks)
        mn = (blocks[..., :16] >> 4).astype(np.float64)  # (rows, blocks, 16): a min each 16 weights
        return np.repeat(np.abs(dmin[..., None] * mn).reshape(rows, -1), 16, axis=1)
    if name in ("Q4_K", "Q5_K"):
        size = 144 if name == "Q4_K" else 176
        blocks = raw.reshape(rows, cols // 256, size)
        dmin = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)  # (rows, blocks)
        s = blocks[..., 4:16].astype(np.int64)  # the 12 bytes of 6-bit scales and mins
        mn = np.empty(blocks.shape[:2] + (8,), dtype=np.int64)
        mn[..., :4] = s[..., 4:8] & 63
        mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
        return np.repeat(np.abs(dmin[..., None] * mn).reshape(rows, -1), 32, axis=1)
    return np.zeros((rows, cols))


def bound(w: torch.Tensor, m: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    """model/products.py's BOUND for every output of x (R, n) against w (out, n), in float64:
    2^-17 sum_b s_b sum_{i in b} |w_i| + 1.01 (3n/32 + 16) 2^-24 sum_i (|w_i| + |m_i|) |x_i|."""
    x64, w64 = x.double(), w.double().abs()
    n = x.shape[1]
    mx = x64.abs().reshape(x.shape[0], n // 32, 32).amax(-1)  # (R, blocks)
    e = torch.ceil(torch.log2(mx / 127)).clamp(min=-100)
    e = torch.where(127 * 2.0 ** (e - 1) >= mx, e - 1, e)  # the least 2^e with 127 2^e >= mx
    e = torch.where(127 * 2.0 ** e < mx, e + 1, e)
    s = torch.where(mx > 0, 2.0 ** e, torch.zeros_like(mx))
    per_block = w64.reshape(w.shape[0], n // 32, 32).sum(-1)  # (out, blocks)
    slices = 2.0 ** -17 * (s @ per_block.T)
    rounding = 1.01 * (3 * n / 32 + 16) * U * (x64.abs() @ (w64 + torch.from_numpy(m)).T)
    return slices + rounding


def cases(name: str, rows: int, n_blocks: int, seed: int):
    """A random weight of the type (its raw blocks, QuantWeight, dequantized float32 and mins) and
    activations like a model's: mostly small, a few large features, one block all zero."""
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]][0]
    cols = n_blocks * (256 if block == 256 else 32)
    w, ref = weight(name, rows, n_blocks, seed)
    raw = random_blocks(name, rows, cols, seed)
    g = torch.Generator().manual_seed(seed + 100)
    x = torch.randn(9, cols, generator=g) * torch.logspace(-3, 1, 9)[:, None]
    x[:, ::13] *= 40  # outlier features: a block's largest value far above its others
    x[3, :32] = 0
    return w, ref, mins(name, raw, cols), x


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("rows, n_blocks", [(16, 1), (37, 2), (48, 3), (5, 1)])
def test_repacked_blocks_read_back_as_gguf_dequantizes_them(name, rows, n_blocks):
    w, ref = weight(name, rows, n_blocks, seed=3)
    r = w.repacked()
    assert r.integer and r.types() == [name]
    assert torch.equal(r.dequantize(), w.dequantize())  # the same float32 operations: the same bits
    torch.testing.assert_close(r.dequantize(), ref, rtol=1e-7, atol=0)
    ids = torch.tensor([rows - 1, 0, rows // 2])
    assert torch.equal(r.gather(ids), w.gather(ids))


@pytest.mark.parametrize("name", TYPES)
def test_integer_products_are_within_the_stated_bound_of_float32(name):
    for rows, n_blocks, seed in ((37, 2, 1), (64, 3, 2)):
        w, ref, m, x = cases(name, rows, n_blocks, seed)
        r = w.repacked()
        for R in (1, 2, 5, 9):
            y_int = r.matmul(x[:R], kernel_rows=16).double()
            y_f32 = w.matmul(x[:R], kernel_rows=16).double()  # the float32 path, the reference
            err = (y_int - y_f32).abs()
            assert (err <= bound(ref, m, x[:R])).all(), (name, R, (err / bound(ref, m, x[:R])).max().item())


@pytest.mark.parametrize("name", TYPES)
def test_the_bound_fails_when_a_slice_is_dropped(name):
    """Activations whose last slice carries all but one value of each block (127 sets the block's
    scale to 1; the rest just under 2^-9, signed as row 0's weights, so two slices round them
    all to 0): with two slices row 0's error is ~2^-9 per weight, above the bound. The 127 of
    each block of 32 goes where row 0's |w| + |m| is least (Q2_K's mins, large beside its 2-bit
    weights, would otherwise make the bound's rounding term at 127 the larger)."""
    w, ref, m, _ = cases(name, 64, 3, seed=2)
    x = 0.999 * 2.0 ** -9 * torch.sign(ref[:1])  # (1, n)
    size = (ref[0].abs().double() + torch.from_numpy(m[0])).reshape(-1, 32)  # (blocks, 32)
    x[0, torch.arange(size.shape[0]) * 32 + size.argmin(1)] = 127.0
    r = w.repacked()
    y_f32 = w.matmul(x, kernel_rows=16).double()
    assert ((r.matmul(x, kernel_rows=16).double() - y_f32).abs() <= bound(ref, m, x)).all()
    try:
        kernels.set_slices(2)
        y2 = r.matmul(x, kernel_rows=16).double()
    finally:
        kernels.set_slices(3)
    assert (y2 - y_f32).abs()[0, 0] > bound(ref, m, x)[0, 0], ((y2 - y_f32).abs()[0, 0] / bound(ref, m, x)[0, 0]).item()


@pytest.mark.parametrize("name", TYPES)
def test_the_largest_integers_stay_within_the_bound(name):
    """Every weight bit set (each type's largest stored integers, scales and mins; Q8_0's -1s)
    and activations of +-127 (each slice's largest a1): the widest int32 sums islices.c states
    (Q2_K's scaled halves, the IQ4 values' unsigned bytes), still within the bound."""
    from test_quant import SCALES_AT
    rows, n_blocks = 16, 2
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
    cols = n_blocks * (256 if block == 256 else 32)
    raw = np.full((rows, cols // block, size), 0xFF, dtype=np.uint8)
    for at in SCALES_AT.get(name, (0, 2) if name in ("Q4_1", "Q5_1") else (0,)):
        raw[..., at:at + 2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    raw = raw.reshape(rows, -1)
    ref = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(rows, cols).astype(np.float32))
    w = QuantWeight([Part(int(gguf.GGMLQuantizationType[name]), torch.from_numpy(raw))], cols)
    x = torch.full((3, cols), 127.0)
    x[1] = -127.0
    x[2, 1::2] = -127.0
    y_int = w.repacked().matmul(x, kernel_rows=16).double()
    y_f32 = w.matmul(x, kernel_rows=16).double()
    assert (ref.abs().sum() > 0) and ((y_int - y_f32).abs() <= bound(ref, mins(name, raw, cols), x)).all()


@pytest.mark.parametrize("name", TYPES)
def test_a_rows_result_is_the_same_bits_alone_in_any_batch_and_on_any_threads(name):
    w, _, _, x = cases(name, 48, 2, seed=4)
    r = w.repacked()
    x = torch.cat([x, x.flip(0), x[:5]])  # 23 rows: batches of 1 to 23, a tile of four cut anywhere
    alone = torch.stack([r.matmul(x[i:i + 1], kernel_rows=16)[0] for i in range(len(x))])
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            for n in (2, 3, 5, 8, 16, 23):
                assert torch.equal(r.matmul(x[:n], kernel_rows=16), alone[:n]), (t, n)
    finally:
        torch.set_num_threads(threads)


def test_a_weight_of_several_parts_keeps_its_rows_in_order():
    """A fused weight whose parts are of different types (as Gemma's q/k/v: Q5_0 and Q8_0): each
    part repacked in place, and a part that does not start on a group of 16 rows kept as it is
    (the products hand out whole groups)."""
    specs = [("Q5_0", 32), ("Q8_0", 21), ("Q4_1", 7), ("Q4_0", 16)]
    made = [weight(name, rows, 8, seed=rows) for name, rows in specs]
    mixed = QuantWeight([w.parts[0] for w, _ in made], 256)
    r = mixed.repacked()
    assert [p.type > 1000 for p in r.parts] == [True, True, False, False]  # rows 53 and 60 start mid-group
    ref = torch.cat([ref for _, ref in made])
    assert torch.equal(r.dequantize(), mixed.dequantize())
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(11))
    torch.testing.assert_close(r.matmul(x, kernel_rows=16), x @ ref.T, rtol=0, atol=1e-4)


def test_a_non_finite_activation_gives_nan_as_float32_does():
    w, _ = weight("Q4_0", 16, 2, seed=5)
    x = torch.randn(2, 64)
    x[0, 3] = float("inf")
    x[1, 40] = float("nan")
    y = w.repacked().matmul(x, kernel_rows=16)
    assert y.isnan().all()
    assert (w.matmul(x, kernel_rows=16).isnan() | w.matmul(x, kernel_rows=16).isinf()).all()


# ---------------------------------------------------------------- the shipped models' real rows
def real_inputs(model_dir, prompt: str):
    """The model on its float32 products, and each quantized matrix with the activations it
    multiplied on a real prompt: {name: (QuantWeight, inputs (tokens, in))}."""
    from inference.serving.engine import Engine
    engine = Engine.from_hf_dir(model_dir, device="cpu", products="float32")
    seen, hooks = {}, []

    def keep(name, mod, inputs):  # a pre-hook: returns None, so the input goes on unchanged
        seen.setdefault(name, (mod.qweight, inputs[0].reshape(-1, inputs[0].shape[-1]).clone()))
    for name, m in engine.model.named_modules():
        if getattr(m, "qweight", None) is not None and name != "tok_embeddings":
            hooks.append(m.register_forward_pre_hook(lambda mod, inputs, name=name: keep(name, mod, inputs)))
    ids = engine.tokenizer.encode(prompt)
    with torch.inference_mode():
        engine.model(torch.tensor([ids]), engine.model.new_cache(len(ids)), 0)
    for h in hooks:
        h.remove()
    return engine, seen


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma3-270m"])
def test_the_shipped_models_real_rows_are_within_the_bound(model):
    from gguf.quants import dequantize
    from inference.loading.default_model import default_model_dir, gemma_model_dir
    engine, seen = real_inputs(default_model_dir() if model == "smollm2" else gemma_model_dir(),
                               "The capital of France is Paris, and 1, 1, 2, 3, 5, 8 are")
    checked = set()
    with engine:
        for name, (qw, x) in list(seen.items())[:14] + list(seen.items())[-4:]:  # first layers, last, the head
            for p in qw.parts:
                if p.name == "F32":
                    continue
                raw = p.data[:256].contiguous()  # enough rows to see, few enough to be quick
                part = QuantWeight([Part(p.type, raw)], qw.in_features)
                ref = torch.from_numpy(dequantize(raw.numpy(), gguf.GGMLQuantizationType(p.type)).astype(np.float32))
                y_int = part.repacked().matmul(x, kernel_rows=16).double()
                y_f32 = part.matmul(x, kernel_rows=16).double()
                b = bound(ref.reshape(raw.shape[0], -1), mins(p.name, raw.numpy(), qw.in_features), x)
                assert ((y_int - y_f32).abs() <= b).all(), (name, p.name, ((y_int - y_f32).abs() / b).max().item())
                checked.add(p.name)
    assert checked >= ({"Q4_1", "Q8_0"} if model == "smollm2" else {"Q4_K", "Q6_K", "Q8_0", "Q5_0"}), checked
