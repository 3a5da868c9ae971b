"""Chapters 7 to 9: what the prediction cost. Prefill and decode measured by the run and placed
on this machine's roofline; the KV cache's bytes, and a run without it against one with it;
FLOPs per token by component, for this model and LLaMA-7B, by the one counter (anatomy.py)."""

from __future__ import annotations

import statistics
import time

import torch

from inference.lesson.roofline import Roofline, _sync
from inference.model.anatomy import LLAMA_7B, per_token, stages
from inference.model.config import ModelConfig

# A GPU's datasheet figures (NVIDIA H100 SXM: dense BF16 tensor FLOP/s, HBM3 bytes/s), to say
# what FLOPs and bytes per token imply there: quoted, not measured.
TRIES = 2  # timings of each step of the cache demonstration: the better is kept

GPU = {"name": "NVIDIA H100 SXM (datasheet)", "peak_flops": 989e12, "bandwidth": 3.35e12, "bytes_per_value": 2}


def _pass(name: str, flops: int, nbytes: int, seconds: float | None, roof: Roofline) -> dict:
    intensity = flops / nbytes
    return {"pass": name, "flops": flops, "bytes": nbytes, "intensity": intensity, "seconds": seconds,
            "achieved_flops": flops / seconds if seconds else None,
            "attainable_flops": roof.attainable(intensity), "bound": roof.bound(intensity),
            # A pass measured above the roof: the machine was busier while its peaks were measured.
            "above_roof": bool(seconds) and flops / seconds > roof.attainable(intensity)}


def prefill_decode(cfg: ModelConfig, n: int, reused: int, ttft_ms: float, decode_ms: list[float],
                   weight_bytes: int, decode_bytes: int, kv_bytes: int, roof: Roofline,
                   stored: dict[str, int] | None = None) -> dict:
    """The run's prefill (its n - reused positions computed, attending to all n) and its decode
    steps (one token each), by the counter, against their measured times and the roofline.
    With `stored` (a GGUF file's blocks) a decode step reads the matrices as stored, as "Inside
    one token" counts it; the prefill multiplies float32 tiles dequantized from them."""
    pre = stages(cfg, n - reused, n, weight_bytes, kv_bytes)[-1]
    dec = stages(cfg, 1, n + 1, decode_bytes, kv_bytes, stored)[-1]  # the first decode step
    dec_f32 = stages(cfg, 1, n + 1, 4, kv_bytes)[-1].bytes if stored else None
    step_ms = statistics.median(decode_ms) if decode_ms else None
    return {"prompt_tokens": n, "prompt_tokens_reused": reused, "ttft_ms": ttft_ms,
            "decode_ms": decode_ms, "decode_step_ms": step_ms,
            "decode_tokens_per_s": 1000 / step_ms if step_ms else None,
            "prefill": _pass(f"prefill ({n - reused} positions)", pre.flops, pre.bytes, ttft_ms / 1000, roof),
            "decode": _pass("one decode step", dec.flops, dec.bytes, step_ms / 1000 if step_ms else None, roof),
            "decode_reads_blocks": bool(stored), "decode_bytes_float32": dec_f32,
            "roofline": roof.to_json()}


@torch.inference_mode()
def cache_demo(model, ids: list[int], steps: int) -> dict:
    """The same greedy tokens made twice by the model's one-off forward pass: with a KV cache
    (the prompt once, then one position a step) and without (the whole prefix every step).
    Per-step wall times, measured here: each step the better of TRIES (a step run again writes the
    same cache slots: it is the same work), the two runs' steps taken in turn so that whatever
    else the machine does slows both alike."""
    device = model.device
    cache = model.new_cache(len(ids) + steps)
    allocated = cache.k.nbytes + cache.v.nbytes

    def timed(fn):
        best = float("inf")
        for _ in range(TRIES):
            _sync(device)
            t0 = time.perf_counter()
            logits = fn()  # (1, vocab)
            top, token = (float(x) for x in logits[0].max(-1))
            _sync(device)
            best = min(best, (time.perf_counter() - t0) * 1000)
        return int(token), top, best

    with_ms, with_tokens, with_top, without_ms, without_top, seq = [], [], [], [], [], list(ids)
    for s in range(steps):
        if s == 0:  # the prompt, into the cache
            token, top, ms = timed(lambda: model(torch.tensor([ids], device=device), cache, 0))
        else:  # the last token only, at its position, against the cache
            token, top, ms = timed(lambda: model(torch.tensor([[with_tokens[-1]]], device=device), cache, len(ids) + s - 1))
        with_tokens.append(token), with_top.append(top), with_ms.append(ms)
        token, top, ms = timed(lambda: model(torch.tensor([seq], device=device), model.new_cache(len(seq)), 0))
        seq.append(token), without_top.append(top), without_ms.append(ms)
    return {"with_ms": with_ms, "without_ms": without_ms, "with_tokens": with_tokens,
            "without_tokens": seq[len(ids):], "with_top_logits": with_top, "without_top_logits": without_top,
            "allocated_bytes": allocated, "allocated_positions": cache.capacity}


