"""The transformer: embedding -> N x (attention, gated feed-forward) -> norm -> LM head.

One path for every family (family_spec.py); where a family turns, the module built for it has
the part (a bias, a q/k norm, a norm after attention, a window, a multiplier) and the path runs it
if present. This torch path computes every feature a spec can name (family_spec.PATHS); the
one-call step (decode_step.py) declares fewer, and a model needing more never takes it.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from inference.device import available_memory_bytes
from inference.model import kernels
from inference.model.attention import Attention, PagedBatch, Probe, window_decode_mask  # noqa: F401 (Probe, PagedBatch: the model's API)
from inference.model.arena import ALIGN, Arena, stored_size
from inference.model.config import ModelConfig
from inference.model.decode_step import DecodeStep
from inference.model.family_spec import require
from inference.model.kv_cache import BLOCK_SIZE, KVCache
from inference.model.layers import ONEDNN_CACHED_SHAPES, ROWS_HINT, Embedding, FeedForward, Linear, RMSNorm  # noqa: F401 (Linear: the model's API)
from inference.model.quant import QuantWeight
from inference.model.rope import identity_tables, rope_tables


# ---------------------------------------------------------------- transformer block
class Block(nn.Module):
    """x + attn(norm(x)), then + ffn(norm(.)); Gemma also norms each branch's output, OLMo 2 only
    its output; Granite multiplies each branch's output by a constant."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        norm = lambda on: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if on else None  # noqa: E731
        self.attention_norm = norm(cfg.pre_norms)
        self.attention = Attention(cfg, layer)
        self.ffn_norm = norm(cfg.pre_norms)
        self.feed_forward = FeedForward(cfg)
        self.post_attention_norm = norm(cfg.post_norms)
        self.post_ffn_norm = norm(cfg.post_norms)
        self.residual_multiplier = cfg.residual_multiplier

    @staticmethod
    def _norm(norm: RMSNorm | None, x: torch.Tensor) -> torch.Tensor:
        return x if norm is None else norm(x)

    def _branch(self, norm: RMSNorm | None, out: torch.Tensor) -> torch.Tensor:
        """A branch's output as it is added to the residual stream."""
        out = self._norm(norm, out)
        return out if self.residual_multiplier == 1.0 else out * self.residual_multiplier

    def _residual(self, x: torch.Tensor, attended: torch.Tensor, in_place: bool) -> torch.Tensor:
        """The attention branch's output added to x, then the feed-forward branch's."""
        h = x + self._branch(self.post_attention_norm, attended)
        ffn = self._branch(self.post_ffn_norm, self.feed_forward(self._norm(self.ffn_norm, h)))
        return h.add_(ffn) if in_place else h + ffn

    def forward(self, x, cos, sin, k_cache, v_cache, start_pos, probe, layer):
        attended = self.attention(self._norm(self.attention_norm, x), cos, sin, k_cache, v_cache, start_pos, probe, layer)
        return self._residual(x, attended, in_place=False)

    def forward_paged(self, x, cos, sin, k_pool, v_pool, batch: PagedBatch):
        attended = self.attention.forward_paged(self._norm(self.attention_norm, x), cos, sin, k_pool, v_pool, batch)
        return self._residual(x, attended, in_place=True)  # h is this block's own: added in place


