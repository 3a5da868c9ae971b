"""The quantization lens: one model at several precisions on one prompt, token by token.

float32 is the reference: the model's weights in float32 (a GGUF file's: its blocks dequantized).
Each other precision is a model of its own: the float32 weights quantized on request to Q8_0,
Q5_0, Q4_1 or Q4_0 (quantize.py: every matrix, the embedding included, as llama.cpp's --pure),
the source file's own blocks ("file"), or another GGUF file of the same model. For each:

- per step, both fed float32's greedy text (one forward pass each, Engine.logits_along): the KL
  divergence KL(float32 ‖ precision) of the next-token distributions (in float64 from each
  one's float32 logits), whether their top tokens agree, and the rank of float32's top token in
  the precision's distribution (1 + the tokens with a larger logit);
- its own greedy text (a run through its engine's scheduler) and the first step where it forks
  from float32's (None where the two are the same);
- the bytes of weights one decode token reads (model/anatomy.py's count: every matrix as held,
  an embedding row, the norms), its measured decode speed in that run, and the perplexity of
  float32's greedy text under it.

At most two precisions are held at once: the float32 model (the weights each precision is made
from) and the one being measured, which is let go before the next is made. A model whose two
would not fit the memory available is refused, saying how much they would take.
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch

from inference.device import available_memory_bytes
from inference.errors import InputError
from inference.lenses.quantize import TYPES, largest_matrix, quantized_bytes, quantized_model
from inference.loading.default_model import resolve_model
from inference.loading.gguf_import import gguf_source
from inference.loading.gguf_weights import stored_bytes, types_held
from inference.loading.load import load_hf_dir, weights_bytes
from inference.model.anatomy import decode_cost
from inference.model.config import ModelConfig
from inference.request import prepare_run
from inference.sampling.params import SamplingParams
from inference.serving.engine import Engine

FLOAT32, FILE = "float32", "file"
RESERVE_BYTES = 512 * 2**20  # left to everything else, as a model load leaves (serving/models.py)
MAX_NEW_TOKENS = 512
FOUR_BIT = {"Q4_0", "Q4_1", "Q4_K", "IQ4_NL", "IQ4_XS"}


@dataclass(frozen=True)
class Precision:
    name: str  # "float32", "q4_0", "file" (the source's own blocks) or a GGUF file's name
    qtype: int | None = None  # quantized on request to this type
    path: Path | None = None  # a GGUF file read in its own blocks


@dataclass
class StepRow:
    precision: str
    step: int
    kl: float  # KL(float32 ‖ precision) of the next-token distributions, nats
    top1_agree: bool
    rank: int  # of float32's top token in the precision's distribution

    def to_json(self) -> dict:
        return {"precision": self.precision, "step": self.step, "kl": self.kl, "top1_agree": self.top1_agree,
                "rank": self.rank}


@dataclass
class PrecisionResult:
    precision: str
    steps: list[StepRow]
    fork_step: int | None  # the first step where its greedy text differs from float32's
    tokens: list[int]  # its own greedy tokens
    text: str  # their text
    reference_text: str  # float32's greedy text
    bytes_per_token: int  # weights one decode token reads
    decode_tokens_per_s: float | None  # measured in its greedy run (None: fewer than two tokens)
    perplexity: float  # of float32's greedy text under this precision
    types: dict[str, int] = field(default_factory=dict)  # its matrices' bytes by type

    def to_json(self) -> dict:
        return {"precision": self.precision, "fork_step": self.fork_step, "bytes_per_token": self.bytes_per_token,
                "decode_tokens_per_s": self.decode_tokens_per_s, "perplexity": self.perplexity}


def parse_precisions(text: str | list[str], source: Path | None, limit: int | None = None) -> list[Precision]:
    """float32,q8_0,q4_0,file,PATH.gguf -> the precisions, float32 first (the reference, measured
    whether listed or not); an InputError naming what cannot be read. limit: the most precisions
    besides float32 (a shared page's per visitor)."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    out: list[Precision] = [Precision(FLOAT32)]
    for name in names:
        low = name.lower()
        if low == FLOAT32:
            continue
        if low in TYPES:
            p = Precision(low, TYPES[low])
        elif low == FILE:
            if source is None:
                raise InputError("'file' is the source's own GGUF blocks, and this model is not read from a GGUF file")
            p = Precision(FILE, path=source)
        elif low.endswith(".gguf"):
            path = Path(name).expanduser()
            if not path.is_file():
                raise InputError(f"{name}: no such GGUF file")
            p = Precision(path.name, path=path)
        else:
            raise InputError(f"unknown precision {name!r}: use float32, {', '.join(TYPES)}, file or a .gguf file")
        if any(q.name == p.name for q in out):
            raise InputError(f"{p.name} is listed twice")
        out.append(p)
    if limit is not None and len(out) - 1 > limit:
        raise InputError(f"at most {limit} precisions besides float32 here (a shared page's bound per visitor); "
                         f"{len(out) - 1} were asked for")
    return out


def source_note(model_dir: Path) -> str | None:
    """What the lens measures where the source is itself a quantized GGUF file: its float32 is its
    dequantized blocks, so each precision quantizes a quantized model again."""
    source = gguf_source(Path(model_dir))
    if source is None:
        return None
    types = {t: b for t, b in types_held(source).items() if t not in ("F32", "F16", "BF16")}
    if not types:
        return None
    names = sorted(types, key=lambda t: -types[t])
    bits = "a 4-bit" if names[0] in FOUR_BIT else "a quantized"
    return (f"the source is {bits} GGUF file ({', '.join(names)}): its float32 is its blocks dequantized, so each "
            "precision here quantizes a quantized model again")


def needed_bytes(model_dir: Path, cfg: ModelConfig, precisions: list[Precision], steps: int) -> int:
    """The memory the lens holds at its peak: the float32 model, the largest other precision (a
    quantized one twice while it is laid out, beside a float32 copy of the matrix being
    quantized), both precisions' logits along the text, and a reserve for everything else."""
    other = 0
    for p in precisions[1:]:
        if p.qtype is not None:
            other = max(other, 2 * quantized_bytes(cfg, p.qtype) + 4 * largest_matrix(cfg))
        else:
            other = max(other, stored_bytes(p.path, cfg, blocks=True))
    logits = 2 * steps * cfg.vocab_size * 4
    return weights_bytes(model_dir, "cpu", "float32") + other + logits + RESERVE_BYTES


def check_memory(model_dir: Path, cfg: ModelConfig, precisions: list[Precision], steps: int,
                 available: Callable[[], int] = available_memory_bytes) -> None:
    need, have = needed_bytes(model_dir, cfg, precisions, steps), available()
    if need > have:
        gib = 2**30
        raise InputError(f"the quantization lens holds this model in float32 and one other precision at once: "
                         f"{need / gib:.2f} GiB with the reserve, and {have / gib:.2f} GiB are available; "
                         "this model is too large to compare here")


def compare(model_dir: str | Path | None, prompt: str, precisions: str | list[str], max_new_tokens: int, *,
            chat: bool = False, products: str = "auto", limit: int | None = None,
            available: Callable[[], int] = available_memory_bytes) -> Iterator[PrecisionResult]:
    """Measure each precision against float32 on the prompt (rendered with the chat template when
    chat), greedy for max_new_tokens: float32's result first, then each precision's as it is done.
    products: the quantized precisions' (model/products.py). Input errors raise before any load."""
    for results in compare_prompts(model_dir, [prompt], precisions, max_new_tokens, chat=chat, products=products,
                                   limit=limit, available=available):
        yield results[0]


def compare_prompts(model_dir: str | Path | None, prompts: list[str], precisions: str | list[str],
                    max_new_tokens: int, *, chat: bool = False, products: str = "auto", limit: int | None = None,
                    available: Callable[[], int] = available_memory_bytes) -> Iterator[list[PrecisionResult]]:
    """compare over several prompts, each precision made once: per precision, its result on each
    prompt (float32's first)."""
    model_dir = resolve_model(model_dir) if model_dir is None or not isinstance(model_dir, Path) else model_dir
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise InputError(f"max new tokens must be from 1 to {MAX_NEW_TOKENS}, got {max_new_tokens!r}")
    if not prompts or any(not isinstance(p, str) or not p.strip() for p in prompts):
        raise InputError("the prompt is empty")
    cfg = ModelConfig.from_json(Path(model_dir) / "config.json")
    wanted = parse_precisions(precisions, gguf_source(Path(model_dir)), limit)
    check_memory(model_dir, cfg, wanted, max_new_tokens * len(prompts), available)
    reference = load_hf_dir(model_dir, "cpu", "float32")
    tok = reference.tokenizer
    with _engine(reference.model, tok, FLOAT32, cfg) as ref:
        runs = []  # per prompt: its ids, float32's greedy tokens and text, float32's logits along them
        for prompt in prompts:
            _, ids = ref.prompt(prompt, chat)
            tokens, rate = _greedy(ref, ids, max_new_tokens)
            runs.append((ids, tokens, tok.continuation_text(tokens), ref.logits_along(ids + tokens, len(ids)), rate))
        yield [_result(FLOAT32, ref, logits, logits, tokens, tokens, rate, text, tok)
               for ids, tokens, text, logits, rate in runs]
        for p in wanted[1:]:
            model, tokenizer = _made(p, reference, products)
            with _engine(model, tokenizer, p.name, cfg) as engine:
                out = []
                for ids, ref_tokens, ref_text, ref_logits, _ in runs:
                    tokens, rate = _greedy(engine, ids, max_new_tokens)
                    logits = engine.logits_along(ids + ref_tokens, len(ids))  # (steps, vocab)
                    out.append(_result(p.name, engine, ref_logits, logits, ref_tokens, tokens, rate, ref_text, tok))
                yield out
            del model, engine, logits
            gc.collect()  # its memory goes back before the next precision is made


def _made(p: Precision, reference, products: str):
    """(model, tokenizer) of a precision: quantized from the float32 model, or a GGUF file's
    blocks (the same model's: its shapes and every token's bytes checked)."""
    if p.qtype is not None:
        return quantized_model(reference.model, p.qtype, products), reference.tokenizer
    other = load_hf_dir(resolve_model(str(p.path)), "cpu", "auto", products=products)
    a, b = reference.model.cfg, other.model.cfg
    shape = ("hidden_size", "n_layers", "n_heads", "n_kv_heads", "head_dim", "intermediate_size", "vocab_size")
    if any(getattr(a, k) != getattr(b, k) for k in shape) or \
            other.tokenizer.token_bytes[:a.vocab_size] != reference.tokenizer.token_bytes[:a.vocab_size]:
        raise InputError(f"{p.path.name} is another model (its shapes or its tokens differ from this one's)")
    return other.model, reference.tokenizer


def _engine(model, tokenizer, name: str, cfg: ModelConfig) -> Engine:
    """An engine of its own for one precision, its KV pool one context window."""
    # A whole context window: a pool's pages cost memory only once a run writes them.
    pool_mib = cfg.kv_bytes_per_token(4) * (cfg.max_seq_len + 16) / 2**20
    return Engine(model, tokenizer, name, {}, kv_pool_mib=pool_mib)


def _greedy(engine: Engine, prompt_ids: list[int], steps: int) -> tuple[list[int], float | None]:
    """Its greedy tokens through its scheduler, and the decode speed measured in that run."""
    from inference.events import DoneEvent, StepEvent

    request = prepare_run(engine, SamplingParams(temperature=0.0, max_new_tokens=steps), ids=prompt_ids, top_n=0)
    tokens, done = [], None
    for ev in engine.run(request):
        if isinstance(ev, StepEvent):
            tokens.append(ev.token_id)
        elif isinstance(ev, DoneEvent):
            done = ev
    return tokens, done.decode_tokens_per_s if done is not None and done.generated_tokens > 1 else None


def fork_step(a: list[int], b: list[int]) -> int | None:
    """The first step where two greedy texts differ (one ending sooner counts), None if never."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _result(name: str, engine: Engine, ref_logits: torch.Tensor, logits: torch.Tensor, ref_tokens: list[int],
            tokens: list[int], rate: float | None, ref_text: str, tokenizer) -> PrecisionResult:
    rows, surprise = [], 0.0
    for s in range(len(ref_tokens)):  # a row at a time: two float64 vocabularies, never (steps, vocab)
        lp, lq = ref_logits[s].double().log_softmax(-1), logits[s].double().log_softmax(-1)  # (vocab,)
        kl = float((lp.exp() * (lp - lq)).sum())
        top = int(ref_logits[s].argmax())
        rank = int((logits[s] > logits[s, top]).sum()) + 1
        rows.append(StepRow(name, s, kl, int(logits[s].argmax()) == top, rank))
        surprise -= float(lq[ref_tokens[s]])
    model = engine.model
    cost = decode_cost(model.cfg, 1, 4, kv_bytes_per_value=0, stored=model.stored_bytes())
    return PrecisionResult(name, rows, fork_step(ref_tokens, tokens), tokens, tokenizer.continuation_text(tokens),
                           ref_text, cost.bytes, rate, math.exp(surprise / len(ref_tokens)), _types(model))


def _types(model) -> dict[str, int]:
    """The bytes a model's matrices hold, by type ("F32" for float ones); a tied one once."""
    out: dict[str, int] = {}
    seen = set()
    for m in model.modules():
        q, w = getattr(m, "qweight", None), getattr(m, "weight", None)
        held = q if q is not None else w if isinstance(w, torch.Tensor) and w.dim() == 2 else None
        if held is None or id(held) in seen:
            continue
        seen.add(id(held))
        for name, nbytes in ([(p.name, p.nbytes) for p in q.parts] if q is not None else [("F32", w.numel() * 4)]):
            out[name] = out.get(name, 0) + nbytes
    return out
