"""Constrained output: a JSON schema, a regular expression or a grammar (EBNF), as one stage.

xgrammar (the library vLLM and SGLang use) compiles the constraint against the model's
vocabulary (the bytes each token stands for, tokenizer.py's table) and, per run, a matcher
gives the tokens the constraint allows at each step. The matcher lives in the run's RunState
and takes each sampled token in RunState.advance; replay rebuilds it from the tokens before
the step. The stage sets the logits of forbidden tokens to -inf; where it runs is its place in
the sampler order (by default first, as vLLM and llama.cpp apply the mask: the cutoffs then
choose among the allowed tokens). An order that puts a stage before it can leave no allowed
token: `emptied_by` names the stage that removed the last one.
"""

from __future__ import annotations

import json
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


# A message quotes at most this many characters of the text (a rule's or a type's name): the
# text can be a file's (the CLI's --json-schema PATH), which is never echoed back. The page quotes
# none of it (ConstraintError.unquoted): the text is in its box, the message says where.
QUOTED = 12
_QUOTE = re.compile(r'"([^"]*)"')
_DUMP = re.compile(r"[\s.]*(The JSON string is:|near:).*", re.S)  # xgrammar's copy of the text itself
# The deepest a JSON schema nests (objects and arrays): xgrammar's compile time grows with depth
# (a schema of 1,700 nested "items" compiled for minutes), and Python's parser stops near 1,000.
MAX_SCHEMA_DEPTH = 64


class ConstraintError(InputError):
    """A constraint that is not valid, in one line; `unquoted`: the same without any of the text."""

    def __init__(self, message: str, unquoted: str | None = None):
        super().__init__(message, field="constraint_text")
        self.unquoted = unquoted or message


def _message(kind: str, error: Exception) -> ConstraintError:
    """xgrammar's error as one line: its source location and its copy of the text dropped, its
    first line kept, each quoted name cut to QUOTED characters."""
    text = _DUMP.sub("", _LOCATION.sub("", str(error).strip()).split("\n")[0].strip())
    text = text if len(text) <= 200 else text[:200] + "…"
    head = f"constraint_text is not a valid {KINDS[kind][0]}: "
    short = _QUOTE.sub(lambda m: '"' + (m[1] if len(m[1]) <= QUOTED else m[1][:QUOTED] + "…") + '"', text)
    return ConstraintError(head + short, head + _QUOTE.sub('"…"', text))


@lru_cache(maxsize=64)
def check(kind: str, text: str) -> None:
    """Parse the constraint (no vocabulary needed); a one-line InputError if it is invalid."""
    if kind not in KINDS:
        raise InputError(f"constraint must be one of {', '.join(KINDS)} or empty, got {kind!r}")
    if not text.strip():
        raise InputError(f"constraint_text is empty: give the {KINDS[kind][0]}")
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise InputError(f"the {KINDS[kind][0]} is {len(text):,} characters; at most {MAX_CONSTRAINT_CHARS:,}")
    if kind == "json_schema":
        _check_keywords(_schema(text))
    c = _bytes_compiler()
    compile_ = {"json_schema": c.compile_json_schema, "regex": c.compile_regex, "grammar": c.compile_grammar}[kind]
    try:
        compiled = compile_(text)
    except Exception as e:  # xgrammar raises RuntimeError or ValueError with its parser's message
        raise _message(kind, e) from None
    # Over single bytes every text can be spelled: nothing allowed at the start means no text.
    start = Matcher(compiled, BYTES + 1)
    if not start.allowed[:BYTES].any():
        raise InputError(f"the {KINDS[kind][0]} matches {'only the empty text' if start.allowed[BYTES] else 'no text'}: "
                         "a run could write nothing it allows", field="constraint_text")


BYTES = 256