# ---------------------------------------------------------------- the whole model
class Transformer(nn.Module):
    decode_step: DecodeStep | None = None
    products = "float32"  # a quantized model's products: "integer" (repacked blocks) or "float32"
    file_types: dict[str, int] | None = None  # a GGUF file's bytes by tensor type (the card's)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        require("Transformer.forward", cfg.features(), cfg.family)  # and forward_paged: the same features
        self.cfg = cfg
        self.tok_embeddings = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.output = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @classmethod
    def from_state_dict(cls, cfg: ModelConfig, state: dict[str, torch.Tensor],
                        device: torch.device, dtype: torch.dtype,
                        decode_dtype: torch.dtype | None = None, products: str = "float32") -> "Transformer":
        """Build the model around already-loaded weights (our names; see checkpoint.py). A
        QuantWeight (a GGUF file's blocks) becomes its module's `qweight`, the module holding no
        float32 weight: the model computes on the blocks (CPU, float32 activations). `state` is
        emptied: the model alone holds each tensor, so each is freed as it is copied into the
        model's own memory (store_weights), and a load peaks at the weights and one tensor more.
        products: "integer" repacks the blocks for the integer products (model/products.py)."""
        with torch.device("meta"):  # no random init: every parameter comes from `state`
            model = cls(cfg)
        model.products = products
        if cfg.tie_word_embeddings:
            state["output.weight"] = state["tok_embeddings.weight"]
        quant = {k: state[k] for k in state if isinstance(state[k], QuantWeight)}
        if quant and (device.type != "cpu" or dtype != torch.float32):
            raise ValueError("quantized blocks run on the CPU with float32 activations")
        for name in quant:
            module = model.get_submodule(name.removesuffix(".weight"))
            module.weight, module.qweight = None, quant[name]
        loaded = model.load_state_dict({k: v for k, v in state.items() if k not in quant}, strict=False, assign=True)
        if loaded.missing_keys or loaded.unexpected_keys:  # strict, but for the blocks' names
            raise ValueError(f"weights do not match the model: missing {loaded.missing_keys}, "
                             f"unexpected {loaded.unexpected_keys}")
        blocks = bool(quant)
        state.clear()  # the model holds the weights now: a re-laid-out one frees its first copy
        quant.clear()
        model.requires_grad_(False)
        model.to(device=device, dtype=dtype)
        if cfg.tie_word_embeddings and not blocks:
            model.output.weight = model.tok_embeddings.weight
        if model.device.type == "cpu":
            model.store_weights()
            model.keep_rows_copies(available_memory_bytes())
        cos, sin = rope_tables(cfg, cfg.max_seq_len, device, dtype)
        model.register_buffer("rope_cos", cos, persistent=False)
        model.register_buffer("rope_sin", sin, persistent=False)
        if cfg.local_rope_theta is not None:  # Gemma 3's sliding layers rotate at their own base
            cos, sin = rope_tables(cfg, cfg.max_seq_len, device, dtype, local=True)
        elif cfg.nope_layers:  # SmolLM3's layers without RoPE: tables that rotate nothing
            cos, sin = identity_tables(cfg, cfg.max_seq_len, device, dtype)
        model.register_buffer("rope_cos_local", cos, persistent=False)
        model.register_buffer("rope_sin_local", sin, persistent=False)
        model.set_decode_dtype(decode_dtype)
        return model.eval()

    def store_weights(self) -> None:
        """Copy each weight out of the checkpoint file into one arena (arena.py: 2 MiB pages), in
        the order a step reads them, each laid out as its few-row products read it fastest:
        row-major for our kernels (kernels/kernels.c streams rows), or, where they are not built,
        column-major ((out, in) with its memory laid out as (in, out): MKL's products for a
        decode step's few rows ran about 12% faster on it). Quantized blocks are copied as they
        are; a tied embedding table shares the LM head's copy. Each weight's first copy is freed
        as it is copied (if nothing else holds it), so no tensor keeps the mapped file and the
        weights are held once, but for the one being copied."""
        transpose = not kernels.available()
        tied = self.cfg.tie_word_embeddings
        order = [m for m in self.modules() if m is not self.tok_embeddings] + ([] if tied else [self.tok_embeddings])

        integer = self.products == "integer"

        def sizes(m) -> list[int]:  # the bytes of each tensor module m keeps in the arena
            q = getattr(m, "qweight", None)
            if q is not None:
                return q.repacked_sizes() if integer else [stored_size(p.data) for p in q.parts]
            return [stored_size(t) for t in held(m)]

        def held(m) -> list[torch.Tensor]:  # the float tensors module m keeps in the arena
            if isinstance(m, (Linear, RMSNorm, nn.Embedding)) and m.weight is not None:
                return [m.weight]
            return [m.bqkv] if isinstance(m, Attention) and m.bqkv is not None else []

        arena = Arena(sum(-(-n // ALIGN) * ALIGN for m in order for n in sizes(m)))
        for m in order:
            if getattr(m, "qweight", None) is not None:  # repacked straight into the arena
                m.qweight = m.qweight.repacked(arena.empty, arena.put) if integer else m.qweight.moved(arena.put)
            elif isinstance(m, Linear) and m.weight is not None:
                w = arena.put(m.weight.t()).t() if transpose else arena.put(m.weight)
                m.weight = nn.Parameter(w, requires_grad=False)
            elif isinstance(m, (RMSNorm, nn.Embedding)) and m.weight is not None:
                m.weight = nn.Parameter(arena.put(m.weight), requires_grad=False)
            elif isinstance(m, Attention) and m.bqkv is not None:
                m.bqkv = nn.Parameter(arena.put(m.bqkv), requires_grad=False)
        if tied:
            self.tok_embeddings.weight = self.output.weight
            if self.output.qweight is not None:
                self.tok_embeddings.qweight = self.output.qweight

    def keep_rows_copies(self, available_bytes: int) -> bool:
        """Give each linear layer a second copy of its weight in oneDNN's blocked layout, for
        products of several rows: a decode step of many runs, a prefill. oneDNN's float32
        product on it is exact float32 like MKL's, and faster for few rows: SmolLM2's 30 layers
        and LM head, cold, 8 rows: 34.6 ms against 47.6 ms with MKL on the column-major
        weights; 16 rows 43.5 against 56.6; 512 rows the same (629 and 624 ms); one row is
        slower on it (33 ms against 21 ms for the matrix-vector product, which keeps the
        first copy). The copy costs the weights' bytes again, so it is kept only on a float32
        CPU model with oneDNN, when it takes at most a quarter of `available_bytes`, and only
        without our kernels: with them every row goes through them (Linear), so that a row's
        numbers do not depend on the rows beside it, and no second copy is kept."""
        linears = [m for m in self.modules() if isinstance(m, Linear) and m.weight is not None]
        size = sum(m.weight.numel() * m.weight.element_size() for m in linears)
        if (self.device.type != "cpu" or self.dtype != torch.float32 or size > available_bytes / 4
                or not torch.backends.mkldnn.is_available() or kernels.available()):
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
        """Give every linear layer a decode copy in decode_dtype (None or dtype: no copy). A
        bfloat16 copy of a float32 CPU model is read by the kernels (kernels/quant.c), which
        widen each weight to float32 and sum in float32: half the bytes of float32 a step."""
        same = decode_dtype is None or decode_dtype == self.dtype
        in_kernels = (decode_dtype == torch.bfloat16 and self.device.type == "cpu" and self.dtype == torch.float32
                      and kernels.available())
        linears = [m for m in self.modules() if isinstance(m, Linear) and m.weight is not None]
        arena = Arena(sum(stored_size(m.weight.to("meta", torch.bfloat16)) for m in linears)) if in_kernels else None
        for module in linears:  # the copies in an arena of their own (2 MiB pages, as the weights)
            module.decode_weight = None if same else QuantWeight.bfloat16(module.weight).moved(arena.put) \
                if in_kernels else module.weight.to(decode_dtype)
        self.decode_dtype = self.dtype if same else decode_dtype
        self.decode_step = DecodeStep.for_model(self)  # a whole decode step in one call, where it applies

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the float weights'; quantized blocks compute in float32)."""
        return self.norm.weight.dtype

    @property
    def quantized(self) -> bool:
        """Whether the matrices are read in a GGUF file's quantized blocks."""
        return any(m.qweight is not None for m in self.modules() if isinstance(m, Linear))

    def stored_bytes(self) -> dict[str, int] | None:
        """A quantized model's matrices as stored (anatomy.stages' `stored`): the bytes of every
        layer's q/k/v, output and feed-forward matrices, the LM head's, and one embedding row's;
        None for float weights (their bytes follow from the dtype)."""
        if not self.quantized:
            return None

        def size(m: Linear) -> int:
            return m.qweight.nbytes if m.qweight is not None else m.weight.numel() * m.weight.element_size()
        emb = getattr(self.tok_embeddings, "qweight", None)
        return {"qkv": sum(size(b.attention.wqkv) for b in self.layers),
                "out": sum(size(b.attention.wo) for b in self.layers),
                "ffn": sum(size(b.feed_forward.w13) + size(b.feed_forward.w2) for b in self.layers),
                "head": size(self.output),
                "embed_row": emb.nbytes // emb.out_features if emb is not None else self.cfg.hidden_size * self.dtype.itemsize}

    def weight_bytes(self) -> int:
        """The bytes of the matrices a decode step reads (its decode copies where it has them;
        the LM head's, not the embedding's rows)."""
        return sum(w.nbytes if isinstance(w, QuantWeight) else w.numel() * w.element_size()
                   for w in (m.qweight if m.qweight is not None else m.decode_weight if m.decode_weight is not None
                             else m.weight for m in self.modules() if isinstance(m, Linear)))

    def new_cache(self, capacity: int, bsz: int = 1) -> KVCache:
        return KVCache(self.cfg, min(capacity, self.cfg.max_seq_len), self.device, self.dtype, bsz)

    def forward(self, tokens: torch.Tensor, cache: KVCache, start_pos: int, *,
                all_logits: bool = False, probe: Probe | None = None, head: bool = True) -> torch.Tensor:
        """Run tokens (bsz, T) at positions start_pos.. against the cache; return float32 logits.

        Logits are (bsz, vocab) for the last position, or (bsz, T, vocab) with all_logits.
        head=False returns the last layer's hidden states instead, (bsz, [T,] hidden): a caller
        that needs every position's logits takes them through `head` a few rows at a time.
        """
        T = tokens.shape[1]
        if start_pos + T > cache.capacity:
            raise ValueError(f"positions {start_pos}..{start_pos + T} exceed the cache ({cache.capacity})")
        h = self.embed(tokens)  # (bsz, T, hidden)
        ropes = self._ropes(slice(start_pos, start_pos + T))  # each (T, 1, head_dim): broadcasts over heads
        for i, layer in enumerate(self.layers):
            cos, sin = ropes[self.cfg.rope_kind(i)]
            h = layer(h, cos, sin, cache.k[i], cache.v[i], start_pos, probe, i)
            if probe is not None and probe.logit_lens:
                probe.residuals.append(h[0, -1])
        cache.length = start_pos + T
        if not all_logits:
            h = h[:, -1]  # (bsz, hidden): only the next token's logits are needed
        return self.head(h) if head else h

    def forward_paged(self, tokens: torch.Tensor, batch: PagedBatch, k_pool, v_pool) -> torch.Tensor:
        """One scheduler step: tokens (N,) of several runs against the paged pool (k_pool,
        v_pool: KVPool.k, .v, or their per-layer views KVPool.k_layers, .v_layers). Returns
        float32 logits (R, vocab) for batch.logit_rows."""
        h = self.embed(tokens).unsqueeze(0)  # (1, N, hidden)
        ropes = self._ropes(batch.positions)  # each (N, 1, head_dim): broadcasts over heads
        window = self.cfg.sliding_window
        if batch.decode_rows is not None:
            lengths = batch.decode_lengths = batch.positions[batch.decode_rows] + 1  # (B,)
            full = torch.zeros_like(lengths)
            batch.decode_first = {False: full, True: full if window is None else (lengths - window).clamp_(min=0)}
        step = self.decode_step
        if step is not None and step.applies(batch, len(tokens), k_pool):
            logits = step(h[0], ropes, batch, k_pool, v_pool)  # (N, vocab): every row's
            if logits is not None:  # every row's: in order, as the scheduler lays them out, not copied
                in_order = batch.logit_rows.tolist() == list(range(len(logits)))
                return self._finish(logits if in_order else logits[batch.logit_rows])
        if window is not None and batch.decode_rows is not None and batch.window_mask is None:
            positions = batch.positions[batch.decode_rows]  # (B,)
            if int(positions.max()) >= window:  # a run reaches past its window: sliding layers mask
                ctx = batch.decode_blocks
                context = ctx.stop - ctx.start if isinstance(ctx, slice) else ctx.shape[1] * BLOCK_SIZE
                batch.window_mask = window_decode_mask(positions, context, window)
        for i, layer in enumerate(self.layers):
            cos, sin = ropes[self.cfg.rope_kind(i)]
            h = layer.forward_paged(h, cos, sin, k_pool[i], v_pool[i], batch)
        return self.head(h[0, batch.logit_rows])  # from (R, hidden)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids (...) -> their embeddings (..., hidden), scaled where the family scales them."""
        q = getattr(self.tok_embeddings, "qweight", None)
        h = self.tok_embeddings(tokens) if q is None else q.gather(tokens)
        if self.cfg.embed_scale != 1.0:  # Gemma: sqrt(hidden), rounded to the model's dtype first
            h = h * torch.tensor(self.cfg.embed_scale, dtype=h.dtype)
        return h

    def _ropes(self, at) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """RoPE tables at positions `at` (a slice or (N,) tensor), each (len, 1, head_dim), by the
        kind of layer that reads them (ModelConfig.rope_kind): "full"; "local", sliding layers
        with a base of their own; "none", layers without RoPE (tables that rotate nothing)."""
        full = self.rope_cos[at].unsqueeze(1), self.rope_sin[at].unsqueeze(1)
        other = (self.rope_cos_local[at].unsqueeze(1), self.rope_sin_local[at].unsqueeze(1)) \
            if self.cfg.local_rope_theta is not None or self.cfg.nope_layers else full
        return {"full": full, "local": other, "none": other}

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: hidden states (..., hidden) -> float32 logits (..., vocab),
        divided (Granite) and soft-capped (cap * tanh(logits / cap)) where the config says."""
        return self._finish(self.output(self.norm(h)).float())

    def _finish(self, logits: torch.Tensor) -> torch.Tensor:
        if self.cfg.logit_scale != 1.0:
            logits = logits / self.cfg.logit_scale
        cap = self.cfg.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def lens_logits(self, residual: torch.Tensor) -> torch.Tensor:
        """The logit lens: one residual stream (hidden,) through the final norm and LM head."""
        return self.head(residual.unsqueeze(0))[0]  # as a (1, hidden) row
