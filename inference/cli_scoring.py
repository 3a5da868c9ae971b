"""`python -m inference tokenize`, `score` and `score-text`: a text's tokens and their
log-probabilities from the command line (inference/cli.py parses the flags and calls these)."""

from __future__ import annotations

import json

from inference.errors import InputError
from inference.factory import open_engine


def tokens_text(n: int) -> str:
    return f"{n} token" + ("" if n == 1 else "s")


def cmd_tokenize(args) -> int:
    with open_engine(args) as engine:
        tok = engine.tokenizer
        ids = tok.encode(args.text)
        print(json.dumps([{"id": i, "piece": tok.piece(i)} for i in ids], ensure_ascii=False))
    return 0


def cmd_score(args) -> int:
    import math

    with open_engine(args) as engine:
        scores = engine.score(engine.prompt_ids(args.prompt, args.chat), args.continuation)
    total = sum(lp for _, _, lp in scores)
    for i, piece, lp in scores:
        if args.jsonl:
            print(json.dumps({"token_id": i, "piece": piece, "logprob": lp, "prob": math.exp(lp)},
                             ensure_ascii=False))
        else:
            print(f"{i:>8}  {piece!r:<24} logp {lp:9.4f}  p {math.exp(lp):.4f}")
    if args.jsonl:
        print(json.dumps({"done": True, "tokens": len(scores), "sum_logprob": total,
                          "perplexity": math.exp(-total / len(scores))}))
    else:
        print(f"sum logp {total:.4f} over {tokens_text(len(scores))} (perplexity {math.exp(-total / len(scores)):.3f})")
    return 0


def cmd_score_text(args) -> int:
    from inference.events import perplexity

    if args.top < 0:
        raise InputError(f"--top must be >= 0, got {args.top}")
    with open_engine(args) as engine:
        ids, before = engine.text_ids(args.text)
        scores = engine.score_ids(ids, args.top)[before:]
    ppl = perplexity(scores)
    for sc in scores:
        if args.jsonl:
            print(json.dumps(sc.to_json(), ensure_ascii=False))
        else:
            # Below 1e-4 three significant digits, never 0.0000 (as the page shows them).
            p = "–" if sc.prob is None else f"{sc.prob:.4f}" if sc.prob >= 1e-4 else f"{sc.prob:.3g}"
            bits = "–" if sc.surprisal_bits is None else f"{sc.surprisal_bits:.3f}"
            top = "  ".join(f"{c.piece!r} {c.raw_prob:.4f}" for c in sc.top)
            print(f"{sc.id:>8}  {sc.piece!r:<24} p {p:>8}  rank {sc.rank if sc.rank is not None else '–':>6}  "
                  f"surprisal {bits} bits" + (f"  · preferred: {top}" if top else ""))
    scored = sum(sc.logprob is not None for sc in scores)
    if args.jsonl:
        print(json.dumps({"done": True, "tokens": len(scores), "scored": scored, "bos": bool(before),
                          "perplexity": ppl}))
    else:
        print(f"{tokens_text(len(scores))}, {scored} with a probability"
              + (" (after the BOS token the model adds)" if before else " (the first has nothing before it)")
              + (f"; perplexity {ppl:.3f}" if ppl is not None else ""))
    return 0
