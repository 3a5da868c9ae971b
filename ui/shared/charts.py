"""The run's charts' data, wherever a run is on view: the KV cache and the decode latency per
step (the run section's), the chosen token's probability, its rank and the raw entropy per step
(the sampling experiments'); and the colours of those with more than one line. Pure functions
of a run's record; a chart without a row gets None (line_frame), and keeps what it shows."""

from __future__ import annotations

import math

import pandas as pd

from ui.format import line_frame, plotted_p, shown_prob
from ui.run_state import RunRecord
from ui.widgets import line_colors


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


def run_chart_frames(rec: RunRecord) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The per-step probabilities (the chosen token's; under a constraint the masked mass), on
    an axis from 0 to 1, and the chosen token's rank."""
    rows = []
    for s in rec.steps:  # a number the engine does not know (None) is left out, not drawn as 0
        if shown_prob(s) is not None:
            rows.append({"step": s.step, "value": plotted_p(shown_prob(s)), "metric": "chosen-token probability"})
        if rec.params is not None and rec.params.constraint and s.masked_mass is not None:
            rows.append({"step": s.step, "value": plotted_p(s.masked_mass), "metric": "masked mass (constraint)"})
    ranks = line_frame([{"step": s.step, "rank": s.rank} for s in rec.steps if s.rank is not None], "rank")
    return line_frame(rows, "value", "metric"), ranks


# The rank axis spans at least this many ranks from 0: Vega-Lite's ticks over a shorter span fall
# between whole ranks (1.5, 2.5), which no rank is.
RANK_SPAN = 10


def rank_axis(frame: pd.DataFrame | None) -> list[int]:
    """The rank chart's y axis, [0, end]: whole-number ticks (at least RANK_SPAN, and a tenth above
    the largest rank, so that the line stays off the top edge: a set end is not rounded out)."""
    top = 1 if frame is None or frame.empty else int(frame["rank"].max())
    return [0, max(RANK_SPAN, math.ceil(top * 1.1) + 1)]


def entropy_frame(rec: RunRecord) -> pd.DataFrame:
    """The raw entropy per step, in nats: its own chart, as its unit is not a probability's (3
    decimals, as the compare table gives a mean entropy)."""
    return line_frame([{"step": s.step, "nats": round(s.entropy, 3)} for s in rec.steps if s.entropy is not None],
                      "nats")


def charts(frames: dict) -> dict:
    """The charts that have data: one without (line_frame's None) keeps what it shows, never
    emptied (an emptied chart is redrawn without data: Vega's "Infinite extent" warnings)."""
    return {name: frame for name, frame in frames.items() if frame is not None}


def chart_colors(rec: RunRecord | None) -> dict:
    """The colours of the run's charts with more than one line, after their data (line_colors)."""
    if rec is None:
        return {}
    ended = rec.done is not None
    return {"kv_chart": line_colors(kv_frame(rec), "series", ended),
            "run_chart": line_colors(run_chart_frames(rec)[0], "metric", ended)}
