"""The lesson "Follow one token": every chapter's numbers for one prompt on one engine, as plain
data. The page (ui/lesson) and `python -m inference explain` both show what this returns."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from inference.errors import InputError, NotAvailable
from inference.events import StepEvent
from inference.lesson import cost, path, text
from inference.lesson.roofline import Roofline, measure
from inference.lesson.sampling import sampling
from inference.request import prepare_run
from inference.sampling.params import SamplingParams

STEPS = 16  # tokens the lesson's run makes (and the KV-cache demonstration)
TOP = 10  # candidates shown
EXAMPLES = ("The capital of France is", "今天天气真")  # the second: "the weather today is really…" (好)
CHAPTERS = (("tokenize", "Tokenize"), ("embed", "Embed"), ("rope", "Position (RoPE)"), ("layers", "Layers"),
            ("lm_head", "LM head"), ("sampling", "Sampling"), ("prefill_decode", "Prefill and decode"),
            ("kv_cache", "The KV cache"), ("flops", "FLOPs per token"))


# Which token the lesson follows: the model's most likely one at each step (greedy, no setting),
# or one drawn with the page's sampling settings and seed.
FOLLOW = ("top", "sampled")


@dataclass
class Lesson:
    model: str
    prompt: str
    seed: int
    chapters: list[dict] = field(default_factory=list)
    follow: str = "top"
    mode: str = "completion"  # the prompt as a text to continue, or a chat message in the model's template

    def chapter(self, key: str) -> dict:
        return next(c for c in self.chapters if c["key"] == key)


def explain(engine, prompt: str, settings: SamplingParams | dict | None = None, *, roofline: Roofline | None = None,
            steps: int = STEPS, seed: int | None = None, follow: str = "top", chat: bool = False,
            system: str | None = None) -> Lesson:
    """Follow the prompt's next token through the engine's model, with real numbers: a run of
    `steps` tokens measured by the engine, one-off forward passes for the internals, and this
    machine's roofline (measured here unless given). settings: by schema name, over the model's
    defaults, or a door's parsed SamplingParams (their max_new_tokens replaced by `steps`): the
    sampling chapter shows them; follow "top" runs the model's most likely token at each step
    (greedy, no other setting: the token the chapters follow is the top candidate of the LM
    head), "sampled" draws with them and their seed. chat: the prompt is a chat message, read in
    the model's chat template (with `system`). Raises InputError for a prompt or settings a run
    refuses, NotAvailable for an engine without the model's internals (a server's)."""
    if follow not in FOLLOW:
        raise InputError(f"follow must be one of {', '.join(FOLLOW)}, got {follow!r}")
    info = engine.describe()
    if not info.capabilities.internals or info.cfg is None:
        raise NotAvailable("the lesson needs the model's weights, which a model server keeps to itself: "
                           "run it on a local model")
    cfg, tok = info.cfg, engine.tokenizer
    if isinstance(settings, SamplingParams):
        settings = replace(settings, max_new_tokens=steps, seed=settings.seed if seed is None else seed)
    else:
        settings = {**(settings or {}), "max_new_tokens": steps}
    shown = prepare_run(engine, settings, prompt=prompt, chat=chat, system=system, seed=seed, top_n=TOP)
    request = shown if follow == "sampled" else prepare_run(
        engine, SamplingParams(temperature=0.0, max_new_tokens=steps, seed=shown.params.seed), prompt=prompt,
        chat=chat, system=system, top_n=TOP)
    ids = list(request.ids)
    events = [ev for ev in engine.run(request) if isinstance(ev, StepEvent)]
    first = events[0]
    logits = engine.step_logits(ids)
    pattern = engine.attention_pattern(ids, 0)
    with engine.internals() as model:
        embedded = path.embed(model, tok, ids)
        rotated = path.rope(model, ids)
        head = path.lm_head(model, tok, logits, TOP)
        demo = cost.cache_demo(model, ids, steps)
    roof = roofline or measure(engine.device, engine.dtype)
    b, kv_b = info.dtype.itemsize, info.kv_value_bytes
    decode_b = (info.decode_dtype or info.dtype).itemsize
    timing = cost.prefill_decode(cfg, len(ids), first.prompt_tokens_reused or 0, first.prefill_ms or first.ms,
                                 [e.ms for e in events[1:]], b, decode_b, kv_b, roof, info.stored_bytes)
    run_text = tok.decode([e.token_id for e in events], unfinished="")
    numbers = {
        "tokenize": {**text.tokenize(tok, request.prompt_text, ids), "chat": chat},
        "embed": embedded,
        "rope": rotated,
        "layers": path.layers(cfg, len(ids), b, pattern),
        "lm_head": head,
        "sampling": {**sampling(logits, shown.params, ids, tok, first, TOP),
                     "follow": follow, "run_tokens": [e.piece for e in events], "run_text": run_text},
        "prefill_decode": timing,
        "kv_cache": cost.kv_cache(cfg, len(ids), kv_b, b, [e.kv_cache_bytes for e in events], demo, tok),
        "flops": cost.flops_per_token(cfg, len(ids) + 1, decode_b, roof, timing["decode_tokens_per_s"],
                                       info.stored_bytes),
    }
    lesson = Lesson(engine.describe().name, prompt, request.params.seed, follow=follow,
                    mode="chat" if chat else "completion")
    for k, (key, title) in enumerate(CHAPTERS, 1):
        lesson.chapters.append({"chapter": k, "key": key, "title": title, **numbers[key]})
    return lesson
