"""A stand-in for llama-cpp-python, for the benchmark's peers (bench/peer_llama_cpp.py,
bench/peer_llama_batch.py) in tests: the same names they call, a toy model behind them.

The toy model: a sequence's next token is a hash of its tokens so far, so a batch gives each
sequence what it gets alone exactly when the peer keeps every sequence's tokens and positions
apart (a position out of order is an error, as llama_decode's). With FAKE_LLAMA_CRASH=1 a batch
holding several tokens of one sequence (a prompt evaluated at once) kills the process with
SIGSEGV, as the native build did on an Intel Xeon with AMX.
"""

import ctypes
import os
import signal
import zlib

__version__ = "0.0-fake"
VOCAB = 97
EOG = None  # no end-of-generation token: every run decodes all it is asked for

llama_log_callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


def _next(tokens: list[int]) -> int:
    return zlib.crc32(repr(tokens).encode()) % VOCAB


def _crash_if_a_prompt_is_batched(seqs: list[int]) -> None:
    if os.environ.get("FAKE_LLAMA_CRASH") == "1" and len(seqs) != len(set(seqs)):
        os.kill(os.getpid(), signal.SIGSEGV)


def llama_print_system_info() -> bytes:
    return b"CPU : FAKE = 1 |"


# ---------------------------------------------------------------- the high-level API (Llama)

class Llama:
    def __init__(self, path, n_ctx=512, n_threads=None, n_threads_batch=None, verbose=True, n_batch=512, n_ubatch=512):
        self.n_batch, self.tokens = n_batch, []

    def reset(self):
        self.tokens = []

    def eval(self, tokens):
        for i in range(0, len(tokens), self.n_batch):
            _crash_if_a_prompt_is_batched([0] * len(tokens[i:i + self.n_batch]))
            self.tokens += tokens[i:i + self.n_batch]

    def generate(self, tokens, temp=0.0, top_k=1):
        self.eval(list(tokens))
        while True:
            token = _next(self.tokens)
            yield token
            self.eval([token])


# ---------------------------------------------------------------- the low-level API

class _Params:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def llama_log_set(callback, user_data):
    pass


def llama_backend_init():
    pass


def llama_model_default_params():
    return _Params()


def llama_context_default_params():
    return _Params(n_ctx=512, n_batch=2048, n_ubatch=512, n_seq_max=1, n_threads=1, n_threads_batch=1, kv_unified=False)


def llama_model_load_from_file(path, params):
    return {"path": path}


class _Context:
    def __init__(self, params):
        self.params, self.seqs, self.logits = params, {}, []


def llama_init_from_model(model, params):
    return _Context(params)


def llama_model_get_vocab(model):
    return "vocab"


def llama_vocab_n_tokens(vocab):
    return VOCAB


def llama_vocab_is_eog(vocab, token):
    return token == EOG


def llama_n_batch(ctx):
    return ctx.params.n_batch


def llama_get_memory(ctx):
    return ctx


def llama_memory_clear(memory, data):
    memory.seqs = {}


class _Batch:
    def __init__(self, capacity):
        self.n_tokens = 0
        self.token, self.pos, self.n_seq_id, self.logits = ([0] * capacity for _ in range(4))
        self.seq_id = [[0] for _ in range(capacity)]


def llama_batch_init(n_tokens, embd, n_seq_max):
    return _Batch(n_tokens)


def llama_decode(ctx, batch):
    n = batch.n_tokens
    if n > ctx.params.n_batch or max(batch.seq_id[i][0] for i in range(n)) >= ctx.params.n_seq_max:
        return -1
    _crash_if_a_prompt_is_batched([batch.seq_id[i][0] for i in range(n)])
    ctx.logits = []
    for i in range(n):
        seq = ctx.seqs.setdefault(batch.seq_id[i][0], [])
        if batch.pos[i] != len(seq):
            return -1
        seq.append(batch.token[i])
        if batch.logits[i]:
            row = (ctypes.c_float * VOCAB)()
            row[_next(seq)] = 1.0
            ctx.logits.append((i, row))
    return 0


def llama_get_logits_ith(ctx, i):
    row = dict(ctx.logits)[i]
    return ctypes.cast(row, ctypes.POINTER(ctypes.c_float))
