"""Constrained output: a JSON schema, a regular expression or a grammar (EBNF), as one stage.

xgrammar (the library vLLM and SGLang use) compiles the constraint against the model's
vocabulary (the bytes each token stands for, tokenizer.py's table) and, per run, a matcher
gives the tokens the constraint allows at each step. The matcher lives in the run's RunState
and takes each sampled token in RunState.advance; replay rebuilds it from the tokens before
the step. The stage sets the logits of forbidden tokens to -inf; where it runs is its place in
the sampler order (by default last, after the user's stages).
"""

from __future__ import annotations

import re
from functools import lru_cache

import torch

from inference.errors import InputError
from inference.sampling.registry import stage
from inference.sampling.settings import CONSTRAINT_KINDS as KINDS, MAX_CONSTRAINT_CHARS
# Compiled constraints are kept per vocabulary by xgrammar's cache, at most this many bytes
# (least recently used first out): a schema seen again is not compiled again.
COMPILED_CACHE_BYTES = 64 << 20
_LOCATION = re.compile(r"^\[[\d:]+\] \S+?:\d+: (Check failed: .*? is false: )?")


def _xgr():
    import xgrammar  # about 2.5 s to import: only runs that ask for a constraint pay it
    return xgrammar


def _message(kind: str, error: Exception) -> str:
    """xgrammar's error as one line: its source location dropped, its first line kept."""
    text = _LOCATION.sub("", str(error).strip()).split("\n")[0].strip()
    text = text if len(text) <= 200 else text[:200] + "…"
    return f"constraint_text is not a valid {KINDS[kind][0]}: {text}"


@lru_cache(maxsize=64)
def check(kind: str, text: str) -> None:
    """Parse the constraint (no vocabulary needed); a one-line InputError if it is invalid."""
    if kind not in KINDS:
        raise InputError(f"constraint must be one of {', '.join(KINDS)} or empty, got {kind!r}")
    if not text.strip():
        raise InputError(f"constraint_text is empty: give the {KINDS[kind][0]}")
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise InputError(f"the {KINDS[kind][0]} is {len(text):,} characters; at most {MAX_CONSTRAINT_CHARS:,}")
    g = _xgr().Grammar
    parse = {"json_schema": g.from_json_schema, "regex": g.from_regex, "grammar": g.from_ebnf}[kind]
    try:
        parse(text)
    except Exception as e:  # xgrammar raises RuntimeError or ValueError with its parser's message
        raise InputError(_message(kind, e)) from None


@lru_cache(maxsize=4)
def _compiler(tokenizer, vocab: int):
    """One compiler per vocabulary: xgrammar's view of it (the raw bytes of every token; control
    tokens are never text, the end-of-sequence ids end a complete constraint) and its cache."""
    x = _xgr()
    encoded = [b"" if tokenizer.is_control(i) else b for i, b in enumerate(tokenizer.token_bytes[:vocab])]
    info = x.TokenizerInfo(encoded, x.VocabType.RAW, vocab_size=vocab, stop_token_ids=list(tokenizer.eos_ids))
    return x.GrammarCompiler(info, max_threads=2, cache_limit_bytes=COMPILED_CACHE_BYTES)


def compile_constraint(kind: str, text: str, tokenizer, vocab: int):
    """The compiled constraint for this vocabulary, from the cache when seen before."""
    check(kind, text)
    if tokenizer is None:
        raise InputError("a constraint needs the model's tokenizer")
    c = _compiler(tokenizer, vocab)
    compile_ = {"json_schema": c.compile_json_schema, "regex": c.compile_regex, "grammar": c.compile_grammar}[kind]
    try:
        return compile_(text)
    except Exception as e:
        raise InputError(_message(kind, e)) from None


class Matcher:
    """One run's place in its constraint: the tokens allowed at this step, and the token taken."""

    def __init__(self, compiled, vocab: int):
        x = _xgr()
        self._m = x.GrammarMatcher(compiled)
        self._bits = x.allocate_token_bitmask(1, vocab)  # (1, ceil(vocab / 32)) int32
        self._shifts = torch.arange(32, dtype=torch.int32)
        self.vocab = vocab
        self.allowed = self._fill()

    def _fill(self) -> torch.Tensor:
        """(vocab,) bool: the tokens the constraint allows now (bit j of word w is token 32w + j)."""
        self._m.fill_next_token_bitmask(self._bits)
        bits = (self._bits[0, :, None] >> self._shifts) & 1  # (words, 32)
        return bits.reshape(-1)[:self.vocab].bool()  # (vocab,)

    def accept(self, token: int) -> bool:
        """Take the sampled token; False (and nothing changes) if the constraint forbids it."""
        if not self._m.accept_token(token):
            return False
        self.allowed = self._fill() if not self._m.is_terminated() else torch.zeros(self.vocab, dtype=torch.bool)
        return True

    @property
    def terminated(self) -> bool:
        """An end-of-sequence token ended the constraint: the run ends."""
        return self._m.is_terminated()

    @property
    def complete(self) -> bool:
        """The text so far is a whole match (an end-of-sequence token may end it here)."""
        return self._m.is_completed()


def matcher(kind: str, text: str, tokenizer, vocab: int, generated: list[int]) -> Matcher:
    """A run's matcher entering the step after `generated` (a run's start, or a replayed step's):
    the tokens before are taken again, in order."""
    m = Matcher(compile_constraint(kind, text, tokenizer, vocab), vocab)
    for i, token in enumerate(generated):
        if not m.accept(token):
            raise InputError(f"the {KINDS[kind][0]} does not allow token {i} of the output "
                             f"({tokenizer.piece(token)!r}): replay this step with the run's constraint")
    return m


@stage("constraint")
def apply_constraint(logits: torch.Tensor, params, state) -> torch.Tensor:
    """Forbidden tokens (the run's matcher's mask) -> -inf. (vocab,) -> (vocab,)"""
    if not params.constraint or state is None or state.constraint is None:
        return logits
    return logits.masked_fill(~state.constraint.allowed.to(logits.device), float("-inf"))
