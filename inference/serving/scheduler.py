"""The scheduler: one forward pass per step for every active run.

Each step gathers a decode row for every run that is generating and a chunk of the prompt of
runs still in prefill (at most `prefill_chunk` prompt tokens a step, shared evenly between them,
so that a long prompt stalls neither everyone's next token nor a short prompt's first), runs them
through the model in one pass over the paged KV pool, and samples each run's next token with its
own settings, seed and generator. Decoding is bound by reading the weights, so a step for 8 runs
costs little more than a step for one.

A run's results do not depend on who else runs: its rows see only its own cache slots, and its
sampling only its own generator. Nor does its failure: whatever one run raises while it starts,
is sampled, emits a token or ends (a constraint, a sampler stage, the tokenizer, a stop string,
the KV pool) ends that run alone with its error, its blocks back in the pool. Should the loop
itself ever die, every run waiting or running is answered with the error at once and the
scheduler refuses new runs (`down`) instead of leaving them to hang.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

import torch

from inference.errors import EngineClosed, EngineDown, ResourceError
from inference.decoding.beams import BeamSearch
from inference.decoding.tree import TreeSearch
from inference.events import PrefillEvent, WaitEvent
from inference.serving.kv_pool import BLOCK_SIZE, BlockTable, KVPool, PoolStats, PrefixCache, blocks_for
from inference.model.transformer import Transformer
from inference.sampling.params import SamplingParams
from inference.sampling.state import RunState
from inference.serving.beam_rows import beam_rows, beam_step
from inference.serving.run import Run, prefill_shares, tables_of
from inference.serving.run_events import ending, step_event
from inference.serving.step_batch import eager_batch, static_rows
from inference.serving.step_stats import RowSampling, StepInfo, pick_rows
from inference.serving.static_step import StaticDecode, bucket_for
from inference.serving.stop import StopMatcher


def _one_line(error: BaseException) -> str:
    text = str(error).strip().split("\n")[0]
    return text if len(text) <= 200 else text[:200] + "…"


class Scheduler:
    """Owns the model's forward passes and the KV pool; runs a thread that steps every run."""

    def __init__(self, model: Transformer, tokenizer, eos_ids: set[int], pool: KVPool,
                 prefill_chunk: int | None = None, static_decode: bool | None = None):
        self.model, self.tokenizer, self.eos_ids, self.pool = model, tokenizer, eos_ids, pool
        self.prefill_chunk = prefill_chunk or (1024 if model.device.type == "cuda" else 128)
        # Steps of decoding runs only, over fixed buffers replayed as CUDA graphs (static_step.py):
        # on by default on a GPU, where an eager step of a small model is its kernel launches
        # (measured on an H100: SmolLM2 66 -> 275 tok/s, Llama-3.2-1B's shape 124 -> 315;
        # bench/measured/h100-cuda-graphs.md). TOKEN_LAB_CUDA_GRAPHS=0 turns them off, =1 on (on a
        # CPU the fixed-shape step then runs eagerly: as fast as the eager step, nothing to launch).
        flag = os.environ.get("TOKEN_LAB_CUDA_GRAPHS")
        on = (flag == "1" if flag in ("0", "1") else model.device.type == "cuda") if static_decode is None \
            else static_decode
        self.static = StaticDecode(model, pool) if on else None
        self._waiting: deque[Run] = deque()
        self._active: list[Run] = []
        self._reserved = 0  # blocks promised to admitted runs
        # Whole blocks of finished runs, for a prompt that starts the same way. Invariant:
        # reserved + cached <= the pool's blocks, so every block promised can be taken.
        self.prefix_cache = PrefixCache(pool)
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._down: EngineDown | None = None  # the loop died: why (every later submit raises it)

    # ------------------------------------------------------------ the callers' side

    def submit(self, ids: list[int], params: SamplingParams, top_n: int, cancel: threading.Event,
               max_new: int, capped: bool, seed: int, given: int = 0, events=None,
               keep_prefix: bool = True, forced: tuple[int, ...] = (), tree: TreeSearch | None = None) -> Run:
        """Queue a run. given: how many of ids' last tokens the run counts as generated already
        (a branch continuing after them): its sampling state starts after them, its text after
        them. events: where its events go (default: a queue of its own); keep_prefix: whether
        its blocks go to the prefix cache at its end (a batch of samples keeps one sample's,
        not 64 copies of one prompt that would push every chat out of the cache). forced: the
        tokens the run makes, one a step, instead of drawing them (its numbers are still each
        step's distribution). tree: a tree of continuations to grow (decoding/tree.py), its nodes
        still to expand rows as a beam search's beams."""
        needed = blocks_for(len(ids) + max_new)
        beams, width = tree, tree.width if tree is not None else 1
        if params.num_beams > 1:
            beams, width = BeamSearch(params.num_beams, params.length_penalty, frozenset(self.eos_ids), max_new), \
                params.num_beams
        if beams is not None:  # W beams (or a tree's widest level) share the prompt's whole blocks; the rest each its own
            shared = len(ids) // BLOCK_SIZE
            needed = shared + width * (needed - shared)
            keep_prefix = False
        if needed > self.pool.n_blocks:
            raise ResourceError(
                f"this run needs {needed} KV blocks ({len(ids)} prompt + {max_new} new tokens) but "
                f"the server's pool has {self.pool.n_blocks}; lower max new tokens or shorten the prompt")
        run = Run(ids, params, top_n, cancel, max_new, capped, seed, needed, given=given, keep_prefix=keep_prefix,
                  beams=beams, forced=tuple(forced))
        if events is not None:
            run.events = events
        with self._cv:
            if self._down is not None:
                raise self._down
            if self._closed:
                raise EngineClosed("the engine is closed: it takes no more runs")
            self._waiting.append(run)
            if self._reserved + sum(r.blocks_needed for r in self._waiting) > self.pool.n_blocks:
                self._tell_waiting()  # at once: the page shows the wait from the click on
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name="tokenlab-scheduler")
                self._thread.start()
            self._cv.notify()
        return run

    def abandon(self, run: Run) -> None:
        """The caller stopped listening (a closed stream): end the run and wait until its blocks
        are back in the pool."""
        run.cancel.set()
        with self._cv:
            self._cv.notify()
        run.released.wait()

    def close(self) -> None:
        """Cancel every run, queued or admitted (each ends with a "cancelled" DoneEvent and its
        blocks go back), end the thread and wait for it, then empty the prefix cache. Once it
        returns, the scheduler computes nothing: a daemon thread still inside torch when the
        interpreter finalizes aborts the process. Runs submitted later raise EngineClosed.
        Idempotent."""
        with self._cv:
            self._closed = True
            for run in [*self._waiting, *self._active]:
                run.cancel.set()
            self._cv.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._cv:
            self.prefix_cache.evict(self.prefix_cache.blocks)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def down(self) -> EngineDown | None:
        """Why the scheduler's loop died (None while it serves): it then takes no more runs."""
        return self._down

    def stats(self) -> PoolStats:
        with self._cv:
            return self._stats()

    def _stats(self) -> PoolStats:
        cached = self.prefix_cache.blocks
        return PoolStats(self.pool.n_blocks, self.pool.blocks_used - cached, self._reserved, len(self._active),
                         len(self._waiting), self.pool.bytes_per_block, cached)

    @property
    def runs(self) -> int:
        """Runs admitted or waiting."""
        with self._cv:
            return len(self._active) + len(self._waiting)

    # ------------------------------------------------------------ the scheduler's thread

    def _loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._active and not self._waiting and not self._closed:
                        self._cv.wait()
                    if not self._active and not self._waiting:  # closed, and every run has ended
                        return
                self._iteration()  # its locals end with it: a finished run is not kept while idle
        except BaseException as e:  # noqa: BLE001 - a fault of the loop's own, not of one run's
            self._die(e)

    def _die(self, error: BaseException) -> None:
        """The loop cannot go on: answer every run waiting or running with the error, give their
        blocks back, and refuse new runs. Nobody is left waiting on a thread that is gone."""
        with self._cv:
            self._down = EngineDown(f"the engine stopped after an internal error "
                                    f"({error.__class__.__name__}: {_one_line(error)}); restart it")
            for run in [*self._waiting, *self._active]:
                if run.released.is_set():
                    continue
                try:
                    for table in tables_of(run):
                        table.release()
                except Exception:  # noqa: BLE001 - its blocks are lost; its answer is not
                    pass
                run.events.put(self._down)
                run.released.set()
            self._waiting.clear()
            self._active.clear()
            self._reserved = 0
            self._cv.notify_all()

    def _iteration(self) -> None:
        with self._cv:
            self._drop_cancelled_waiting()
            self._admit()
            active = list(self._active)
        for run in active:
            if run.cancel.is_set():
                self._finish(run, "cancelled")
        active = [r for r in active if not r.released.is_set()]
        if active:
            self._step(active)

    def _drop_cancelled_waiting(self) -> None:
        for run in [r for r in self._waiting if r.cancel.is_set()]:
            self._waiting.remove(run)
            run.events.put(ending(run, "cancelled", self.tokenizer, self.eos_ids))
            run.released.set()

    def _admit(self) -> None:
        """First come, first served: admit while the next run's blocks fit the pool."""
        while self._waiting and self._reserved + self._waiting[0].blocks_needed <= self.pool.n_blocks:
            run = self._waiting.popleft()
            self._reserved += run.blocks_needed
            prefix = self.prefix_cache.take_prefix(run.ids)
            self.prefix_cache.evict(self._reserved + self.prefix_cache.blocks - self.pool.n_blocks)
            self._active.append(run)
            try:
                self._start(run, prefix)
            except Exception as e:  # noqa: BLE001 - this run's settings or tokens: it ends alone
                if run.table is None:  # its cached prefix was not adopted yet
                    self.pool.give_back(prefix)
                self._fail(run, e)
        self._tell_waiting()

    def _tell_waiting(self) -> None:
        """A WaitEvent to each queued run whose place in line changed."""
        now = time.perf_counter()
        for position, run in enumerate(self._waiting, 1):
            if run.wait_position != position:
                run.wait_position = position
                run.events.put(WaitEvent(position, (now - run.submitted) * 1000, self._stats(), run.blocks_needed))

    def _start(self, run: Run, prefix: list[int]) -> None:
        """Set the run up; prefix: cached blocks that already hold its prompt's first positions."""
        dev = self.model.device
        run.admitted = run.last_step_end = time.perf_counter()
        run.generator = torch.Generator(device=dev)
        run.generator.manual_seed(run.seed)
        prompt, given = run.ids[:run.n_prompt - run.given], run.ids[run.n_prompt - run.given:]
        run.state = RunState.at(run.params, prompt, given, self.model.cfg.vocab_size, run.seed,
                                tokenizer=self.tokenizer, device=dev)
        run.stream, run.stops = self.tokenizer.stream(), StopMatcher(run.params.stop)
        for token in given:  # the text goes on from theirs (a character split across the seam)
            run.stream.push(token)
        run.table = BlockTable(self.pool, run.n_prompt + run.max_new, dev)
        run.table.adopt(prefix)
        run.prefilled = run.reused = run.table.length

    def _step(self, active: list[Run]) -> None:
        """One forward pass: a decode row per generating run, prompt chunks within the budget."""
        dev = self.model.device
        tokens, positions, slots, sampling = [], [], [], []
        decode, prefills, reading = [], [], []  # reading: runs whose prompt is still not all read
        shares = prefill_shares(active, self.prefill_chunk)
        for run in active:
            if run.beams is not None and run.prefilled == run.n_prompt:
                try:  # a beam the pool cannot grow ends the search
                    beam_rows(run, tokens, positions, slots, decode, sampling)
                except Exception as e:  # noqa: BLE001
                    self._fail(run, e)
                continue
            if run.prefilled == run.n_prompt:  # generating: feed back the last token
                start, new = run.table.length, [run.next_token]
            elif shares[id(run)]:
                start = run.prefilled
                new = run.ids[start:start + shares[id(run)]]
            else:
                continue
            try:  # the run's blocks first: a run the pool cannot grow ends alone, the batch unchanged
                run.table.grow_to(start + len(new))
            except Exception as e:  # noqa: BLE001
                self._fail(run, e)
                continue
            row = len(tokens)
            tokens += new
            positions += range(start, start + len(new))
            slots.append(run.table.slots(start, start + len(new)))
            if run.prefilled == run.n_prompt:
                decode.append((row, run.table, start + 1))
            else:
                prefills.append((row, len(new), run.table.slots(0, start + len(new)), start))
                run.prefilled += len(new)
            run.table.length = start + len(new)
            if run.prefilled == run.n_prompt:  # this row's logits give the run's next token
                sampling.append((row + len(new) - 1, run))
            else:
                reading.append(run)
        if not tokens:
            return
        stepped = [run for run in active if not run.released.is_set()]
        try:
            with torch.inference_mode():
                if self.static is not None and not prefills and bucket_for(len(decode)):
                    logits = self.static(tokens, positions, *static_rows(decode))
                else:  # the eager step: any mix of decode rows and prompt chunks
                    batch = eager_batch(positions, slots, decode, prefills, sampling, dev)
                    logits = self.model.forward_paged(torch.tensor(tokens, device=dev), batch,
                                                      self.pool.k_layers, self.pool.v_layers)
        except torch.OutOfMemoryError:
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            for run in stepped:
                self._fail(run, ResourceError(
                    f"out of {dev.type.upper()} memory after {len(run.step_ms)} tokens ({run.n_prompt} "
                    "prompt tokens, with other runs on this server); try a shorter prompt or fewer new tokens"))
            return
        except Exception as e:  # noqa: BLE001 - the pass all of them shared: each caller reports it
            for run in stepped:
                self._fail(run, e)
            return
        order = [run for _, run in sampling]
        beam_runs = list(dict.fromkeys(r for r in order if r.beams is not None))
        if beam_runs:  # each beam search's rows go to its own step; the others are sampled as ever
            for run in beam_runs:
                try:
                    beam_step(run, logits[[i for i, r in enumerate(order) if r is run]], self._cv, self._stats,
                              self.tokenizer)
                except Exception as e:  # noqa: BLE001 - this search's alone
                    self._fail(run, e)
                    continue
                if run.beams.done:
                    self._finish(run, run.beams.ended)
            plain = [i for i, r in enumerate(order) if r.beams is None]
            logits, order = logits[plain], [order[i] for i in plain]
        for run, info in self._sample(logits, order) if order else ():
            if isinstance(info, Exception):
                self._fail(run, info)
                continue
            try:
                self._emit(run, info)
            except Exception as e:  # noqa: BLE001 - its constraint, tokenizer or stop strings
                self._fail(run, e)
        for run in reading:
            run.events.put(PrefillEvent(run.prefilled, run.n_prompt))

    def _sample(self, logits: torch.Tensor, runs: list[Run]) -> list[tuple[Run, StepInfo | Exception]]:
        """Each run's token from its row of logits, sampled together (pick_rows); a run whose
        stages raise gets its error instead, and the others their tokens as if it were not
        there: their generators are put back as they were and each row is sampled alone."""
        rows = [RowSampling(r.params, r.state, r.generator, r.top_n,
                            r.forced[len(r.generated)] if r.forced else None) for r in runs]
        before = [r.generator.get_state() for r in runs]
        try:
            with torch.inference_mode():
                return list(zip(runs, pick_rows(logits, rows)))
        except Exception:  # noqa: BLE001 - which run's? each row alone says
            out = []
            for i, (run, row) in enumerate(zip(runs, rows)):
                run.generator.set_state(before[i])
                try:
                    with torch.inference_mode():
                        out.append((run, pick_rows(logits[i:i + 1], [row])[0]))
                except Exception as e:  # noqa: BLE001
                    out.append((run, e))
            return out

    def _emit(self, run: Run, info: StepInfo) -> None:
        """The run's new token: its event, and the end of the run if it ends here."""
        token_id = info.token_id
        constraint = run.state.constraint
        if constraint is not None and (info.nothing_left or not constraint.allowed[token_id]):
            # Nothing was left to draw from: the stages kept no token the constraint allows.
            run.emptied_by = info.emptied_by or "constraint"
            self._finish(run, "constraint")
            return
        recorded = run.state.recorded()  # the state this step was sampled in, for replay
        run.state.advance(token_id, info.prob, run.params)
        run.next_token = token_id
        run.generated.append(token_id)
        if info.free_prob is not None:  # what the constraint cost, for the run's totals
            run.costs.append((info.prob, info.free_prob))
        is_eos = token_id in self.eos_ids
        delta = "" if is_eos else run.stops.push(run.stream.push(token_id))
        run.parts.append(delta)
        now = time.perf_counter()
        ms = (now - run.last_step_end) * 1000
        run.last_step_end = now
        run.step_ms.append(ms)
        with self._cv:
            pool = self._stats()
        run.events.put(step_event(run, info, delta, ms, self.tokenizer, self.pool.bytes_per_block, pool, recorded))
        if is_eos:
            self._finish(run, "eos")
        elif constraint is not None and constraint.terminated:
            self._finish(run, "complete")
        elif run.stops.matched is not None:
            self._finish(run, "stop")
        elif len(run.step_ms) == run.max_new:
            self._finish(run, "context" if run.capped else "length")

    def _release(self, run: Run, keep: bool = False) -> None:
        """Give the run's blocks back; keep: its whole blocks go to the prefix cache instead."""
        with self._cv:  # the cache and the pool's accounting change together
            if run.table is not None and keep:
                held = (run.ids + run.generated)[:run.table.length]  # every token but the last sampled
                self.prefix_cache.keep(held, run.table.blocks)
                run.table.blocks = []
            for table in tables_of(run):
                table.release()
            self._reserved -= run.blocks_needed
            self._active.remove(run)
            self._cv.notify()
        run.released.set()

    def _finish(self, run: Run, reason: str) -> None:
        try:  # its last text (the tokenizer's and the stop strings' tail) before its blocks go
            done = ending(run, reason, self.tokenizer, self.eos_ids)
        except Exception as e:  # noqa: BLE001 - the run ends with its error instead
            self._fail(run, e)
            return
        self._release(run, keep=reason != "cancelled" and run.keep_prefix)
        run.events.put(done)

    def _fail(self, run: Run, error: Exception) -> None:
        """End the run with its error (its caller raises it), its blocks back in the pool."""
        if not run.released.is_set():
            self._release(run)
            run.events.put(error)

