"""The engine: prompt -> ids -> one prefill -> one decode step per token, yielding events."""

from __future__ import annotations

import json
import math
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from .chat import chat_messages, render_chat
from .checkpoint import read_hf_weights, to_model_names
from .compiled import CompiledDecoder
from .config import ModelConfig
from .device import resolve_decode_dtype, resolve_device, resolve_dtype
from .errors import InputError, ModelError, ResourceError
from .events import Candidate, DoneEvent, StepEvent
from .model import Transformer
from .replay import KEEP, StepLogits
from .sampling import SamplingParams, final_logits, sample
from .stop import StopMatcher
from .tokenizer import Tokenizer, load_tokenizer


@dataclass
class Request:
    prompt: str
    params: SamplingParams
    chat: bool = False
    system: str | None = None
    top_n: int = 10  # candidates reported per step


class Engine:
    """A loaded model and its tokenizer. Stateless between runs: each run owns its KV cache."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, name: str = "model",
                 generation_defaults: dict | None = None, compile_backend: str | None = None):
        """compile_backend: None runs decode steps eagerly; "inductor" compiles them (CUDA
        graphs on a GPU, see compiled.py); "eager" traces them without code generation (tests)."""
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.decoder = CompiledDecoder(model, compile_backend) if compile_backend else None
        self.cfg: ModelConfig = model.cfg
        self.generation_defaults = generation_defaults or {}
        if tokenizer.vocab_size > self.cfg.vocab_size:
            raise ModelError(f"tokenizer has {tokenizer.vocab_size} tokens but the model's "
                             f"vocabulary is {self.cfg.vocab_size}")
        tokenizer.pad_to(self.cfg.vocab_size)
        self.eos_ids = set(tokenizer.eos_ids) | set(self.cfg.eos_token_ids)
        self._active = 0  # runs holding a KV cache right now
        self._active_lock = threading.Lock()

    @property
    def active_runs(self) -> int:
        return self._active

    @classmethod
    def load(cls, model: str | None = None, device: str = "auto", dtype: str = "auto",
             decode_dtype: str = "same", compile: bool = False) -> "Engine":
        """Load the default model (None), a Hugging Face directory, or a .gguf file."""
        from .default_model import resolve_model
        return cls.from_hf_dir(resolve_model(model), device, dtype, decode_dtype, compile)

    @classmethod
    def from_hf_dir(cls, model_dir: str | Path, device: str = "auto", dtype: str = "auto",
                    decode_dtype: str = "same", compile: bool = False) -> "Engine":
        """decode_dtype: weights for one-row matmuls ('same', 'auto' or a dtype; see model.Linear)."""
        model_dir = Path(model_dir)
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        cfg = ModelConfig.from_json(model_dir / "config.json")
        weights = to_model_names(cfg, read_hf_weights(model_dir, cfg), dt)
        model = Transformer.from_state_dict(cfg, weights, dev, dt, resolve_decode_dtype(decode_dtype, dev, dt))
        tokenizer = load_tokenizer(model_dir, cfg.bos_token_id, cfg.eos_token_ids)
        return cls(model, tokenizer, model_dir.name, _generation_defaults(model_dir),
                   "inductor" if compile else None)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    # ------------------------------------------------------------ prompt -> ids

    def prompt_text(self, prompt: str, chat: bool = False, system: str | None = None) -> str:
        if not isinstance(prompt, str) or not prompt.strip():
            raise InputError("the prompt is empty")
        if not chat:
            return prompt
        return render_chat(self.tokenizer.chat_template, chat_messages(prompt, system),
                           bos_token=self.tokenizer.bos_token, eos_token=self.tokenizer.eos_token)

    def prompt_ids(self, prompt: str, chat: bool = False, system: str | None = None) -> list[int]:
        """The ids fed to the model; raises InputError if they do not fit the context window."""
        text = self.prompt_text(prompt, chat, system)
        # A rendered chat template already holds the BOS text where the model wants it.
        ids = self.tokenizer.encode(text, add_bos=False if chat else None)
        if len(ids) >= self.cfg.max_seq_len:
            raise InputError(f"the prompt is {len(ids)} tokens but the context window is "
                             f"{self.cfg.max_seq_len}; shorten it by at least "
                             f"{len(ids) - self.cfg.max_seq_len + 1} tokens")
        return ids

    # ------------------------------------------------------------ scoring

    def score(self, context_ids: list[int], continuation: str) -> list[tuple[int, str, float]]:
        """Teacher-forced log-probabilities of continuation's tokens after context_ids, from one
        forward pass: [(token id, piece, log p)]."""
        cont = self.tokenizer.encode_continuation(continuation)
        if not cont:
            raise InputError("the continuation is empty")
        if not context_ids:
            raise InputError("the context is empty: scoring needs at least one token before")
        ids = context_ids + cont
        if len(ids) > self.cfg.max_seq_len:
            raise InputError(f"context and continuation are {len(ids)} tokens but the context window "
                             f"is {self.cfg.max_seq_len}")
        with torch.inference_mode():
            tokens = torch.tensor([ids], device=self.device)
            logits = self.model(tokens, self.model.new_cache(len(ids)), 0, all_logits=True)[0]
            # The logits at position i predict token i + 1.
            logp = logits[len(context_ids) - 1:-1].log_softmax(-1)  # (len(cont), vocab)
            picked = logp.gather(-1, torch.tensor(cont, device=self.device)[:, None])[:, 0].tolist()
        return [(i, self.tokenizer.piece(i), lp) for i, lp in zip(cont, picked)]

    # ------------------------------------------------------------ generation

    def generate(self, req: Request, cancel: threading.Event | None = None
                 ) -> Iterator[StepEvent | DoneEvent]:
        """Yield one StepEvent per new token, then a DoneEvent. Input errors raise before any event."""
        params = req.params
        ids = self.prompt_ids(req.prompt, req.chat, req.system)
        return self.generate_ids(ids, params, req.top_n, cancel)

    def generate_ids(self, ids: list[int], params: SamplingParams, top_n: int = 10,
                     cancel: threading.Event | None = None) -> Iterator[StepEvent | DoneEvent]:
        """Generate from prompt ids. top_n=0 skips the per-step instrumentation (raw
        distribution, candidates): the benchmark's baseline."""
        model, tok, dev = self.model, self.tokenizer, self.device
        n_prompt = len(ids)
        max_new = min(params.max_new_tokens, self.cfg.max_seq_len - n_prompt)
        capped = max_new < params.max_new_tokens
        seed = params.seed if params.seed is not None else secrets.randbelow(2**31)
        generator = torch.Generator(device=dev)
        generator.manual_seed(seed)
        top_n = max(0, min(top_n, self.cfg.vocab_size))

        decoder = self.decoder
        cache = decoder.take_cache(n_prompt + max_new) if decoder else model.new_cache(n_prompt + max_new)
        with self._active_lock:
            self._active += 1
        seen = torch.zeros(self.cfg.vocab_size, dtype=torch.bool, device=dev)
        prompt = torch.tensor([ids], dtype=torch.long, device=dev)  # (1, n_prompt)
        seen[prompt[0]] = True
        stream, stops = tok.stream(), StopMatcher(params.stop)
        parts: list[str] = []
        step_ms: list[float] = []
        reason = "length"
        next_id = prompt[:, -1:]  # (1, 1)
        try:
            with torch.inference_mode():
                for step in range(max_new):
                    if cancel is not None and cancel.is_set():
                        reason = "cancelled"
                        break
                    t0 = time.perf_counter()
                    if step == 0:
                        logits = model(prompt, cache, 0)  # (1, vocab)
                    elif decoder:
                        logits = decoder.decode(next_id, n_prompt + step - 1, cache)
                    else:
                        logits = model(next_id, cache, n_prompt + step - 1)
                    next_id, info = self._pick(logits[0], params, seen, generator, top_n)
                    seen[next_id[0]] = True
                    token_id = info.token_id
                    is_eos = token_id in self.eos_ids
                    delta = "" if is_eos else stops.push(stream.push(token_id))
                    parts.append(delta)
                    ms = (time.perf_counter() - t0) * 1000
                    step_ms.append(ms)
                    yield StepEvent(
                        step=step, token_id=token_id, piece=tok.piece(token_id), text=delta,
                        prob=info.prob, raw_prob=info.raw_prob, top=info.top,
                        entropy=info.entropy, rank=info.rank, logits=info.logits,
                        kv_cache_bytes=cache.bytes_used, kv_cache_capacity_bytes=cache.bytes_allocated,
                        ms=ms, prefill_ms=ms if step == 0 else None,
                        prompt_tokens=n_prompt if step == 0 else None)
                    if is_eos:
                        reason = "eos"
                        break
                    if stops.matched is not None:
                        reason = "stop"
                        break
                else:
                    reason = "context" if capped else "length"
        except torch.OutOfMemoryError:
            cache.free()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            raise ResourceError(f"out of {dev.type.upper()} memory after {len(step_ms)} tokens "
                                f"({n_prompt} prompt tokens); try a shorter prompt or fewer new "
                                "tokens") from None
        finally:  # also reached when the consumer closes the generator (stop, closed tab)
            if decoder and cache.k is not None:
                decoder.give_back(cache)  # kept for the next run: compiled graphs know its address
            else:
                cache.free()
            with self._active_lock:
                self._active -= 1
        tail = "" if reason == "stop" else stops.push(stream.flush()) + stops.flush()
        decode_s = sum(step_ms[1:]) / 1000
        yield DoneEvent(
            reason=reason, text="".join(parts) + tail, tail=tail, prompt_tokens=n_prompt,
            generated_tokens=len(step_ms), ttft_ms=step_ms[0] if step_ms else 0.0,
            decode_tokens_per_s=(len(step_ms) - 1) / decode_s if decode_s > 0 else 0.0,
            seed=seed, max_new_tokens=max_new, capped=capped)

    def _pick(self, logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor,
              generator: torch.Generator, top_n: int) -> tuple[torch.Tensor, "_Pick"]:
        """Sample from logits (vocab,) and gather what the step reports, with one host sync (a
        second only when the token was sampled from outside the kept top K, for its rank)."""
        final = final_logits(logits, params, seen).softmax(dim=-1)
        next_id = sample(final.unsqueeze(0), generator)[0]  # (1,)
        if top_n == 0:
            token_id = int(next_id.item())
            return next_id.view(1, 1), _Pick(token_id, float("nan"), float("nan"), [], float("nan"), 0, None)
        # What the step reports and keeps for replay, gathered on the device and sent in one
        # transfer. From e = exp(logits - max): Z = sum(e) gives the log-sum-exp, the sum of e
        # outside the kept top K the mass of the rest (summed on its own: Z minus the top's sum
        # would cancel away a tiny tail), dot(e, logits) / Z the mean logit for the entropy.
        vocab = logits.shape[-1]
        k = min(KEEP, vocab)
        top_n = min(top_n, k)
        top_logits, top_ids = logits.topk(k)  # sorted: top_logits[0] is the max
        e = (logits - top_logits[0]).exp()
        f = torch.float64
        packed = torch.cat([
            next_id.to(f), final[next_id].to(f), e[next_id].to(f), logits[next_id].to(f),
            e.sum(dtype=f, keepdim=True, dim=-1), e.index_fill(0, top_ids, 0).sum(dtype=f, keepdim=True, dim=-1),
            torch.dot(e, logits).to(f).view(1),  # Z * E[logit], for the entropy
            top_logits.to(f), top_ids.to(f), final[top_ids[:top_n]].to(f)]).cpu()
        head = packed[:7].tolist()
        token_id, e_chosen, chosen_logit, z, z_rest, z_mean = int(head[0]), *head[2:]
        m = float(packed[7])
        lse = m + math.log(z)
        rest = m + math.log(z_rest) if z_rest > 0 else -math.inf
        entropy = lse - z_mean / z  # H = log Z - E[logit], in nats
        kept_logits, kept_ids = packed[7:7 + k].float(), packed[7 + k:7 + 2 * k].to(torch.int32)
        if chosen_logit >= kept_logits[-1].item():  # every larger logit is among the kept ones
            rank = int((kept_logits > chosen_logit).sum()) + 1
        else:  # sampled from the tail (a high temperature, no filter): count on the device
            rank = int((logits > logits[next_id]).sum()) + 1
        ids = kept_ids[:top_n].tolist()
        raws = [math.exp(v - lse) for v in packed[7:7 + top_n].tolist()]
        probs = packed[7 + 2 * k:].tolist()
        prob, raw_prob = head[1], e_chosen / z
        if token_id not in ids:  # the chosen token is always listed, even outside the top N
            ids, probs, raws = ids + [token_id], probs + [prob], raws + [raw_prob]
        top = [Candidate(i, self.tokenizer.piece(i), p, r) for i, p, r in zip(ids, probs, raws)]
        stored = StepLogits(kept_ids, kept_logits, rest, vocab)
        return next_id.view(1, 1), _Pick(token_id, prob, raw_prob, top, entropy, rank, stored)


def _generation_defaults(model_dir: Path) -> dict:
    """Sampling defaults from generation_config.json, restricted to settings we support."""
    path = model_dir / "generation_config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot read {path.name}: {e}") from None
    if not isinstance(data, dict):
        return {}
    keys = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_new_tokens")
    out = {k: data[k] for k in keys if isinstance(data.get(k), (int, float))}
    if data.get("do_sample") is False:
        out["temperature"] = 0.0
    return out


@dataclass
class _Pick:
    token_id: int
    prob: float
    raw_prob: float
    top: list[Candidate]
    entropy: float
    rank: int
    logits: StepLogits | None
