"""What the page says in front of a model server: the model card, the KV-cache formula, the
run statistics and the server's own load, and in place of what needs the model's insides, why
it is not there. Pure functions of a RemoteInfo and a run's record, like render.py."""

from __future__ import annotations

import html
import time

from inference.model.anatomy import decode_cost, memory_table
from inference.remote.engine import INSIDES
from ui.render import ended_markdown, si
from ui.run_state import RunRecord

LOGPROBS = {
    "raw": "the model's own distribution (vLLM's default --logprobs-mode raw_logprobs)",
    "processed": "the distribution after the sampling settings (--logprobs-mode processed_logprobs)",
}
NO_CONFIG = ("The served model's shapes are not known here: start the page with "
             "`--engine-config PATH` (its config.json, or a local copy of the model) for them and "
             "the KV-cache formula.")

INSIDE_NOTE = (f"**Inside one token**: the path through the layers, the attention weights and the "
               f"logit lens need the model's weights and activations: {INSIDES}, which returns "
               "only tokens and the log-probabilities of the top candidates.")
REPLAY_NOTE = (f"**Replay** recomputes a step from its whole logit vector: {INSIDES}, which "
               "returns only the top candidates' log-probabilities (outside them nothing is known). "
               "Compare A/B and \"how likely was X?\" below ask the server again and work.")
CHARTS_NOTE = ("In front of a server: the raw entropy needs the whole distribution, and a rank is "
               "known only among the returned candidates; steps without them are left out of these "
               "charts, not drawn as zeros.")


def bars_source(info, top_n: int) -> str:
    return f"From the server's log-probabilities of its top {top_n} candidates: {LOGPROBS[info.logprobs]}."


def model_card(info) -> str:
    head = (f"**{html.escape(info.name)}** served by vLLM at `{html.escape(info.url)}` · context "
            f"{info.max_seq_len:,} tokens (the server's) · log-probabilities: {LOGPROBS[info.logprobs]}, "
            f"{info.logprobs_source}")
    cfg = info.cfg
    if cfg is None:
        return head + "  \n" + NO_CONFIG
    params = cfg.param_counts()
    return (head + "  \n"
            f"{cfg.n_layers} layers · hidden {cfg.hidden_size} · {cfg.n_heads} heads / {cfg.n_kv_heads} "
            f"KV heads · head dim {cfg.head_dim} · FFN {cfg.intermediate_size} · vocab {cfg.vocab_size:,} · "
            f"**{params['total'] / 1e6:.1f} M parameters** · ≈ {si(decode_cost(cfg, 1, 2).flops, 'FLOPs')} per "
            f"token at a 1-token context (from `{html.escape(info.config_source)}`)")


def kv_formula(info, positions: int | None = None) -> str:
    """The formula with the served model's numbers; bytes per value from the server's metrics or
    the config (see server_metrics.kv_bytes_per_value), left as b where nothing says. positions:
    this run's positions held (counted here: the server does not say what one request holds)."""
    cfg = info.cfg
    if cfg is None:
        return "**KV cache** = 2 × layers × KV heads × head dim × bytes per value × positions. " + NO_CONFIG
    b = info.kv_bytes
    values = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim
    if b is None:
        return (f"**KV cache** = 2 × {cfg.n_layers} × {cfg.n_kv_heads} × {cfg.head_dim} × b × positions = "
                f"**{values:,} × b bytes per position**, b = bytes per value: {info.kv_bytes_source}.")
    per = values * b
    text = (f"**KV cache** = 2 × layers × KV heads × head dim × bytes per value × positions = "
            f"2 × {cfg.n_layers} × {cfg.n_kv_heads} × {cfg.head_dim} × {b} × positions = "
            f"**{per:,} bytes per position** ({b} bytes per value: {info.kv_bytes_source})")
    if positions:
        text += (f"; × {positions} positions this run holds = {per * positions / 2**20:.2f} MiB, by the "
                 "formula (the server does not say what one request holds)")
    return text


def kv_bytes_per_token(info) -> int | None:
    if info.cfg is None or info.kv_bytes is None:
        return None
    return info.cfg.kv_bytes_per_token(info.kv_bytes)


def server_load_markdown(load=None, error: str | None = None) -> str:
    """The whole server's numbers, from its /metrics: every request on it, not only this page's."""
    at = time.strftime("%H:%M:%S")
    if error is not None:
        return f"**The whole server** ({at}): its /metrics did not answer: {html.escape(error)}"
    usage = "not published" if load.kv_cache_usage is None else f"{100 * load.kv_cache_usage:.1f}% in use"
    pool = ""
    if load.pool_tokens:
        pool = f" of {load.pool_tokens:,} positions" + (f" ({si(load.pool_bytes, 'B')})" if load.pool_bytes else "")
    running = "–" if load.running is None else load.running
    waiting = "–" if load.waiting is None else load.waiting
    return (f"**The whole server** (every request on it, not only this page's; its /metrics at {at}): "
            f"KV cache {usage}{pool} · {running} requests running · {waiting} waiting")


def stats_markdown(info, rec: RunRecord) -> str:
    if not rec.steps:
        return "No run yet."
    n = len(rec.steps)
    ctx = len(rec.prompt_ids) + n
    arrived = [s.ms for s in rec.steps[1:]]
    decode_s = sum(arrived) / 1000
    tps = (n - 1) / decode_s if decode_s > 0 else 0.0
    flops = (f"{si(decode_cost(info.cfg, ctx, 2).flops)}" if info.cfg is not None else "– (no config)")
    lines = [
        f"| prompt tokens | time to first token (at the page) | generated | tokens/s (at the page) | "
        f"FLOPs / token (at {ctx} ctx) | seed |",
        "|---|---|---|---|---|---|",
        f"| {len(rec.prompt_ids)} | {rec.steps[0].prefill_ms:.0f} ms | {n} | {tps:.1f} | {flops} | {rec.seed} |",
        "",
        "Times are measured at this page: they include the network and the server's queue.",
    ]
    if rec.done is not None:
        lines.append(ended_markdown(rec.done, "the server's context window", info.max_seq_len))
    return "\n".join(lines)


def memory_markdown(info) -> str:
    """Parameters per component, from the config (no bytes: the server's dtype is its own)."""
    cfg = info.cfg
    if cfg is None:
        return NO_CONFIG
    lines = ["| component | parameters |", "|---|---|"]
    for name, n, _ in memory_table(cfg, 1):
        lines.append(f"| {name} | {n:,} |")
    return "\n".join(lines)
