"""The KV cache as the page states it wherever a run is on view: the formula with this model's
numbers, this run's blocks of the paged pool, and in front of a server the whole server's load."""

from __future__ import annotations

import html
import time

from inference.events import StepEvent
from inference.model.kv_cache import BLOCK_SIZE
from ui.format import NO_CONFIG, count, mib
from ui.glossary import gloss


def pool_markdown(step: StepEvent | None) -> str:
    """This run's blocks of the paged KV cache, beside the server's whole pool, at `step` (the
    run's last on view: a finished run's blocks are given back, so the numbers are then's)."""
    if step is None or step.pool is None:
        return ""
    p = step.pool
    others = p.active_runs - 1
    return (f"\n\n**Paged KV cache** at step {step.step}: this run holds **{step.kv_blocks} "
            f"block{'s' * (step.kv_blocks != 1)}** of {BLOCK_SIZE} positions "
            f"({mib(step.kv_cache_capacity_bytes)}). The server's pool then (all runs): "
            f"**{p.blocks_used:,} of {p.blocks_total:,} blocks** in use ({mib(p.bytes_used)} of "
            f"{mib(p.blocks_total * p.bytes_per_block)}) by "
            + ("this run alone" if others <= 0 else f"this run and {others} other{'s' * (others != 1)}")
            + f"; {p.blocks_reserved:,} reserved for {'it' if others <= 0 else 'them'} (the most "
            f"{'it' if others <= 0 else 'they'} may grow to by max new tokens)"
            + (f"; {p.waiting_runs} run{'s' * (p.waiting_runs != 1)} waiting for blocks" if p.waiting_runs else "")
            + (f"; {p.blocks_cached:,} kept from finished runs for a prompt that starts the same way (a chat's "
               "next turn), given back when a run needs them" if p.blocks_cached else "") + ".")


def kv_formula(info, positions: int | None = None, measured_bytes: int | None = None) -> str:
    """_kv_formula, each term marked with its definition (ui/glossary)."""
    return gloss(_kv_formula(info, positions, measured_bytes))


def _kv_formula(info, positions: int | None = None, measured_bytes: int | None = None) -> str:
    """The cache's formula with this model's numbers. measured_bytes: a step's cache use as the
    engine measured it (the positions it holds: the prompt and every token but the newest, not
    yet fed back); else positions, counted here (a server does not say what one request holds).
    Bytes per value are left as b where nothing says (remote/metrics.kv_bytes_per_value)."""
    cfg, b = info.cfg, info.kv_value_bytes
    if cfg is None:
        return "**KV cache** = 2 × layers × KV heads × head dim × bytes per value × positions. " + NO_CONFIG
    dims = f"2 × {cfg.n_layers} × {cfg.n_kv_heads} × {cfg.head_dim}"
    if b is None:
        return (f"**KV cache** = {dims} × b × positions = **{2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim:,} × b "
                f"bytes per position**, b = bytes per value: {info.kv_value_bytes_source}.")
    per = info.kv_bytes_per_position
    text = (f"**KV cache** = 2 × layers × KV heads × head dim × bytes per value × positions = "
            f"{dims} × {b} × positions = **{per:,} bytes per position**")
    if not info.capabilities.measured_kv:
        text += f" ({b} bytes per value: {info.kv_value_bytes_source})"
    if measured_bytes:
        text += f"; × {count(measured_bytes // per, 'position')} held = {measured_bytes:,} bytes ({mib(measured_bytes)})"
    elif positions:
        text += (f"; × {count(positions, 'position')} this run holds = {mib(per * positions)}, by the "
                 "formula (the server does not say what one request holds)")
    return text


def server_load_markdown(load=None, error: str | None = None) -> str:
    """The whole server's numbers, from its /metrics: every request on it, not only this page's."""
    at = time.strftime("%H:%M:%S")
    if error is not None:
        return f"**The whole server** ({at}): its /metrics did not answer: {html.escape(error)}"
    usage = "not published" if load.kv_cache_usage is None else f"{100 * load.kv_cache_usage:.1f}% in use"
    pool = ""
    if load.pool_tokens:
        pool = f" of {load.pool_tokens:,} positions" + (f" ({mib(load.pool_bytes)})" if load.pool_bytes else "")
    running = "–" if load.running is None else load.running
    waiting = "–" if load.waiting is None else load.waiting
    return (f"**The whole server** (every request on it, not only this page's; its /metrics at {at}): "
            f"KV cache {usage}{pool} · {running} requests running · {waiting} waiting")
