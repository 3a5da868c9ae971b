"""The hand-written CPU kernels (inference/model/kernels) against float64 products and torch's
own operators, and the model through them against the model through torch's operators alone."""

import pytest
import torch
import torch.nn.functional as F

from inference.model import kernels
from inference.sampling.stages import sample

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


def test_a_rows_product_gives_each_row_the_bits_it_has_alone():
    """gemm_rows: every row equal to gemv of that row alone, bit for bit, so a run's numbers do
    not depend on who else is in the step; and within float32 rounding of the float64 product."""
    gen = torch.Generator().manual_seed(2)
    for out, inn in ((960, 576), (37, 1539)):
        w, x = torch.randn(out, inn, generator=gen), torch.randn(11, inn, generator=gen)
        together = kernels.gemm_rows(w, x)
        assert all(torch.equal(together[r], kernels.gemv(w, x[r])) for r in range(11))
        exact = x.double() @ w.double().t()
        bound = 1e-6 * (x.double().abs() @ w.double().abs().t()) * inn ** 0.5 + 1e-7
        assert ((together.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("out, inn, rows", [(960, 576, 130), (37, 1539, 41), (5, 33, 4), (6, 64, 9)])
def test_many_rows_tiles_give_each_row_the_bits_it_has_alone(out, inn, rows):
    """gemm_tiles (a prompt's rows, tiles of 4 weight rows by 3 rows, the X rows in blocks): every
    row equal to gemv of that row alone, with and without a tail past the chunks of 32 (the
    endings summed eight outputs at once, or one by one), the last tiles short."""
    gen = torch.Generator().manual_seed(out + rows)
    w, x = torch.randn(out, inn, generator=gen), torch.randn(rows, inn, generator=gen)
    together = kernels.gemm_tiles(w, x)
    assert all(torch.equal(together[r], kernels.gemv(w, x[r])) for r in range(rows))
    exact = x.double() @ w.double().t()
    bound = 1e-6 * (x.double().abs() @ w.double().abs().t()) * inn ** 0.5 + 1e-7
    assert ((together.double() - exact).abs() <= bound).all()


def test_linear_layers_route_every_row_through_the_kernels(tiny_dirs):
    """Any number of rows reads the weight through our kernels (gemm_rows up to KERNEL_ROWS,
    gemm_tiles beyond: a prompt's rows), each row the same bits as gemv gives it alone, so a row's
    numbers do not depend on the rows beside it; no oneDNN copy is kept beside the weights."""
    from inference.model.layers import KERNEL_ROWS
    from inference.model.transformer import Linear
    from inference.serving.engine import Engine
    model = Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32").model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert all(m.rows_weight is None for m in linears)
    gen = torch.Generator().manual_seed(5)
    with torch.inference_mode():
        for m in linears[:3] + linears[-1:]:
            for rows in (1, 2, KERNEL_ROWS, KERNEL_ROWS + 1, 40, 129):
                x = torch.randn(1, rows, m.in_features, generator=gen)
                y = m(x)[0]  # (rows, out)
                assert all(torch.equal(y[r], kernels.gemv(m.weight, x[0, r])) for r in range(rows)), rows
                assert torch.allclose(y, x[0] @ m.weight.t(), rtol=1e-5, atol=1e-5)


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


def test_attention_through_blocks_equals_in_place_bit_for_bit_and_sees_its_window():
    """Two runs' queries over their blocks of a pool: each the same bits as its keys read in
    place alone; a window start hides the keys before it, as SDPA with a mask does."""
    gen = torch.Generator().manual_seed(6)
    bs, kv_heads, heads, d = 4, 2, 6, 16
    k_pool, v_pool = torch.randn(40, kv_heads, d, generator=gen), torch.randn(40, kv_heads, d, generator=gen)
    q = torch.randn(2, heads, d, generator=gen)
    blocks = torch.tensor([[7, 2, 5], [1, 9, 9]])  # run 1's last block is padding
    lengths, first = torch.tensor([11, 6]), torch.tensor([0, 2])
    got = kernels.attend(q, k_pool, v_pool, 0.25, first, lengths, blocks, bs)
    for b in range(2):
        slots = torch.cat([torch.arange(blk * bs, blk * bs + bs) for blk in blocks[b].tolist()])[:lengths[b]]
        alone = kernels.attend(q[b:b + 1], k_pool[slots], v_pool[slots], 0.25, first[b:b + 1], lengths[b:b + 1])
        assert torch.equal(got[b], alone[0])
        visible = torch.zeros(1, 1, int(lengths[b]), dtype=torch.bool)
        visible[..., int(first[b]):] = True
        sdpa = F.scaled_dot_product_attention(q[b][:, None], k_pool[slots].transpose(0, 1), v_pool[slots].transpose(0, 1),
                                              attn_mask=visible, scale=0.25, enable_gqa=True)[:, 0]
        assert (got[b] - sdpa).abs().max() < 1e-5


@pytest.mark.parametrize("heads, kv_heads, d", [(9, 3, 64), (4, 1, 256), (8, 2, 72), (12, 4, 40), (6, 6, 16)])
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_a_prompts_rows_attend_with_the_bits_each_has_alone(heads, kv_heads, d, softcap):
    """A prompt's rows (enough to share a kv head's query heads, their keys loaded once for 2 or 3
    heads) give each row the bits it has alone (a decode row's heads one by one), and match SDPA."""
    gen = torch.Generator().manual_seed(heads * d)
    n, L = 40, 100
    q = torch.randn(n, heads, d, generator=gen)
    k, v = torch.randn(L, kv_heads, d, generator=gen), torch.randn(L, kv_heads, d, generator=gen)
    lengths, slots = torch.arange(L - n + 1, L + 1), torch.arange(L)
    many = kernels.attend(q, k, v, 0.125, torch.zeros_like(lengths), lengths, slots, 1, max_length=L, softcap=softcap)
    for r in range(n):
        alone = kernels.attend(q[r:r + 1], k, v, 0.125, torch.zeros(1, dtype=torch.int64), lengths[r:r + 1], slots, 1,
                               softcap=softcap)
        assert torch.equal(many[r], alone[0]), r
    if softcap is None:
        mask = torch.ones(n, L, dtype=torch.bool).tril(L - n)
        sdpa = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                              attn_mask=mask, scale=0.125, enable_gqa=heads != kv_heads)[0].transpose(0, 1)
        assert (many - sdpa).abs().max() < 1e-5


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


@pytest.mark.parametrize("r", [16, 12])  # every dim turned; the first 12 (partial rotary, the rest as they are)
def test_rope_store_equals_torch_rotation_and_writes_only_its_slots(r):
    from inference.model.rope import apply_rope
    gen = torch.Generator().manual_seed(7)
    n, heads, kv_heads, d = 3, 6, 2, 16
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=gen)
    cos, ssin = torch.randn(n, r, generator=gen), torch.randn(n, r, generator=gen)
    k_pool, v_pool = torch.randn(20, kv_heads, d, generator=gen), torch.randn(20, kv_heads, d, generator=gen)
    k_before, v_before = k_pool.clone(), v_pool.clone()
    slots = torch.tensor([17, 2, 9])
    q = kernels.rope_store(qkv, cos, ssin, k_pool, v_pool, slots, heads)
    parts = qkv.view(n, heads + 2 * kv_heads, d)
    rotated = apply_rope(parts[:, :heads + kv_heads], cos[:, None], ssin[:, None])  # (n, heads + kv_heads, d)
    assert torch.allclose(q, rotated[:, :heads], rtol=1e-6, atol=1e-6)
    assert torch.allclose(k_pool[slots], rotated[:, heads:], rtol=1e-6, atol=1e-6)
    assert torch.equal(v_pool[slots], parts[:, heads + kv_heads:])
    assert torch.equal(q[..., r:], parts[:, :heads, r:])  # the dims past r pass through
    others = torch.ones(20, dtype=torch.bool)
    others[slots] = False
    assert torch.equal(k_pool[others], k_before[others]) and torch.equal(v_pool[others], v_before[others])


