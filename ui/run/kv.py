"""The KV-cache panel: per-step memory, this run's blocks of the paged pool, the formula with
this model's numbers, and in front of a server the whole server's load."""

from __future__ import annotations

import html
import time

import pandas as pd

from inference.events import StepEvent
from inference.model.kv_cache import BLOCK_SIZE
from ui.format import count, line_frame, mib
from ui.run.render import NO_CONFIG
from ui.glossary import gloss
from ui.run_state import RunRecord


# Step 0's cache holds the prompt: its prefill is the first point's height, not a step of its own.
KV_X_TITLE = "step (step 0: after the prompt's prefill)"
# Step 0 is the prefill's (the statistics give its time): the chart starts at step 1.
LATENCY_X_TITLE = "step (one decode pass each)"
LATENCY_Y_TITLE = "time per token (ms)"


def kv_frame(rec: RunRecord) -> pd.DataFrame:
    """KV-cache MiB per step: used (the prompt at step 0, then one position per step) and
    allocated. In front of a server, which does not say what one request holds: this run's
    positions times the formula's bytes per position, where the model's config is known."""
    rows = []
    if rec.steps and rec.steps[0].kv_cache_bytes is None:
        per, n = rec.kv_bytes_per_token, len(rec.prompt_ids)
        if per:
            rows = [{"step": s.step, "MiB": per * (n + s.step) / 2**20, "series": "this run, by the formula"}
                    for s in rec.steps]
        return line_frame(rows, "MiB", "series")
    series = {"used": [s.kv_cache_bytes for s in rec.steps],
              "allocated": [s.kv_cache_capacity_bytes for s in rec.steps]}
    if rec.steps and all(s.pool is not None for s in rec.steps):
        series["server pool, all runs"] = [s.pool.bytes_used for s in rec.steps]
    for name, values in _merged(series).items():
        rows += [{"step": s.step, "MiB": v / 2**20, "series": name} for s, v in zip(rec.steps, values)]
    return line_frame(rows, "MiB", "series")


def _merged(series: dict[str, list]) -> dict[str, list]:
    """Series equal at every step drawn as one line named after all of them ("allocated =
    server pool, all runs" while this run is the pool's only one): a line hidden under another
    would leave a legend entry with nothing to see."""
    out: dict[str, list] = {}
    for name, values in series.items():
        same = next((n for n, v in out.items() if v == values), None)
        if same is None:
            out[name] = values
        else:
            out[f"{same} = {name}"] = out.pop(same)
    return out


def latency_frame(rec: RunRecord) -> pd.DataFrame:
    # A tenth of a ms (the tooltip's digits): finer is timer noise.
    return line_frame([{"step": s.step, "ms": round(s.ms, 1)} for s in rec.steps[1:]], "ms")


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
