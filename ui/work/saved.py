"""What the browser keeps of a tab's work, as JSON, and how it is read back: the controls, the
conversation, the runs of the branch tree and the run on view (each as its controls, seed,
conversation, ids and events). A run read back is prepared again from its controls, as
Generate would, so that a saved run whose prompt no longer gives the same ids here (another
model, another tokenizer) is refused, never shown with the wrong tokens. Pure functions, no Gradio."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict

from inference.errors import InputError
from inference.events import Candidate, DoneEvent, PoolStats, StepEvent
from ui.controls import NAMES
from ui.run_state import RunRecord

VERSION = 1
# The most characters of JSON the work may take in the browser's storage (about 5 MB an origin
# in chromium; the page stores it encrypted, a third larger). A tree that would not fit is
# saved without its other branches, and the page says so.
MAX_CHARS = 2_000_000


def controls_json(values) -> dict:
    """The page's controls by name, as the browser keeps them."""
    return dict(zip(NAMES, values))


# What a constraint cost can be infinite (KL, the log p in the free distribution), which JSON cannot
# say: the page's messages would carry null. Kept as text ("inf", "-inf") and read back as numbers.
INFINITE = ("constraint_kl", "logprob", "free_logprob")


def _kept(d: dict) -> dict:
    return {k: (str(v) if k in INFINITE and isinstance(v, float) and math.isinf(v) else v) for k, v in d.items()}


def _read(d: dict) -> dict:
    return {k: (float(v) if k in INFINITE and v in ("inf", "-inf") else v) for k, v in d.items()}


def run_json(rec: RunRecord) -> dict:
    return {"controls": controls_json(rec.controls.values()), "seed": rec.seed, "history": list(rec.history),
            "prompt_ids": list(rec.prompt_ids), "given": list(rec.given),
            "steps": [_kept(asdict(s)) for s in rec.steps], "done": _kept(asdict(rec.done))}


def work_json(rec: RunRecord | None, nodes: list[dict], history: list) -> tuple[dict, str]:
    """The work as JSON, and a line on what it holds. Runs are listed once: the tree's, and the
    run on view (`view`, an index into them)."""
    runs, index = [], {}

    def keep(r: RunRecord) -> int:
        if id(r) not in index:
            index[id(r)] = len(runs)
            runs.append(run_json(r))
        return index[id(r)]

    ended = [n for n in nodes if n["record"] is not None and n["record"].done is not None]
    tree = [{**{k: n[k] for k in ("parent", "at", "token", "piece", "raw", "final", "prefix")},
             "run": keep(n["record"])} for n in ended] if len(ended) == len(nodes) else []
    view = keep(rec) if saveable(rec) else None
    data = {"v": VERSION, "history": list(history or []), "runs": runs, "view": view, "tree": tree}
    size = len(json.dumps(data))
    if size > MAX_CHARS and tree:  # the run on view alone
        data = {**data, "runs": [runs[view]] if view is not None else [], "view": 0 if view is not None else None,
                "tree": []}
        left = len(json.dumps(data))
        note = (f"the branch tree ({size / 1e6:.1f} MB) is too large for the browser's storage: "
                f"only the run on view is kept")
        size = left
    else:
        note = ""
    if size > MAX_CHARS:
        data = {**data, "runs": [], "view": None, "tree": []}
        note = f"the run on view ({size / 1e6:.1f} MB) is too large for the browser's storage: it is not kept"
    return data, summary(data, note)


def saveable(rec: RunRecord | None) -> bool:
    return rec is not None and rec.done is not None and rec.controls is not None


def summary(data: dict, note: str = "") -> str:
    """One line: what the browser keeps now."""
    parts = ["the settings"]
    turns = len(data.get("history") or []) // 2
    if turns:
        parts.append(f"{turns} chat turn{'s' * (turns != 1)}")
    if data.get("view") is not None:
        parts.append("the run on view")
    if len(data.get("tree") or []) > 1:
        parts.append(f"a tree of {len(data['tree'])} branches")
    text = "Kept in this browser: " + ", ".join(parts) + "."
    return text + (f" Not kept: {note}." if note else "")


def step_from_json(d: dict) -> StepEvent:
    d = _read(d)
    pool, removed = d.get("pool"), d.get("constraint_removed")
    return StepEvent(**{**d, "top": [Candidate(**c) for c in d["top"]],
                        "pool": PoolStats(**pool) if pool else None,
                        "constraint_removed": None if removed is None else [Candidate(**c) for c in removed]})


def read_run(data: dict, prepare, vocab: int) -> RunRecord:
    """A saved run, prepared again (prepare(controls dict, seed, history) -> RunRecord, as
    Generate prepares a run) with its events; InputError in one line if it cannot be shown here."""
    try:
        rec = prepare(data["controls"], data["seed"], list(data["history"]))
        steps = [step_from_json(s) for s in data["steps"]]
        done = DoneEvent(**_read(data["done"]))
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"the saved run could not be read ({type(e).__name__})") from None
    if rec.prompt_ids != data["prompt_ids"] or rec.given != data["given"]:
        raise InputError("the saved run's prompt gives other tokens here (another model or tokenizer)")
    if any(not 0 <= t < vocab for s in steps for t in (s.token_id, *(c.id for c in s.top))):
        raise InputError("the saved run holds token ids this model does not have")
    rec.steps, rec.done = steps, done
    rec.queued_at = rec.started_at = time.monotonic()
    rec.finished = True
    return rec