@pytest.mark.parametrize("gelu", [False, True])
def test_glu_equals_torch(gelu):
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(2, 1, 2 * 77, generator=gen) * 4
    gate, up = x.split(77, dim=-1)
    act = F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)
    assert torch.allclose(kernels.glu(x, gelu), act * up, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("gelu", [False, True])
def test_glu_gives_an_element_the_same_bits_wherever_its_sixteen_begin(gelu):
    """The decode step's threads cut a row's gate into other spans than a prompt's rows: each
    element the same bits at every offset, also in a span's padded last sixteen."""
    gen = torch.Generator().manual_seed(9)
    gate, up = (torch.randn(3, 77, generator=gen) * 4 for _ in range(2))
    whole = kernels.glu(torch.cat([gate, up], dim=-1), gelu)
    for cut in (1, 5, 16, 30):
        part = kernels.glu(torch.cat([gate[:, cut:], up[:, cut:]], dim=-1), gelu)
        assert torch.equal(part, whole[:, cut:]), cut


def test_a_forked_child_multiplies_right():
    """A child forked after the kernels ran (threads and all) still gets its products right, and
    returns (a deadline, not a hang, if it ever did not)."""
    import os
    import signal

    from engine_hold import wait_until
    w, x = torch.randn(3000, 64), torch.randn(64)
    expected = kernels.gemv(w, x)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if its products are right
        ok = all(torch.equal(kernels.gemv(w, x), expected) for _ in range(20))
        os._exit(0 if ok else 1)
    waited = {}

    def child_done() -> bool:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            waited["status"] = status
        return bool(done)
    try:
        wait_until(child_done, "the forked child's products")
    except AssertionError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    status = waited["status"]
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@pytest.mark.parametrize("k", [1, 10, 37, 300])
def test_top_k_equals_a_stable_sort_ties_by_index(k):
    """The k largest of each row, largest first, equal values by index (argmax's choice first):
    against torch's stable sort, on rows full of ties and -inf (a masked logit) and a row of one value."""
    gen = torch.Generator().manual_seed(9)
    x = (torch.randn(4, 300, generator=gen) * 2).round()  # (4, 300): ~10 distinct values, ties everywhere
    x[1, ::3] = float("-inf")
    x[2] = 0.5
    x[3, 299] = 40.0  # the largest last
    vals, ids = kernels.top_k(x, k)
    order = torch.sort(-x, dim=-1, stable=True).indices[:, :k]  # (4, k)
    assert torch.equal(ids, order) and torch.equal(vals, x.gather(1, order))
    assert torch.equal(ids[:, 0], x.argmax(dim=-1))
    assert torch.equal(vals, x.topk(k, dim=-1).values)


def test_top_k_leaves_nans_and_other_layouts_to_torch():
    x = torch.randn(2, 100)
    assert kernels.top_k(x[:, ::2], 3) is None and kernels.top_k(x.double(), 3) is None
    assert kernels.top_k(x, 0) is None and kernels.top_k(x, 101) is None
    x[1, 70] = float("nan")  # torch.topk ranks a NaN first: the caller uses torch there
    assert kernels.top_k(x, 3) is None


@pytest.mark.parametrize("V", [49152, 301, 7])
def test_row_sums_equal_float64_sums(V):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, V, generator=gen) * 4  # (3, V)
    e = (x - x.max(dim=-1, keepdim=True).values).exp()  # (3, V)
    chosen = torch.tensor([0, V // 2, V - 1])
    z, m, above = kernels.row_sums(x, e, chosen)
    e64, x64 = e.double(), x.double()
    assert torch.allclose(z, e64.sum(-1), rtol=1e-13, atol=0)
    # The products in float32 (as torch's e * x), summed in float64.
    assert torch.allclose(m, (e * x).double().sum(-1), rtol=1e-11, atol=1e-12)
    assert torch.allclose(m, (e64 * x64).sum(-1), rtol=1e-6, atol=1e-9)
    assert above.tolist() == [int((x[r] > x[r, c]).sum()) for r, c in enumerate(chosen.tolist())]


def _drawn_by_sample(p: torch.Tensor, u: torch.Tensor) -> int:
    """sampling.stages.sample()'s token for probabilities p (V,) and its uniform number u."""
    return int(sample(p.unsqueeze(0), torch.Generator(), u)[0, 0])


@pytest.mark.parametrize("V", [49152, 1000, 517, 33])
def test_draw_rows_draws_what_sample_draws_and_sums_the_rest(V):
    """The draw of every row, against sample()'s cumsum and searchsorted for the same u: rows of
    very different shapes (a peak, a flat row, a long tail of tiny probabilities, most of the
    vocabulary at 0, nothing at all, a NaN) and u at 0, near 1 and in between; then each row's
    probability outside its candidates and its token, against index_fill and a float64 sum."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(8, V, generator=gen) * 3  # (8, V)
    x[1] = 0.0  # flat
    x[2, 1:] = -30.0  # one token near 1, a tail of ~1e-13
    x[3, V // 3:] = float("-inf")  # two thirds removed
    p = x.softmax(dim=-1)  # (8, V)
    p[4] = 0.0  # nothing to draw: V
    p[5, V // 2] = float("nan")  # not a distribution: V
    p[6] = 0.0
    p[6, V - 1] = 1.0  # only the last
    skip = p.nan_to_num(-1.0).topk(10 if V > 10 else 3, dim=-1).indices  # (8, k): the candidates
    forced = torch.full((8,), -1, dtype=torch.int64)
    forced[7] = 2  # a row whose token is given: its rest leaves that one out, not the drawn one
    for u_value in (0.0, 1e-9, 0.3, 0.999999, 1.0 - 2.0 ** -53, None):
        u = torch.rand(8, generator=gen, dtype=torch.float64) if u_value is None else torch.full((8,), u_value,
                                                                                              dtype=torch.float64)
        token, rest = kernels.draw_rows(list(p), u, skip, forced)
        assert token.tolist() == [_drawn_by_sample(p[r], u[r:r + 1]) for r in range(8)]
        assert token[4] == V and token[5] == V and token[6] == V - 1
        for r in range(8):
            chosen = int(forced[r]) if forced[r] >= 0 else min(int(token[r]), V - 1)
            others = p[r].index_fill(0, torch.cat([skip[r], torch.tensor([chosen])]), 0.0)
            expected = others.double().sum()
            assert torch.isnan(expected) == torch.isnan(rest[r])
            if not torch.isnan(expected):
                assert abs(float(rest[r]) - float(expected)) <= 1e-12 * max(1.0, float(expected))
        assert rest[6] == 0.0 and rest[4] == 0.0  # nothing outside: exactly 0


def test_draw_rows_gives_a_row_the_same_token_and_rest_alone_or_with_others():
    gen = torch.Generator().manual_seed(6)
    p = (torch.randn(5, 2048, generator=gen) * 2).softmax(dim=-1)  # (5, 2048)
    u = torch.rand(5, generator=gen, dtype=torch.float64)
    skip = p.topk(10, dim=-1).indices
    forced = torch.full((5,), -1, dtype=torch.int64)
    together = kernels.draw_rows(list(p), u, skip, forced)
    for r in range(5):
        alone = kernels.draw_rows([p[r]], u[r:r + 1], skip[r:r + 1], forced[r:r + 1])
        assert torch.equal(alone[0], together[0][r:r + 1]) and torch.equal(alone[1], together[1][r:r + 1])


def test_draw_rows_leaves_other_layouts_to_torch():
    p = torch.rand(2, 64).softmax(-1)
    u, skip, forced = torch.rand(2, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.int64), torch.full((2,), -1)
    assert kernels.draw_rows([p[0], p[1].double()], u, skip, forced) is None
    assert kernels.draw_rows([p[0], p[1, :32]], u, skip, forced) is None  # rows of two widths
    assert kernels.draw_rows([p[0], p[1]], u.float(), skip, forced) is None
    assert kernels.draw_rows([], u[:0], skip[:0], forced[:0]) is None