def kv_cache(cfg: ModelConfig, n: int, kv_bytes: int, weight_bytes: int, run_kv: list[int | None],
             demo: dict, tokenizer) -> dict:
    """Bytes per position by the formula, the run's cache step by step, and the run without a
    cache against the run with it: per-step time (measured) and FLOPs (counted), and their totals."""
    per_position = cfg.kv_bytes_per_token(kv_bytes)
    steps = len(demo["with_ms"])
    with_flops = [stages(cfg, n, n, weight_bytes, kv_bytes)[-1].flops] + [
        stages(cfg, 1, n + s, weight_bytes, kv_bytes)[-1].flops for s in range(1, steps)]
    without_flops = [stages(cfg, n + s, n + s, weight_bytes, kv_bytes)[-1].flops for s in range(steps)]
    all_heads = 2 * cfg.n_layers * cfg.n_heads * cfg.head_dim * kv_bytes
    return {"prompt_tokens": n, "formula": f"2 × {cfg.n_layers} layers × {cfg.n_kv_heads} KV heads × {cfg.head_dim} head dim × {kv_bytes} bytes",
            "bytes_per_position": per_position, "bytes_per_position_all_heads": all_heads,
            "allocated_bytes_per_position": demo["allocated_bytes"] // demo["allocated_positions"],
            "context_window": cfg.max_seq_len, "full_context_bytes": per_position * cfg.max_seq_len,
            "growth": [{"step": s, "positions": n + s, "bytes": per_position * (n + s), "run_bytes": b}
                       for s, b in enumerate(run_kv)],
            "steps": steps, "with_cache_ms": demo["with_ms"], "without_cache_ms": demo["without_ms"],
            "with_cache_flops": with_flops, "without_cache_flops": without_flops,
            "with_cache_total_ms": sum(demo["with_ms"]), "without_cache_total_ms": sum(demo["without_ms"]),
            "time_ratio": sum(demo["without_ms"]) / sum(demo["with_ms"]),
            "flops_ratio": sum(without_flops) / sum(with_flops),
            "tokens": [tokenizer.piece(i) for i in demo["with_tokens"]],
            "same_tokens": demo["with_tokens"] == demo["without_tokens"],
            "with_cache_tokens": demo["with_tokens"], "without_cache_tokens": demo["without_tokens"],
            # Each step's top logit: both runs computed the same numbers (within float rounding).
            "with_cache_top_logits": demo["with_top_logits"], "without_cache_top_logits": demo["without_top_logits"]}


def _table(cfg: ModelConfig, context: int, b: int, stored: dict[str, int] | None = None) -> list[dict]:
    rows = per_token(cfg, context, b, stored=stored)
    total = rows[-1].flops
    return [{"component": c.name, "flops": c.flops, "bytes": c.bytes, "share": c.flops / total} for c in rows]


def _textbook(cfg: ModelConfig, context: int, b: int) -> dict:
    """The simplified figures tutorials use, beside the exact count."""
    L, h, I = cfg.n_layers, cfg.hidden_size, cfg.intermediate_size
    p = cfg.param_counts()
    multiplied = p["attention"] + p["ffn"] + cfg.vocab_size * h  # every matrix a token is multiplied by
    exact = per_token(cfg, context, b)
    norms = next(c for c in exact if c.name == "norms and residuals").flops
    return {"exact": exact[-1].flops, "two_times_params": 2 * multiplied,
            "mlp_two_matrices": L * 2 * 2 * h * I, "mlp_three_matrices": L * 2 * 3 * h * I,
            "norms_share": norms / exact[-1].flops,
            "kv_bytes_all_heads": 2 * L * cfg.n_heads * cfg.head_dim * b,
            "kv_bytes_kv_heads": cfg.kv_bytes_per_token(b)}


def flops_per_token(cfg: ModelConfig, context: int, weight_bytes: int, roof: Roofline,
                    measured_tokens_per_s: float | None, stored: dict[str, int] | None = None) -> dict:
    """The per-token FLOPs table for this model and for LLaMA-7B (same context, same counter),
    the textbook simplifications, and the tokens per second the FLOPs and bytes allow on this
    machine's measured roofline (bytes as the model reads them: `stored`, a GGUF file's blocks,
    where it has them) and on a datasheet GPU."""
    here = per_token(cfg, context, weight_bytes, stored=stored)[-1]
    gpu_b = GPU["bytes_per_value"]
    out = {"context": context, "model": _table(cfg, context, weight_bytes, stored), "llama_7b": _table(LLAMA_7B, context, gpu_b),
           "llama_7b_config": {"n_layers": LLAMA_7B.n_layers, "hidden": LLAMA_7B.hidden_size,
                               "intermediate": LLAMA_7B.intermediate_size, "n_heads": LLAMA_7B.n_heads,
                               "vocab_size": LLAMA_7B.vocab_size},
           "textbook": {"model": _textbook(cfg, context, weight_bytes), "llama_7b": _textbook(LLAMA_7B, context, gpu_b)},
           "this_machine": {"compute_bound_tokens_per_s": roof.peak_flops / here.flops,
                            "bandwidth_bound_tokens_per_s": roof.bandwidth / here.bytes,
                            "measured_tokens_per_s": measured_tokens_per_s},
           "gpu": {**GPU}}
    for key, c in (("model", cfg), ("llama_7b", LLAMA_7B)):
        t = per_token(c, context, gpu_b)[-1]
        out["gpu"][key] = {"compute_bound_tokens_per_s": GPU["peak_flops"] / t.flops,
                           "bandwidth_bound_tokens_per_s": GPU["bandwidth"] / t.bytes}
    return out
