"""The LLaMA-architecture transformer: embedding -> N x (attention, SwiGLU) -> norm -> LM head."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from inference.model.config import ModelConfig
from inference.device import available_memory_bytes
from inference.model.kv_cache import BLOCK_SIZE, KVCache
from inference.model.rope import apply_rope, rope_tables


@dataclass
class Probe:
    """What to capture during one forward pass, and where the captures land.

    Capture costs an extra softmax(QK^T) per chosen layer and a norm + LM head per layer for the
    lens, so plain generation passes no probe and pays nothing.
    """
    attention_layers: tuple[int, ...] = ()
    logit_lens: bool = False
    # Layers whose full causal pattern (every query position, not only the last) is captured:
    # heads x T x T floats per layer, so only on request.
    pattern_layers: tuple[int, ...] = ()
    attention: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (heads, T_ctx)
    patterns: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (heads, T, T_ctx)
    residuals: list[torch.Tensor] = field(default_factory=list)  # per layer, (hidden,)


@dataclass
class PagedBatch:
    """One scheduler step's rows over the paged KV pool (kv_pool.py): N rows of tokens from
    several runs, each at its own position. Runs decoding one token are attended together;
    each run's prompt chunk on its own, after its cached positions."""
    positions: torch.Tensor  # (N,) position of each row
    write_slots: torch.Tensor  # (N,) pool slot where each row's keys and values go
    decode_rows: torch.Tensor | None  # (B,) rows that are one run's single new token
    # The decoding runs' contexts: (B, nb) each run's blocks in position order, padded; or, for
    # one run whose blocks are consecutive in the pool, a slice of its slots (read in place).
    decode_blocks: torch.Tensor | slice | None
    decode_mask: torch.Tensor | None  # (B, 1, 1, nb * BLOCK_SIZE) True where a position is the run's; None: all are
    prefills: list[tuple[int, int, torch.Tensor, int]]  # (first row, rows, context slots, start position)
    logit_rows: torch.Tensor  # (R,) rows whose next-token logits are wanted


# ---------------------------------------------------------------- linear layers, per phase
DECODE_ROWS = 16  # inputs of at most this many rows are bound by the bytes of weight read
ROWS_HINT = 8  # the row count oneDNN's blocked layout is chosen for (any count runs on it)
# oneDNN, and ideep above it, keep the kernel compiled for each shape of product run (rows,
# in, out), about 0.7 MiB each on a 2-core AVX-512 Xeon, up to 1,024 of each by default: every
# new row count of a step that mixes runs and prompt chunks added ~3.5 MiB for SmolLM2's 5
# shapes, to several hundred MiB. At most this many are kept (~45 MiB), the least recently used
# dropped; a step whose shape was dropped compiles it again (a few ms a shape).
ONEDNN_CACHED_SHAPES = 64


class Linear(nn.Linear):
    """A bias-free linear layer that may keep a second copy of its weight: a low-precision one
    for few rows, or one laid out for several rows.

    A few rows times every weight matrix (decode steps, the LM head) are bound by the bytes of
    weight read; many rows (a prefill) by arithmetic, which is fastest in float32 on CPUs
    without bf16 units. With `decode_weight` set, inputs of at most DECODE_ROWS rows use it.
    With `rows_weight` set (oneDNN's layout, Transformer.keep_rows_copies), inputs of two rows
    or more use it; one row always reads `weight`.
    """

    decode_weight: torch.Tensor | None = None
    rows_weight: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows <= DECODE_ROWS:
            w = self.decode_weight
            if w is not None:
                return F.linear(x.to(w.dtype), w).to(x.dtype)
            if rows == 1:  # one token: a matrix-vector product, whose kernel reads the weight fastest
                return torch.mv(self.weight, x.reshape(-1)).view(*x.shape[:-1], -1)  # (..., out_features)
        if self.rows_weight is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.rows_weight, None, "none", [], "")
        return F.linear(x, self.weight)


# ---------------------------------------------------------------- RMSNorm
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        # Normalize in float32 whatever the weight dtype, then scale in the model dtype.
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


