"""Chapter 6, Sampling: from this step's logits to the token appended, through the run's own
stages (sampling/stages.py): temperature's effect as a table, greedy, top-k, the top-p walk, and
the repetition penalty on the prompt's tokens."""

from __future__ import annotations

import torch

from inference.sampling.penalties import apply_repetition_penalty
from inference.sampling.stages import stages
from inference.sampling.state import RunState

TEMPERATURES = (0.1, 1.0, 2.0)
# Where the run leaves a stage off, the lesson shows it at these values, and says so.
SHOWN_TOP_K = 50
SHOWN_TOP_P = 0.9
SHOWN_PENALTY = 1.3


def _before(logits: torch.Tensor, params, state, stage: str) -> torch.Tensor:
    """The logits entering `stage`, after the run's stages that come before it."""
    for name, _, fn in stages(params, state):
        if name == stage:
            return logits
        logits = fn(logits)
    return logits


def sampling(logits: torch.Tensor, params, prompt_ids: list[int], tokenizer, step, top: int) -> dict:
    """logits: (vocab,) float32 of this step; params: the run's SamplingParams; step: the run's
    first StepEvent (the token it appended, and the final probabilities of its top candidates)."""
    piece = tokenizer.piece
    logits = logits.float().cpu()
    vocab = logits.shape[-1]
    state = RunState.at(params, prompt_ids, [], vocab, params.seed or 0, tokenizer=tokenizer)
    raw = logits.double().softmax(-1)
    order = raw.topk(top).indices.tolist()
    table = {t: (logits.double() / t).softmax(-1) for t in TEMPERATURES}
    temperature_table = [{"id": i, "piece": piece(i), "logit": float(logits[i]),
                          **{f"T={t:g}": float(table[t][i]) for t in TEMPERATURES}} for i in order]

    k = params.top_k if params.top_k > 0 else SHOWN_TOP_K
    probs_k = _before(logits, params, state, "top_k").double().softmax(-1)
    kept_k = probs_k.topk(min(k, vocab))

    # Top-p: the distribution entering the stage (the run's earlier stages: penalties, temperature,
    # top-k), its candidates most likely first, accumulated until the mass before one reaches P.
    p = params.top_p if params.top_p < 1.0 else SHOWN_TOP_P
    entering = logits if params.greedy else _before(logits, params, state, "top_p")
    probs_p = entering.double().softmax(-1)
    values, ids = probs_p.sort(descending=True)
    walk, mass = [], 0.0
    for v, i in zip(values.tolist(), ids.tolist()):
        if mass >= p:
            walk.append({"id": i, "piece": piece(i), "prob": v, "cumulative": mass + v, "kept": False})
            break  # the first candidate left out ends the walk
        mass += v
        walk.append({"id": i, "piece": piece(i), "prob": v, "cumulative": mass, "kept": True})
    for row in walk:
        row["renormalised"] = row["prob"] / mass if row["kept"] else 0.0

    penalty = params.repetition_penalty if params.repetition_penalty != 1.0 else SHOWN_PENALTY
    penalised = apply_repetition_penalty(logits, penalty, state.seen)
    # Every token the prompt holds (each once), most likely first: the tokens the penalty acts on.
    seen = sorted(set(prompt_ids), key=lambda i: -float(logits[i]))
    pen_probs = penalised.double().softmax(-1)
    penalty_rows = [{"id": i, "piece": piece(i), "logit": float(logits[i]), "penalised_logit": float(penalised[i]),
                     "prob": float(raw[i]), "penalised_prob": float(pen_probs[i])} for i in seen[:top]]
    greedy = int(logits.argmax())
    return {"temperatures": list(TEMPERATURES), "temperature_table": temperature_table,
            "settings": {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
                         "repetition_penalty": params.repetition_penalty, "seed": params.seed},
            "greedy": {"id": greedy, "piece": piece(greedy), "prob": float(raw[greedy])},
            "top_k": {"k": k, "shown_only": params.top_k <= 0,
                      "kept_mass": float(kept_k.values.sum()), "last_kept": piece(int(kept_k.indices[-1]))},
            "top_p": {"p": p, "shown_only": params.top_p >= 1.0, "kept": sum(r["kept"] for r in walk),
                      "kept_mass": mass, "walk": walk},
            "repetition_penalty": {"penalty": penalty, "shown_only": params.repetition_penalty == 1.0,
                                   "rule": "a seen token's logit is divided by the penalty if positive, multiplied if negative",
                                   "rows": penalty_rows, "seen": len(seen)},
            "chosen": {"id": step.token_id, "piece": step.piece, "prob": step.prob, "raw_prob": step.raw_prob,
                       "rank": step.rank},
            "final_top": [{"id": c.id, "piece": c.piece, "raw_prob": c.raw_prob, "prob": c.prob} for c in step.top]}