@lru_cache(maxsize=1)
def _bytes_compiler():
    """A compiler over a vocabulary of the 256 single bytes and one end-of-sequence token: the
    constraint checked without a model."""
    x = _xgr()
    info = x.TokenizerInfo([bytes([i]) for i in range(BYTES)] + [b""], x.VocabType.RAW, vocab_size=BYTES + 1,
                           stop_token_ids=[BYTES])
    return x.GrammarCompiler(info, max_threads=1, cache_limit_bytes=COMPILED_CACHE_BYTES // 8)


# JSON-schema keywords xgrammar does not enforce (it would let text through that the schema
# forbids) or enforces too strictly (forbids text the schema allows): either way the run would not
# be the schema's, so they are refused. Probed against xgrammar 0.2 by a schema and an instance
# each (tests/sampling/test_constrain.py shows each kind).
UNENFORCED = ("not", "uniqueItems", "dependentRequired", "dependentSchemas", "dependencies", "if", "then", "else",
              "contains", "minContains", "maxContains", "contentEncoding", "contentMediaType", "contentSchema",
              "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor")


def _schema(text: str):
    """The schema's JSON, nesting at most MAX_SCHEMA_DEPTH levels; a ConstraintError saying where
    the JSON breaks (never what it says there) or how deep it nests."""
    deep = f"constraint_text nests deeper than {MAX_SCHEMA_DEPTH} levels of objects and arrays: flatten the schema"
    try:
        schema = json.loads(text)
    except RecursionError:
        raise ConstraintError(deep) from None
    except ValueError as e:
        where = f" (line {e.lineno}, column {e.colno})" if isinstance(e, json.JSONDecodeError) else ""
        raise ConstraintError(f"constraint_text is not a valid JSON schema: it is not JSON "
                              f"({getattr(e, 'msg', 'not a JSON text')}{where})") from None
    stack = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise ConstraintError(deep)
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return schema


def _check_keywords(schema) -> None:
    """Refuse a schema that uses a keyword xgrammar does not enforce exactly: UNENFORCED, allOf
    of more than one schema, and oneOf whose branches may overlap (enforced as anyOf)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key in UNENFORCED:
            if key in node:
                raise InputError(f"constraint_text uses {key!r}, which the constraint library (xgrammar) does not "
                                 "enforce exactly: the run would not be the schema's; leave it out")
        if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
            raise InputError("constraint_text uses 'allOf' of several schemas, which xgrammar does not enforce "
                             "(it would let text through that one of them forbids): merge them into one schema")
        if isinstance(node.get("oneOf"), list) and not _exclusive(node["oneOf"]):
            raise InputError("constraint_text uses 'oneOf' whose schemas may both match, which xgrammar enforces "
                             "as anyOf: give each a different type or a property with a different const, or write anyOf")
        for k, v in node.items():
            if k in ("properties", "patternProperties", "$defs", "definitions") and isinstance(v, dict):
                stack.extend(v.values())  # names to schemas: a property may be called "not"
            elif k not in ("const", "enum", "default", "examples", "title", "description"):
                stack.append(v)


def _exclusive(branches: list) -> bool:
    """No text matches two of the branches, by a rule that is plainly so: each has one type of
    its own (integer and number overlap), or each is an object with a required property whose
    const differs from the others'."""
    if not all(isinstance(b, dict) for b in branches):
        return False
    types = [b.get("type") for b in branches]
    if all(isinstance(ty, str) for ty in types) and len(set(types)) == len(types) \
            and not {"integer", "number"} <= set(types):
        return True
    common = set.intersection(*(set(b.get("required") or ()) for b in branches)) if branches else set()
    for key in sorted(common):
        consts = [((b.get("properties") or {}).get(key) or {}).get("const", ...) for b in branches]
        if ... not in consts and len({repr(c) for c in consts}) == len(consts):
            return True
    return False


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
        raise _message(kind, e) from None


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


def emptied_by(logits: torch.Tensor, params, state, stages) -> str:
    """The stage (its setting's name) that removed the last token the constraint allows, where a
    run's stages (stages.stages: (name, label, fn) in its order) left none: each stage's -inf
    taken from the allowed tokens still in, until none is. Greedy stops at temperature, which
    keeps the argmax of what the constraint allows (stages.greedy_logits). (vocab,) logits."""
    alive = state.constraint.allowed.to(logits.device) & torch.isfinite(logits)  # (vocab,)
    for name, _, fn in stages:
        if name == "temperature" and params.greedy:
            break
        logits = fn(logits)
        if name != "constraint":
            alive &= torch.isfinite(logits)
            if not bool(alive.any()):
                return name
    return "constraint"


@stage("constraint")
def apply_constraint(logits: torch.Tensor, params, state) -> torch.Tensor:
    """Forbidden tokens (the run's matcher's mask) -> -inf. (vocab,) -> (vocab,)"""
    if not params.constraint or state is None or state.constraint is None:
        return logits
    return logits.masked_fill(~state.constraint.allowed.to(logits.device), float("-inf"))
