"""How a benchmark peer in a process of its own answers bench/run.py's PeerProcess: one JSON line
when ready (after a warm-up round), then one JSON line per "round" line read. Plain Python only:
the llama.cpp peer runs it in its own virtual environment."""

import json
import sys


def serve(measure, ready: dict) -> int:
    measure()  # warm-up: the first passes pay one-time costs
    print(json.dumps({"ready": True, **ready}), flush=True)
    for line in sys.stdin:
        if line.strip() != "round":
            break
        print(json.dumps(measure()), flush=True)
    return 0