# ---------------------------------------------------------------- grouped-query attention
class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_dim, self.kv_dim = cfg.q_dim, cfg.kv_dim
        # Q, K and V projections fused into one matmul: rows are [q; k; v].
        self.wqkv = Linear(cfg.hidden_size, cfg.q_dim + 2 * cfg.kv_dim, bias=False)
        self.wo = Linear(cfg.q_dim, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, k_cache, v_cache, start_pos: int,
                probe: Probe | None, layer: int) -> torch.Tensor:
        bsz, T, _ = x.shape
        n_qk = self.n_heads + self.n_kv_heads
        qkv = self.wqkv(x).view(bsz, T, n_qk + self.n_kv_heads, self.head_dim)  # (bsz, T, heads + 2 kv_heads, head_dim)
        qk = apply_rope(qkv[:, :, :n_qk], cos, sin)  # Q and K rotated together: half the ops
        q = qk[:, :, :self.n_heads].transpose(1, 2)  # (bsz, n_heads, T, head_dim)
        k = qk[:, :, self.n_heads:].transpose(1, 2)  # (bsz, n_kv_heads, T, head_dim)
        v = qkv[:, :, n_qk:].transpose(1, 2)  # (bsz, n_kv_heads, T, head_dim)

        mask, causal = None, False
        end = start_pos + T
        k_cache[:, :, start_pos:end] = k
        v_cache[:, :, start_pos:end] = v
        keys, values = k_cache[:, :, :end], v_cache[:, :, :end]  # (bsz, n_kv_heads, end, head_dim)
        if T > 1 and start_pos == 0:
            causal = True
        elif T > 1:  # a chunk after cached positions: query i sees keys 0 .. start_pos + i
            mask = torch.ones(T, end, dtype=torch.bool, device=x.device).tril(diagonal=start_pos)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal,
                                             enable_gqa=self.n_heads != self.n_kv_heads)
        if probe is not None and layer in probe.attention_layers:
            probe.attention[layer] = attention_weights(q[:, :, -1:], keys)[0, :, 0]  # (n_heads, end)
        if probe is not None and layer in probe.pattern_layers and not isinstance(start_pos, torch.Tensor):
            # Query i (position start_pos + i) sees keys 0 .. start_pos + i.
            visible = torch.ones(T, keys.shape[2], dtype=torch.bool, device=x.device).tril(diagonal=start_pos)
            probe.patterns[layer] = attention_weights(q, keys, visible)[0]  # (n_heads, T, end)
        out = out.transpose(1, 2).reshape(bsz, T, self.q_dim)  # (bsz, T, n_heads * head_dim)
        return self.wo(out)

    def forward_paged(self, x: torch.Tensor, cos, sin, k_pool: torch.Tensor, v_pool: torch.Tensor,
                      batch: PagedBatch) -> torch.Tensor:
        """x (1, N, hidden): rows of several runs (see PagedBatch); k_pool, v_pool: this
        layer's (slots, n_kv_heads, head_dim)."""
        _, N, _ = x.shape
        n_qk = self.n_heads + self.n_kv_heads
        qkv = self.wqkv(x).view(1, N, n_qk + self.n_kv_heads, self.head_dim)  # (1, N, heads + 2 kv_heads, head_dim)
        qk = apply_rope(qkv[:, :, :n_qk], cos, sin)[0]  # (N, heads + kv_heads, head_dim)
        q, k, v = qk[:, :self.n_heads], qk[:, self.n_heads:], qkv[0, :, n_qk:]  # (N, heads | kv_heads, head_dim)
        k_pool.index_copy_(0, batch.write_slots, k)
        v_pool.index_copy_(0, batch.write_slots, v)
        gqa = self.n_heads != self.n_kv_heads
        if not batch.prefills:  # every row is a decoding run's new token, in order
            out = self._decode(q, k_pool, v_pool, batch)
            return self.wo(out.view(1, N, self.q_dim))
        out = torch.empty_like(q)  # (N, n_heads, head_dim)
        if batch.decode_rows is not None:
            out[batch.decode_rows] = self._decode(q[batch.decode_rows], k_pool, v_pool, batch)
        for row, n, slots, start in batch.prefills:
            qp = q[row:row + n].transpose(0, 1).unsqueeze(0)  # (1, n_heads, n, head_dim)
            kp = k_pool.index_select(0, slots).transpose(0, 1).unsqueeze(0)  # (1, n_kv_heads, start + n, head_dim)
            vp = v_pool.index_select(0, slots).transpose(0, 1).unsqueeze(0)
            # Query i sits at position start + i and sees keys 0 .. start + i.
            mask = None if start == 0 else torch.ones(n, start + n, dtype=torch.bool, device=x.device).tril(start)
            op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, is_causal=start == 0, enable_gqa=gqa)
            out[row:row + n] = op[0].transpose(0, 1)  # (n, n_heads, head_dim)
        return self.wo(out.reshape(1, N, self.q_dim))

    def _decode(self, q: torch.Tensor, k_pool, v_pool, batch: PagedBatch) -> torch.Tensor:
        """Attention of B decode rows q (B, n_heads, head_dim), each over its own run's context
        (batch.decode_blocks): gathered a block at a time, or one run's slots read in place."""
        B, ctx = q.shape[0], batch.decode_blocks
        if isinstance(ctx, slice):
            kd, vd = k_pool[ctx].unsqueeze(0), v_pool[ctx].unsqueeze(0)  # (1, L, n_kv_heads, head_dim)
        else:
            # (n_blocks, BLOCK_SIZE, n_kv_heads, head_dim) -> (B, nb * BLOCK_SIZE, n_kv_heads, head_dim);
            # index_select copies whole blocks ~10x faster than indexing with a 2-D tensor.
            blocks = ctx.view(-1)  # (B * nb,)
            kd = k_pool.view(-1, BLOCK_SIZE, self.n_kv_heads, self.head_dim).index_select(0, blocks).view(B, -1, self.n_kv_heads, self.head_dim)
            vd = v_pool.view(-1, BLOCK_SIZE, self.n_kv_heads, self.head_dim).index_select(0, blocks).view(B, -1, self.n_kv_heads, self.head_dim)
        od = F.scaled_dot_product_attention(q.unsqueeze(2), kd.transpose(1, 2), vd.transpose(1, 2),
                                            attn_mask=batch.decode_mask, enable_gqa=self.n_heads != self.n_kv_heads)
        return od.squeeze(2)  # (B, n_heads, head_dim)


