"""Inside one token: shapes and FLOPs by hand, captured attention and the logit lens."""

import pytest
import torch

from inference.model.anatomy import capture_step, memory_table, stages
from inference.model.config import ModelConfig
from inference.serving.engine import Request
from inference.sampling.params import SamplingParams
import ui.inside.render as inside_render

LLAMA_7B = ModelConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, n_layers=32,
                       n_heads=32, n_kv_heads=32, max_seq_len=4096)


def by_name(rows):
    return {r.name: r for r in rows}


def test_llama_7b_published_shapes_and_costs():
    p = LLAMA_7B.param_counts()
    assert p["total"] == 6_738_415_616  # LLaMA-7B's published 6.7 B
    rows = by_name(stages(LLAMA_7B, 1, 100, 2))
    per_layer_matmul = 4 * 4096 * 4096 + 3 * 4096 * 11008
    assert rows["all 32 layers"].flops == 32 * (2 * per_layer_matmul + 2 * 2 * 32 * 100 * 128 + 8 * 4096)
    assert rows["final RMSNorm + LM head (last position)"].flops == 2 * 4096 * 32000 + 4 * 4096
    total = rows["total for this pass"].flops
    # About 2 x (parameters without the embedding lookup) plus attention.
    assert total == pytest.approx(2 * (p["total"] - 32000 * 4096) + 4 * 32 * 100 * 4096, rel=1e-3)
    assert rows["Q, K, V projections + RoPE (per layer)"].shape == "Q [1, 32, 128], K and V [1, 32, 128]"
    assert rows["attention softmax(QKᵀ/√d)·V, causal (per layer)"].shape == "scores [32, 1, 100]"
    # A decode step reads every weight once (bf16) plus the KV cache.
    assert rows["total for this pass"].bytes == pytest.approx(
        2 * (p["total"] - 32000 * 4096 + 4096) + 2 * 32 * 100 * 2 * 4096 + 2 * 4096, rel=1e-3)


def test_tiny_config_by_hand():
    cfg = ModelConfig(vocab_size=10, hidden_size=8, intermediate_size=12, n_layers=2, n_heads=4,
                      n_kv_heads=2, max_seq_len=16)
    rows = by_name(stages(cfg, 3, 3, 4))
    assert rows["Q, K, V projections + RoPE (per layer)"].flops == 2 * 3 * 8 * (8 + 4 + 4)
    assert rows["attention softmax(QKᵀ/√d)·V, causal (per layer)"].flops == 4 * 4 * 3 * 3 * 2
    assert rows["SwiGLU feed-forward (per layer)"].flops == 2 * 3 * 3 * 8 * 12
    assert rows["SwiGLU feed-forward (per layer)"].shape == "gate, up [3, 12] → [3, 8]"
    assert rows["embedding lookup"].shape == "[3, 8]"
    mem = {name: (n, b) for name, n, b in memory_table(cfg, 4)}
    assert mem["embedding"] == (80, 320) and mem["LM head"] == (80, 320)
    assert mem["total"][0] == 80 + 2 * (8 * 16 + 8 * 8) + 2 * 3 * 8 * 12 + 2 * 2 * 8 + 8 + 80


