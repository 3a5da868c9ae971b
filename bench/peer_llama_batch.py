"""llama.cpp decoding many sequences in one batch, for bench.users: llama-cpp-python's low-level API
(one llama_batch a step, a token and a sequence id for every user, llama_decode once, greedy per
sequence from llama_get_logits_ith), in a process of its own and its own virtual environment, as
bench/peer_llama_cpp.py. (llama-cpp-python's server answers one request at a time: it is not this.)

    LLAMA_PYTHON bench/peer_llama_batch.py FILE.gguf IDS.json TOKENS THREADS SEQS [--build native] [--one-token]

IDS.json holds one prompt's ids per user (at least SEQS), our tokenizer's. After a warm-up of SEQS
sequences at once it runs each prompt alone, then prints one JSON line: the build, and each
prompt's ids alone (what the batched runs are compared with). Then "round N" lines: users 0..N-1
at once, their prompts in one batch (--one-token: one token of one prompt a decode), then one
batch of N tokens a step until each has TOKENS tokens or an end-of-generation token; one JSON line
per round: each user's tokens, time to first token, decode time and ids, the round's wall time and
its median step.
"""

from __future__ import annotations

import ctypes
import json
import statistics
import time

from peer_llama_cpp import args_of, build_info  # beside this file
from peer_protocol import serve

_QUIET = None  # the log callback, kept alive as long as llama.cpp may call it


def open_model(a, seqs: int, ctx_per_seq: int, prompt_tokens: int):
    """The model and a context of `seqs` sequences, each with room for ctx_per_seq positions, whose
    batch holds every prompt at once (--one-token: a token a sequence, a step's batch)."""
    import llama_cpp

    global _QUIET
    _QUIET = llama_cpp.llama_log_callback(lambda level, text, user: None)
    llama_cpp.llama_log_set(_QUIET, ctypes.c_void_p())
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(a.gguf.encode(), llama_cpp.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {a.gguf}")
    p = llama_cpp.llama_context_default_params()
    p.n_seq_max, p.n_ctx = seqs, seqs * ctx_per_seq
    p.n_batch = seqs if a.one_token else max(prompt_tokens, seqs)
    p.n_ubatch = min(p.n_batch, 512)  # llama.cpp's default: a longer batch runs in pieces of 512
    p.n_threads = p.n_threads_batch = a.threads
    return model, llama_cpp.llama_init_from_model(model, p)


class Batch:
    """A llama_batch filled an entry at a time: token, position, sequence, whether its logits are wanted."""

    def __init__(self, capacity: int):
        import llama_cpp
        self.b = llama_cpp.llama_batch_init(capacity, 0, 1)

    def fill(self, entries: list[tuple[int, int, int, bool]]) -> None:
        for i, (token, pos, seq, logits) in enumerate(entries):
            self.b.token[i], self.b.pos[i], self.b.n_seq_id[i] = token, pos, 1
            self.b.seq_id[i][0], self.b.logits[i] = seq, logits
        self.b.n_tokens = len(entries)


def main() -> int:
    import llama_cpp
    import numpy as np

    a = args_of(extra=("seqs",))
    seqs = int(a.seqs)
    prompts = json.loads(open(a.ids).read())[:seqs]
    model, ctx = open_model(a, seqs, max(map(len, prompts)) + a.tokens + 1, sum(map(len, prompts)))
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    batch = Batch(llama_cpp.llama_n_batch(ctx))

    def decode(entries) -> None:
        batch.fill(entries)
        if llama_cpp.llama_decode(ctx, batch.b) != 0:
            raise RuntimeError("llama_decode failed")

    def greedy(i: int) -> int:
        """The most likely token of the batch's i-th entry (the first of equals)."""
        return int(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).argmax())

    def run(which: list[int]) -> dict:
        """The prompts `which` at once, sequence s the s-th of them."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        given = [prompts[i] for i in which]
        new: list[list[int]] = [[] for _ in given]
        t0 = time.perf_counter()
        entries = [(tok, pos, s, pos == len(p) - 1) for s, p in enumerate(given) for pos, tok in enumerate(p)]
        if a.one_token:
            for e in entries:
                decode([e])
                if e[3]:  # a prompt's last token: its first new token
                    new[e[2]].append(greedy(0))
        else:
            decode(entries)
            for s, i in enumerate(i for i, e in enumerate(entries) if e[3]):
                new[s].append(greedy(i))
        first = time.perf_counter()
        last, steps = [first] * len(given), []

        def going(s: int) -> bool:
            return len(new[s]) < a.tokens and not llama_cpp.llama_vocab_is_eog(vocab, new[s][-1])

        active = [s for s in range(len(given)) if going(s)]
        while active:  # a step: one batch, a token of every sequence still going, and its picks
            decode([(new[s][-1], len(given[s]) + len(new[s]) - 1, s, True) for s in active])
            picks = [greedy(i) for i in range(len(active))]
            now = time.perf_counter()
            steps.append(1000 * (now - max(last)))
            for s, token in zip(active, picks):
                new[s].append(token)
                last[s] = now
            active = [s for s in active if going(s)]
        runs = [{"tokens": len(n), "ttft_s": first - t0, "decode_s": t - first, "text": n} for n, t in zip(new, last)]
        return {"runs": runs, "wall_s": time.perf_counter() - t0, "step_ms": statistics.median(steps) if steps else None}

    def ready() -> dict:  # each prompt alone: what every user's ids in a batch are compared with
        return {**build_info(a), "seqs": seqs, "alone": [run([s])["runs"][0]["text"] for s in range(seqs)]}

    return serve(lambda users: run(list(range(users))), ready, warm_up=(seqs,))


if __name__ == "__main__":
    raise SystemExit(main())
