"""The names of the components a run's events set, which several sections' events set alike: a
run streaming (RUN_OUTPUTS), a new run clearing the last one's panels (STALE_PANELS), and an
ended run put on view again (SHOWN). Names only: each section owns its components."""

from __future__ import annotations

from inference.sampling.settings import SHAPING_SETTINGS
from ui.controls import NAMES

# What a run streams, in /generate's output order: output, bars, statistics, KV formula,
# notice, status, step slider, the tokens (for API clients, complete in the last update), the
# run's record.
RUN_OUTPUTS = ("output", "bars", "stats", "kv_text", "notice", "status", "step", "api_tokens", "record")
# Panels that show results about the previous run; a new run clears them.
STALE_PANELS = ("replay_md", "replay_bars", "x_md", "stages_md", "attention", "lens", "pattern")
# What a run put on view again sets (Runs.show): its panels and the controls.
SHOWN = ("output", "bars", "stats", "kv_text", "notice", "status", "step", "record", "kv_chart", "latency",
         "run_chart", "rank_chart", "entropy_chart", "tokens", "downloads", "run_seed", "prompt_view",
         *(f"replay_{n}" for n in SHAPING_SETTINGS), *NAMES)
