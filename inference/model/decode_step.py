"""A decode step in one call: every layer and the LM head for a few runs' new tokens.

kernels.c's token_lab_decode runs the step the model's layer-by-layer path runs through the
kernels (the same functions in the same order, so the same bits) without the ~1,000 small
operators and ~120 thread-team starts around them. Its products read each weight as its table
says (kernels/quant.c): float32, or a GGUF file's quantized blocks. It serves CPU models with
float32 activations for steps of at most KERNEL_ROWS decoding runs, of every family whose features
it computes (family_spec.PATHS["DecodeStep"]: q/k/v biases, per-head q/k norms, norms around each
branch, sliding windows, any RoPE tables, RoPE on a head's first dims only); a model needing another feature (soft-capped scores,
layers without RoPE, OLMo 2's norms, Granite's residual multiplier) never takes it, and the
model's own path serves it and the rest.
"""

from __future__ import annotations

import torch

from inference.model import kernels
from inference.model.attention import PagedBatch
from inference.model.family_spec import missing
from inference.model.kv_cache import BLOCK_SIZE
from inference.model.layers import KERNEL_ROWS, Linear
from inference.model.quant import F32, QuantWeight


class DecodeStep:
    """The one-call step for `model`, or None from `for_model` where it does not apply."""

    def __init__(self, model):
        self.model, cfg = model, model.cfg
        self.dims = [0, cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.intermediate_size,
                     cfg.vocab_size, cfg.n_layers, int(cfg.activation != "silu")]
        self.scale = model.layers[0].attention.softmax_scale
        self._descs = {m: _desc(m) for m in model.modules() if isinstance(m, Linear)}  # kept alive
        self.weight_ptrs = [self._weights(layer) for layer in model.layers]
        self.sliding = [int(cfg.is_sliding(i)) for i in range(cfg.n_layers)]
        self.weight_bytes = model.weight_bytes()
        self._tables: dict[tuple[int, ...], torch.Tensor] = {}  # by the pools' addresses

    @classmethod
    def for_model(cls, model) -> "DecodeStep | None":
        linears = [m for m in model.modules() if isinstance(m, Linear)]
        copies = all(m.decode_weight is None or isinstance(m.decode_weight, QuantWeight) for m in linears)
        if (model.device.type != "cpu" or model.dtype != torch.float32 or not copies or not kernels.available()
                or not all(m.qweight is not None or m.weight.is_contiguous() for m in linears)
                or missing("DecodeStep", model.cfg.features())):
            return None
        return cls(model)

    def applies(self, batch: PagedBatch, rows: int, k_pool) -> bool:
        """Whether this step is one this call runs: only decoding runs, few enough, every row's
        logits, pools laid out as KVPool's."""
        return (not batch.prefills and 0 < rows <= KERNEL_ROWS and len(batch.logit_rows) == rows
                and k_pool[0].is_contiguous())

    def __call__(self, h: torch.Tensor, ropes, batch: PagedBatch, k_pool, v_pool) -> torch.Tensor | None:
        """h (N, hidden) embeddings of N decoding runs' tokens (updated in place) -> float32
        logits (N, vocab) of every row, before any soft cap. ropes: the model's tables at the
        rows' positions. None where the kernels are gone (switched off since the model loaded)."""
        N, ctx = h.shape[0], batch.decode_blocks
        if isinstance(ctx, slice):  # one run's keys read in place
            blocks, n_blocks, offset, max_length = None, 0, ctx.start, ctx.stop - ctx.start
        else:
            blocks, n_blocks, offset, max_length = ctx.contiguous(), ctx.shape[1], 0, ctx.shape[1] * BLOCK_SIZE
        (cos, sin), (cos_l, sin_l) = ropes["full"], ropes["local"]  # each (N, 1, rotary_dim)
        cos, sin, cos_l, sin_l = (t.reshape(N, -1).contiguous() for t in (cos, sin, cos_l, sin_l))  # (N, rotary_dim)
        first, first_l = (batch.decode_first[w].contiguous() for w in (False, True))
        lengths, slots = batch.decode_lengths.contiguous(), batch.write_slots.contiguous()
        model = self.model
        cfg = model.cfg
        logits = torch.empty(N, cfg.vocab_size, dtype=torch.float32)
        pointers = [h.data_ptr(), cos.data_ptr(), sin.data_ptr(), cos_l.data_ptr(), sin_l.data_ptr(), slots.data_ptr(),
                    0 if blocks is None else blocks.data_ptr(), first.data_ptr(), first_l.data_ptr(),
                    lengths.data_ptr(), model.norm.weight.data_ptr(), self._descs[model.output].data_ptr(), logits.data_ptr()]
        kv_bytes = N * max_length * 2 * cfg.kv_dim * 4 * cfg.n_layers
        ran = kernels.decode([N, *self.dims[1:], n_blocks, BLOCK_SIZE, offset, max_length, cfg.rotary_dim],
                             self._table(k_pool, v_pool), pointers, model.norm.eps, self.scale, self.weight_bytes + kv_bytes)
        return logits if ran else None

    def _table(self, k_pool, v_pool) -> torch.Tensor:
        """(layers, 14) int64: each layer's weights, its pool's keys and values, whether it slides."""
        pools = tuple(t.data_ptr() for layer in zip(k_pool, v_pool) for t in layer)
        table = self._tables.get(pools)
        if table is None:
            self._tables.clear()  # one pool at a time
            rows = [[*w, pools[2 * i], pools[2 * i + 1], s] for i, (w, s) in enumerate(zip(self.weight_ptrs, self.sliding))]
            table = self._tables[pools] = torch.tensor(rows, dtype=torch.int64)
        return table


    def _weights(self, layer) -> list[int]:
        """A layer's weights' addresses, in kernels.c's L_* order (0: no such bias or norm); the
        products' as their weight tables (quant.c)."""
        a, f, d = layer.attention, layer.feed_forward, self._descs

        def at(t) -> int:
            return 0 if t is None else t.data_ptr()
        return [at(layer.attention_norm.weight), at(d[a.wqkv]), at(a.bqkv),
                at(a.q_norm and a.q_norm.weight), at(a.k_norm and a.k_norm.weight), at(d[a.wo]),
                at(layer.post_attention_norm and layer.post_attention_norm.weight),
                at(layer.ffn_norm.weight), at(d[f.w13]), at(d[f.w2]),
                at(layer.post_ffn_norm and layer.post_ffn_norm.weight)]


def _desc(linear: Linear) -> torch.Tensor:
    """A linear layer's weight table for quant.c: its blocks', or one float32 part over its weight."""
    if linear.qweight is not None:
        return linear.qweight.desc
    if isinstance(linear.decode_weight, QuantWeight):  # a bfloat16 decode copy
        return linear.decode_weight.desc
    w = linear.weight
    return torch.tensor([w.shape[0], w.shape[1], 1, F32, w.shape[0], w.data_ptr(), w.stride(0) * 4], dtype=torch.int64)