def attention_weights(q: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) in float32, for queries that see every key given or, with
    `visible` (Tq, T_ctx) bool, only the keys marked True.

    q: (bsz, n_heads, Tq, head_dim); keys: (bsz, n_kv_heads, T_ctx, head_dim).
    """
    n_rep = q.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(n_rep, dim=1)  # (bsz, n_heads, T_ctx, head_dim)
    scores = q.float() @ keys.float().transpose(-1, -2) / q.shape[-1] ** 0.5  # (bsz, n_heads, Tq, T_ctx)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    return scores.softmax(dim=-1)


# ---------------------------------------------------------------- SwiGLU feed-forward
class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ffn_dim = cfg.intermediate_size
        # Gate and up projections fused: rows are [gate; up].
        self.w13 = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.w2 = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split(self.ffn_dim, dim=-1)  # each (bsz, T, ffn_dim)
        return self.w2(F.silu(gate).mul_(up))


# ---------------------------------------------------------------- transformer block
class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x, cos, sin, k_cache, v_cache, start_pos, probe, layer):
        x = x + self.attention(self.attention_norm(x), cos, sin, k_cache, v_cache, start_pos,
                               probe, layer)
        return x + self.feed_forward(self.ffn_norm(x))

    def forward_paged(self, x, cos, sin, k_pool, v_pool, batch: PagedBatch):
        h = x + self.attention.forward_paged(self.attention_norm(x), cos, sin, k_pool, v_pool, batch)
        return h.add_(self.feed_forward(self.ffn_norm(h)))  # h is this block's own: added in place


# ---------------------------------------------------------------- the whole model
class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @classmethod
    def from_state_dict(cls, cfg: ModelConfig, state: dict[str, torch.Tensor],
                        device: torch.device, dtype: torch.dtype,
                        decode_dtype: torch.dtype | None = None) -> "Transformer":
        """Build the model around already-loaded weights (our names; see checkpoint.py)."""
        with torch.device("meta"):  # no random init: every parameter comes from `state`
            model = cls(cfg)
        if cfg.tie_word_embeddings:
            state = {**state, "output.weight": state["tok_embeddings.weight"]}
        model.load_state_dict(state, strict=True, assign=True)
        del state  # the model holds the weights now: a re-laid-out one frees its first copy
        model.requires_grad_(False)
        model.to(device=device, dtype=dtype)
        if cfg.tie_word_embeddings:
            model.output.weight = model.tok_embeddings.weight
        if model.device.type == "cpu":
            model.store_weights_transposed()
            model.keep_rows_copies(available_memory_bytes())
        cos, sin = rope_tables(cfg, cfg.max_seq_len, device, dtype)
        model.register_buffer("rope_cos", cos, persistent=False)
        model.register_buffer("rope_sin", sin, persistent=False)
        model.set_decode_dtype(decode_dtype)
        return model.eval()

    def store_weights_transposed(self) -> None:
        """Keep each linear weight (out, in) with its memory laid out as (in, out): the same
        values and shape, a column-major copy. x @ W^T then reads W^T contiguously, and MKL's
        products for a decode step's few rows run about 12% faster (30 layers and the LM head
        of SmolLM2, 1 and 8 rows, interleaved runs on a 2-core Xeon). A tied embedding table
        shares the LM head's copy; looking rows up in it costs 2 ms for 512 tokens. Each weight
        is copied once and its first copy freed (if nothing else holds it): SmolLM2's engine
        holds 894 MiB resident after loading, against 918 MiB with the weights as read (1,414
        MiB with the copies for several rows, keep_rows_copies)."""
        for module in self.modules():
            if isinstance(module, Linear) and module.weight.is_contiguous():
                module.weight = nn.Parameter(module.weight.t().contiguous().t(), requires_grad=False)
            elif isinstance(module, RMSNorm):
                # Copied too: any tensor read from a mapped checkpoint file keeps all of it mapped.
                module.weight = nn.Parameter(module.weight.clone(), requires_grad=False)
        if self.cfg.tie_word_embeddings:
            self.tok_embeddings.weight = self.output.weight

    def keep_rows_copies(self, available_bytes: int) -> bool:
        """Give each linear layer a second copy of its weight in oneDNN's blocked layout, for
        products of several rows: a decode step of many runs, a prefill. oneDNN's float32
        product on it is exact float32 like MKL's, and faster for few rows: SmolLM2's 30 layers
        and LM head, cold, 8 rows: 34.6 ms against 47.6 ms with MKL on the column-major
        weights; 16 rows 43.5 against 56.6; 512 rows the same (629 and 624 ms); one row is
        slower on it (33 ms against 21 ms for the matrix-vector product, which keeps the
        first copy). The copy costs the weights' bytes again, so it is kept only on a float32
        CPU model with oneDNN, when it takes at most a quarter of `available_bytes`."""
        linears = [m for m in self.modules() if isinstance(m, Linear)]
        size = sum(m.weight.numel() * m.weight.element_size() for m in linears)
        if (self.device.type != "cpu" or self.dtype != torch.float32 or size > available_bytes / 4
                or not torch.backends.mkldnn.is_available()):
            return False
        # Read once, at oneDNN's first use in the process (a user's own setting is kept).
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_CACHED_SHAPES))
        os.environ.setdefault("LRU_CACHE_CAPACITY", str(ONEDNN_CACHED_SHAPES))  # ideep's
        try:
            copies = [torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), ROWS_HINT) for m in linears]
        except (AttributeError, RuntimeError):  # a build of torch without these oneDNN operators
            return False
        for m, copy in zip(linears, copies):
            m.rows_weight = copy
        return True

    def set_decode_dtype(self, decode_dtype: torch.dtype | None) -> None:
        """Give every linear layer a decode copy in decode_dtype (None or dtype: no copy)."""
        same = decode_dtype is None or decode_dtype == self.dtype
        for module in self.modules():
            if isinstance(module, Linear):
                module.decode_weight = None if same else module.weight.to(decode_dtype)
        self.decode_dtype = self.dtype if same else decode_dtype

    @property
    def device(self) -> torch.device:
        return self.tok_embeddings.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_embeddings.weight.dtype

    def new_cache(self, capacity: int, bsz: int = 1) -> KVCache:
        return KVCache(self.cfg, min(capacity, self.cfg.max_seq_len), self.device, self.dtype, bsz)

    def forward(self, tokens: torch.Tensor, cache: KVCache, start_pos: int, *,
                all_logits: bool = False, probe: Probe | None = None) -> torch.Tensor:
        """Run tokens (bsz, T) at positions start_pos.. against the cache; return float32 logits.

        Logits are (bsz, vocab) for the last position, or (bsz, T, vocab) with all_logits.
        """
        T = tokens.shape[1]
        if start_pos + T > cache.capacity:
            raise ValueError(f"positions {start_pos}..{start_pos + T} exceed the cache ({cache.capacity})")
        h = self.tok_embeddings(tokens)  # (bsz, T, hidden)
        cos = self.rope_cos[start_pos:start_pos + T, None]  # (T, 1, head_dim): broadcasts over heads
        sin = self.rope_sin[start_pos:start_pos + T, None]
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, cache.k[i], cache.v[i], start_pos, probe, i)
            if probe is not None and probe.logit_lens:
                probe.residuals.append(h[0, -1])
        cache.length = start_pos + T
        if not all_logits:
            h = h[:, -1]  # (bsz, hidden): only the next token's logits are needed
        return self.output(self.norm(h)).float()

    def forward_paged(self, tokens: torch.Tensor, batch: PagedBatch, k_pool: torch.Tensor,
                      v_pool: torch.Tensor) -> torch.Tensor:
        """One scheduler step: tokens (N,) of several runs against the paged pool (k_pool,
        v_pool: KVPool.k, .v). Returns float32 logits (R, vocab) for batch.logit_rows."""
        h = self.tok_embeddings(tokens).unsqueeze(0)  # (1, N, hidden)
        cos = self.rope_cos[batch.positions].unsqueeze(1)  # (N, 1, head_dim): broadcasts over heads
        sin = self.rope_sin[batch.positions].unsqueeze(1)
        for i, layer in enumerate(self.layers):
            h = layer.forward_paged(h, cos, sin, k_pool[i], v_pool[i], batch)
        h = h[0, batch.logit_rows]  # (R, hidden)
        return self.output(self.norm(h)).float()

    def lens_logits(self, residual: torch.Tensor) -> torch.Tensor:
        """The logit lens: one residual stream (hidden,) through the final norm and LM head."""
        return self.output(self.norm(residual.unsqueeze(0))).float()[0]  # as a (1, hidden) row
