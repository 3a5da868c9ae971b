"""transformers generate() measured in a process of its own: the peer runs as it does for its
users (its own threads and memory, nothing of ours loaded beside it), warmed up before the first
measurement. bench/run.py starts it once and asks for one round at a time, alternating with ours.

    python -m bench.peer_transformers MODEL_DIR TOKENS    # then one line "round" per measurement

Prints one JSON line when ready, then one per round: TTFT at 128 and 512 prompt tokens (a
1-token generation) and decode tok/s (the extra time of TOKENS tokens over one).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.peer_protocol import serve  # noqa: E402
from bench.prompts import prompt_ids  # noqa: E402
from inference.loading.load import load_tokenizer  # noqa: E402


def main() -> int:
    import transformers

    model_dir, tokens = Path(sys.argv[1]), int(sys.argv[2])
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(model_dir)  # ours tokenizes the same prompt ids as the engine reads

    def run(ids: list[int], new: int) -> float:
        x = torch.tensor([ids])
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(x, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
        return time.perf_counter() - t

    def measure() -> dict:
        out = {f"ttft_{n}_ms": 1000 * run(prompt_ids(tokenizer, n), 1) for n in (128, 512)}
        ids = prompt_ids(tokenizer, 32)
        one, full = run(ids, 1), run(ids, tokens)
        out["decode_tok_s"] = (tokens - 1) / (full - one)
        out["p50_ms"] = out["p95_ms"] = None  # generate() gives no per-step times
        return out

    return serve(measure, {"threads": torch.get_num_threads()})


if __name__ == "__main__":
    raise SystemExit(main())