def reference_attention(model, ids, layer):
    """softmax(QK^T / sqrt(d)) for the last query, built from the weights by hand (no cache)."""
    cfg = model.cfg
    h = model.tok_embeddings.weight[torch.tensor(ids)]
    from inference.model.rope import rope_inv_freq
    freqs = torch.outer(torch.arange(len(ids), dtype=torch.float32), rope_inv_freq(cfg))
    cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()

    def rope(x):  # (T, heads, hd)
        half = x.shape[-1] // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), -1)
        return x * cos[:, None] + rot * sin[:, None]

    for i, blk in enumerate(model.layers):
        x = blk.attention_norm(h)
        qkv = x @ blk.attention.wqkv.weight.T
        q, k, v = qkv.split([cfg.q_dim, cfg.kv_dim, cfg.kv_dim], -1)
        q = rope(q.view(len(ids), cfg.n_heads, cfg.head_dim))
        k = rope(k.view(len(ids), cfg.n_kv_heads, cfg.head_dim)).repeat_interleave(cfg.n_rep, 1)
        v = v.view(len(ids), cfg.n_kv_heads, cfg.head_dim).repeat_interleave(cfg.n_rep, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / cfg.head_dim ** 0.5
        scores = scores.masked_fill(torch.ones(len(ids), len(ids), dtype=torch.bool).triu(1), float("-inf"))
        w = scores.softmax(-1)
        if i == layer:
            return w[:, -1]  # (heads, T)
        out = torch.einsum("hqk,khd->qhd", w, v).reshape(len(ids), cfg.q_dim)
        h = h + out @ blk.attention.wo.weight.T
        h = h + blk.feed_forward(blk.ffn_norm(h))


def test_captured_attention_matches_a_hand_built_softmax(tiny_engine):
    ids = tiny_engine.tokenizer.encode("The quick brown fox jumps")
    for layer in range(tiny_engine.cfg.n_layers):
        cap = capture_step(tiny_engine.model, ids, layer)
        assert cap.attention.shape == (tiny_engine.cfg.n_heads, len(ids))
        assert torch.allclose(cap.attention.sum(-1), torch.ones(tiny_engine.cfg.n_heads), atol=1e-5)
        with torch.inference_mode():
            ref = reference_attention(tiny_engine.model, ids, layer)
        assert torch.allclose(cap.attention, ref, atol=1e-5)


def test_logit_lens_last_layer_is_the_model_output(tiny_engine):
    ids = tiny_engine.tokenizer.encode("Once upon a time")
    cap = capture_step(tiny_engine.model, ids, 0)
    assert len(cap.lens) == tiny_engine.cfg.n_layers
    top_id, top_p = cap.lens[-1][0]
    assert top_id == int(cap.probs.argmax()) and top_p == pytest.approx(cap.probs.max().item(), abs=1e-6)
    ids2 = [i for i, _ in cap.lens[-1]]
    assert ids2 == cap.probs.topk(5).indices.tolist()


def test_capture_does_not_change_the_sampled_tokens(tiny_engine):
    req = Request("The quick", SamplingParams(temperature=1.0, max_new_tokens=20, seed=9))
    before = [e.token_id for e in list(tiny_engine.generate(req))[:-1]]
    capture_step(tiny_engine.model, tiny_engine.tokenizer.encode("The quick") + before[:5], 1)
    after = [e.token_id for e in list(tiny_engine.generate(req))[:-1]]
    assert before == after
    # And a probed forward gives bit-identical logits to a plain one.
    from inference.model.transformer import Probe
    ids = torch.tensor([tiny_engine.tokenizer.encode("The quick")])
    with torch.inference_mode():
        plain = tiny_engine.model(ids, tiny_engine.model.new_cache(ids.shape[1]), 0)
        probed = tiny_engine.model(ids, tiny_engine.model.new_cache(ids.shape[1]), 0,
                                   probe=Probe(attention_layers=(0, 1), logit_lens=True))
    assert torch.equal(plain, probed)


def test_inspect_handler_renders_all_parts(tiny_engine):
    from types import SimpleNamespace
    from ui.controls import Controls
    from ui.handlers import Handlers
    h = Handlers(tiny_engine)
    rec = list(h.run.generate(*Controls(prompt="The quick", max_new_tokens=6, seed="1").values(),
                          SimpleNamespace(session_hash="i")))[-1]["record"]
    inside = h.inside.inspect_step(rec, 3, 1)
    stages_md, att, lens, pattern = (inside[n] for n in ("stages_md", "attention", "lens", "pattern"))
    n = len(rec.prompt_ids)
    assert f"scores [4, 1, {n + 3}]" in stages_md and f"scores [4, {n}, {n}]" in stages_md
    assert att.count("<tr>") == n + 3 + 1 and "Layer 1" in att
    assert lens.count("after layer") == tiny_engine.cfg.n_layers
    # The full pattern: a row per position of the context, each with the positions it may see.
    assert pattern.count("<th class='tl-q'") == n + 3 and pattern.count("<td data-q=") == (n + 3) * (n + 4) // 2
    assert "shares the embedding matrix" in inside_render.memory_markdown(tiny_engine)


def test_the_families_path_names_its_turns(tmp_path, sp_model_bytes):
    """Inside one token names the family's turns, read from the config."""
    from inference.model.anatomy import family_path
    from tiny_families import make_family_model
    gemma = ModelConfig.from_json(make_family_model(tmp_path, "gemma3_text", sp_model_bytes)[0] / "config.json")
    path = " → ".join(family_path(gemma))
    assert "× 8 (√hidden)" in path and "RMSNorm (1 + w)" in path and "four a layer" in path
    assert "each head's q and k" in path and "sliding layers θ 10000" in path and "scores scaled by 24^-0.5" in path
    assert "layers 0, 2 see only the last 8 positions" in path and "layers 1 see all" in path
    assert "GeGLU" in path and "5 · tanh(logits / 5)" in path and "tied" in path
    qwen2 = ModelConfig.from_json(make_family_model(tmp_path / "q", "qwen2", sp_model_bytes)[0] / "config.json")
    path = " → ".join(family_path(qwen2))
    assert "with biases" in path and "every layer sees every earlier position" in path and "SwiGLU" in path
    assert "4 query heads share 2 KV heads" in path and "(1 + w)" not in path
