"""How a benchmark peer in a process of its own answers bench/peers.py's PeerProcess: one JSON line
when ready (after a warm-up round), then one JSON line per "round" line read ("round 8": a round
with the argument 8, e.g. the number of users). Plain Python only: the llama.cpp peers run it in
their own virtual environment."""

import json
import sys


def serve(measure, ready: dict, warm_up=()) -> int:
    """measure(*warm_up) first: the first passes pay one-time costs (and a build that crashes
    crashes before it says it is ready); `ready` may be a function of nothing, called after it."""
    measure(*warm_up)
    print(json.dumps({"ready": True, **(ready() if callable(ready) else ready)}), flush=True)
    for line in sys.stdin:
        word, *args = line.split() or [""]
        if word != "round":
            break
        print(json.dumps(measure(*map(int, args))), flush=True)
    return 0
