"""Grouped-query attention over a static cache or the paged pool, with the turns of each family:
q/k/v biases (Qwen2), q/k norms per head (Qwen3, Gemma 3) or over the whole vector (OLMo 2), a
scale of its own (Gemma, Granite), soft-capped scores (Gemma 2) and a sliding window (Mistral,
Phi-3, Gemma's local layers, Qwen's upper layers)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from inference.model import kernels
from inference.model.config import ModelConfig
from inference.model.kv_cache import BLOCK_SIZE
from inference.model.layers import Linear, RMSNorm
from inference.model.rope import apply_rope


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
    # Sliding layers' decode mask, (B, 1, 1, context): the run's last `window` positions. Set by
    # the model (Transformer.forward_paged) when a window bites; None: decode_mask serves.
    window_mask: torch.Tensor | None = None
    # (B,) int64: each decoding run's positions held, its new one included; and the first each
    # sees, for full layers (False) and sliding ones (True). Set by the model, once a step.
    decode_lengths: torch.Tensor | None = None
    decode_first: dict[bool, torch.Tensor] | None = None


# ---------------------------------------------------------------- which keys a query sees
def visible_keys(start: int, n: int, end: int, window: int | None,
                 device: torch.device) -> tuple[torch.Tensor | None, bool]:
    """(mask, is_causal) for queries at positions start .. start+n-1 over keys 0 .. end-1.

    Query p sees keys p - window < j <= p (transformers' sliding_window_overlay); with no window,
    or none that reaches back past key 0, SDPA's causal flag or no mask at all does the same.
    """
    if window is None or end <= window:
        if n == 1:
            return None, False
        if start == 0:
            return None, True
        return torch.ones(n, end, dtype=torch.bool, device=device).tril(start), False
    q = torch.arange(start, start + n, device=device)[:, None]  # (n, 1)
    k = torch.arange(end, device=device)[None]  # (1, end)
    return (k <= q) & (k > q - window), False  # (n, end)


def window_decode_mask(positions: torch.Tensor, context: int, window: int) -> torch.Tensor:
    """(B, 1, 1, context): for decode rows at `positions` (B,), the keys of their window; key j
    of a run's gathered context is its position j."""
    k = torch.arange(context, device=positions.device)[None]  # (1, context)
    p = positions[:, None]  # (B, 1)
    return ((k <= p) & (k > p - window)).view(len(positions), 1, 1, context)


def attention_weights(q: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor | None = None,
                      scale: float | None = None, softcap: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) in float32 (scale: 1/sqrt(d) unless given; scores soft-capped
    where `softcap` is given), for queries that see every key given or, with `visible`
    (Tq, T_ctx) bool, only the keys marked True.

    q: (bsz, n_heads, Tq, head_dim); keys: (bsz, n_kv_heads, T_ctx, head_dim).
    """
    n_rep = q.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(n_rep, dim=1)  # (bsz, n_heads, T_ctx, head_dim)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = q.float() @ keys.float().transpose(-1, -2) * scale  # (bsz, n_heads, Tq, T_ctx)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    return scores.softmax(dim=-1)


# ---------------------------------------------------------------- grouped-query attention
class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_dim, self.kv_dim = cfg.q_dim, cfg.kv_dim
        self.window = cfg.sliding_window if cfg.is_sliding(layer) else None
        # None: SDPA's own 1/sqrt(head_dim), so families without a scale of their own run as before.
        self.scale = cfg.attn_scale if "attn_scale" in cfg.features() else None
        self.softcap = cfg.attn_logit_softcap  # Gemma 2: the kernel caps scores; no SDPA (by hand there)
        self.softmax_scale = self.head_dim ** -0.5 if self.scale is None else self.scale  # the kernels'
        self.gqa = cfg.n_heads != cfg.n_kv_heads
        # Q, K and V projections fused into one matmul: rows are [q; k; v].
        self.wqkv = Linear(cfg.hidden_size, cfg.q_dim + 2 * cfg.kv_dim, bias=False)
        self.bqkv = nn.Parameter(torch.zeros(cfg.q_dim + 2 * cfg.kv_dim)) if cfg.qkv_bias else None
        self.full_norms = cfg.qk_norm_full  # OLMo 2: over q_dim and kv_dim, not per head
        self.q_norm = RMSNorm(cfg.q_dim if cfg.qk_norm_full else cfg.head_dim, cfg.rms_norm_eps) \
            if cfg.qk_norm or cfg.qk_norm_full else None
        self.k_norm = RMSNorm(cfg.kv_dim if cfg.qk_norm_full else cfg.head_dim, cfg.rms_norm_eps) \
            if cfg.qk_norm or cfg.qk_norm_full else None
        self.wo = Linear(cfg.q_dim, cfg.hidden_size, bias=False)

    def project(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (bsz, T, hidden) -> q (bsz, T, n_heads, head_dim), k and v (bsz, T, n_kv_heads,
        head_dim): projected, q and k normed per head where the family does, then rotated."""
        bsz, T, _ = x.shape
        n_qk = self.n_heads + self.n_kv_heads
        qkv = self.wqkv(x)  # (bsz, T, q_dim + 2 kv_dim)
        if self.bqkv is not None:
            qkv = qkv + self.bqkv
        if self.full_norms:
            qkv = self._norm_full(qkv)
        qkv = qkv.view(bsz, T, n_qk + self.n_kv_heads, self.head_dim)  # (bsz, T, heads + 2 kv_heads, head_dim)
        qk = qkv[:, :, :n_qk]
        if self.q_norm is not None and not self.full_norms:  # each head's vector normed on its own, before RoPE
            qk = torch.cat([self.q_norm(qk[:, :, :self.n_heads]), self.k_norm(qk[:, :, self.n_heads:])], dim=2)
        qk = apply_rope(qk, cos, sin)  # Q and K rotated together: half the ops
        return qk[:, :, :self.n_heads], qk[:, :, self.n_heads:], qkv[:, :, n_qk:]

    def forward(self, x, cos, sin, k_cache, v_cache, start_pos: int,
                probe: Probe | None, layer: int) -> torch.Tensor:
        bsz, T, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in self.project(x, cos, sin))  # (bsz, heads | kv_heads, T, head_dim)
        end = start_pos + T
        k_cache[:, :, start_pos:end] = k
        v_cache[:, :, start_pos:end] = v
        keys, values = k_cache[:, :, :end], v_cache[:, :, :end]  # (bsz, n_kv_heads, end, head_dim)
        mask, causal = visible_keys(start_pos, T, end, self.window, x.device)
        out = None
        if bsz == 1 and T == 1 and mask is None and self.softcap is None:  # one query that sees every key
            out = kernels.attend_one(q[0, :, 0], keys[0].transpose(0, 1), values[0].transpose(0, 1), self.softmax_scale)
        if out is None:
            out = self._sdpa(q, keys, values, mask, causal)
        else:
            out = out.view(1, self.n_heads, 1, self.head_dim)  # (heads, head_dim) -> (bsz, heads, T, head_dim)
        if probe is not None and (layer in probe.attention_layers or layer in probe.pattern_layers):
            # Query i (position start_pos + i) sees keys 0 .. start_pos + i, within its window.
            visible = mask if mask is not None else torch.ones(
                T, end, dtype=torch.bool, device=x.device).tril(diagonal=start_pos)  # (T, end)
            if layer in probe.attention_layers:  # the last query's row only
                probe.attention[layer] = attention_weights(q[:, :, -1:], keys, visible[-1:], self.scale,
                                                           self.softcap)[0, :, 0]  # (n_heads, end)
            if layer in probe.pattern_layers:
                probe.patterns[layer] = attention_weights(q, keys, visible, self.scale, self.softcap)[0]  # (n_heads, T, end)
        out = out.transpose(1, 2).reshape(bsz, T, self.q_dim)  # (bsz, T, n_heads * head_dim)
        return self.wo(out)

    def forward_paged(self, x: torch.Tensor, cos, sin, k_pool: torch.Tensor, v_pool: torch.Tensor,
                      batch: PagedBatch) -> torch.Tensor:
        """x (1, N, hidden): rows of several runs (see PagedBatch); k_pool, v_pool: this
        layer's (slots, n_kv_heads, head_dim)."""
        _, N, _ = x.shape
        q = None
        if x.dtype == torch.float32 and x.device.type == "cpu" and kernels.available():  # every row alone
            qkv = self.wqkv(x)[0]  # (N, q_dim + 2 kv_dim)
            if self.bqkv is not None:
                qkv = qkv + self.bqkv
            if self.full_norms:
                qkv = self._norm_full(qkv)
            elif self.q_norm is not None:
                qkv = self._norm_heads(qkv)
            # q (N, heads, head_dim) rotated; k rotated and v written to their slots, in one call
            q = kernels.rope_store(qkv, cos.reshape(N, -1), sin.reshape(N, -1), k_pool, v_pool,
                                   batch.write_slots, self.n_heads)
        if q is None:
            q, k, v = (t[0] for t in self.project(x, cos, sin))  # (N, heads | kv_heads, head_dim)
            k_pool.index_copy_(0, batch.write_slots, k)
            v_pool.index_copy_(0, batch.write_slots, v)
        if not batch.prefills:  # every row is a decoding run's new token, in order
            out = self._decode(q, k_pool, v_pool, batch)
            return self.wo(out.view(1, N, self.q_dim))
        out = torch.empty_like(q)  # (N, n_heads, head_dim)
        if batch.decode_rows is not None:
            out[batch.decode_rows] = self._decode(q[batch.decode_rows], k_pool, v_pool, batch)
        for row, n, slots, start in batch.prefills:
            # Each prompt row's attention as a decode row's, by the same kernel over the same keys:
            # its numbers do not depend on how the prompt was cut into chunks, nor on a prefix
            # read back from the cache, nor on the other rows of the step.
            first = torch.arange(start + 1, start + n + 1)  # (n,): each row's keys held, its own included
            op = kernels.attend(q[row:row + n], k_pool, v_pool, self.softmax_scale,
                                (first - self.window).clamp_(min=0) if self.window is not None else torch.zeros_like(first),
                                first, slots, 1, max_length=start + n, softcap=self.softcap)
            if op is not None:
                out[row:row + n] = op
                continue
            qp = q[row:row + n].transpose(0, 1).unsqueeze(0)  # (1, n_heads, n, head_dim)
            kp = k_pool.index_select(0, slots).transpose(0, 1).unsqueeze(0)  # (1, n_kv_heads, start + n, head_dim)
            vp = v_pool.index_select(0, slots).transpose(0, 1).unsqueeze(0)
            mask, causal = visible_keys(start, n, start + n, self.window, x.device)
            op = self._sdpa(qp, kp, vp, mask, causal)
            out[row:row + n] = op[0].transpose(0, 1)  # (n, n_heads, head_dim)
        return self.wo(out.reshape(1, N, self.q_dim))

    def _sdpa(self, q, k, v, mask, causal: bool) -> torch.Tensor:
        """softmax(q k^T * scale + mask) v: q (bsz, heads, Tq, d), k and v (bsz, kv_heads, Tk, d);
        by SDPA, or by hand where the scores are soft-capped (Gemma 2), as transformers' eager
        attention does: scale, cap, mask, softmax in float32."""
        if self.softcap is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                  scale=self.scale, enable_gqa=self.gqa)
        if causal:
            mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril(k.shape[-2] - q.shape[-2])
        weights = attention_weights(q, k, mask, self.scale, self.softcap).to(v.dtype)  # (bsz, heads, Tq, Tk)
        return weights @ v.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (bsz, heads, Tq, d)

    def _norm_full(self, qkv: torch.Tensor) -> torch.Tensor:
        """(..., q_dim + 2 kv_dim) with the whole q and the whole k normed (OLMo 2's norms)."""
        q, k, v = qkv.split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
        return torch.cat([self.q_norm(q.contiguous()), self.k_norm(k.contiguous()), v], dim=-1)

    def _norm_heads(self, qkv: torch.Tensor) -> torch.Tensor:
        """qkv (N, q_dim + 2 kv_dim) with each q and k head normed on its own by the kernels'
        RMSNorm, row by row (the one-call step's numbers, whatever N)."""
        N, n_qk, d = qkv.shape[0], self.n_heads + self.n_kv_heads, self.head_dim
        heads = qkv.view(N, n_qk + self.n_kv_heads, d)  # (N, heads + 2 kv_heads, head_dim)
        q = kernels.rms_norm(heads[:, :self.n_heads].contiguous(), self.q_norm.weight, self.q_norm.eps)
        k = kernels.rms_norm(heads[:, self.n_heads:n_qk].contiguous(), self.k_norm.weight, self.k_norm.eps)
        return torch.cat([q, k, heads[:, n_qk:]], dim=1).view(N, -1)  # (N, q_dim + 2 kv_dim)

    def _decode(self, q: torch.Tensor, k_pool, v_pool, batch: PagedBatch) -> torch.Tensor:
        """Attention of B decode rows q (B, n_heads, head_dim), each over its own run's context
        (batch.decode_blocks): through its blocks (CPU kernel) or gathered a block at a time, or
        one run's slots read in place."""
        B, ctx = q.shape[0], batch.decode_blocks
        lengths, first = batch.decode_lengths, batch.decode_first[self.window is not None]
        if isinstance(ctx, slice):  # one run's keys read in place
            od = kernels.attend(q, k_pool[ctx], v_pool[ctx], self.softmax_scale, first, lengths,
                                max_length=ctx.stop - ctx.start, softcap=self.softcap)
        else:  # each run's keys through its blocks, none gathered
            od = kernels.attend(q, k_pool, v_pool, self.softmax_scale, first, lengths, ctx, BLOCK_SIZE,
                                max_length=ctx.shape[1] * BLOCK_SIZE, softcap=self.softcap)  # a bound: its table's positions
        if od is not None:  # (B, n_heads, head_dim)
            return od
        if isinstance(ctx, slice):
            kd, vd = k_pool[ctx].unsqueeze(0), v_pool[ctx].unsqueeze(0)  # (1, L, n_kv_heads, head_dim)
        else:
            # (n_blocks, BLOCK_SIZE, n_kv_heads, head_dim) -> (B, nb * BLOCK_SIZE, n_kv_heads, head_dim);
            # index_select copies whole blocks ~10x faster than indexing with a 2-D tensor.
            blocks = ctx.view(-1)  # (B * nb,)
            kd = k_pool.view(-1, BLOCK_SIZE, self.n_kv_heads, self.head_dim).index_select(0, blocks).view(B, -1, self.n_kv_heads, self.head_dim)
            vd = v_pool.view(-1, BLOCK_SIZE, self.n_kv_heads, self.head_dim).index_select(0, blocks).view(B, -1, self.n_kv_heads, self.head_dim)
        mask = batch.window_mask if self.window is not None and batch.window_mask is not None else batch.decode_mask
        od = self._sdpa(q.unsqueeze(2), kd.transpose(1, 2), vd.transpose(1, 2), mask, False)
        return od.squeeze(2)  # (B, n_heads, head_dim)
