"""Scoring a text: teacher-forced log-probabilities of its tokens (a continuation's, a prompt's,
a typed text's), each from one forward pass of the engine's model. The local engine's
(engine.Engine), kept apart from generation."""

from __future__ import annotations

import torch

from inference.errors import InputError, check_unicode
from inference.events import PromptToken, TokenScore, token_scores
from inference.request import check_ids

# Prompt positions read and scored at once when every position's are needed: 256 rows of
# a 49,152-token vocabulary are 48 MiB of float32.
PROMPT_ROWS = 256


class Scoring:
    """The engine's scoring methods: they read its model, tokenizer and config, and run their
    forward passes as the engine's own work (close() waits for them)."""

    def score(self, context_ids: list[int], continuation: str) -> list[tuple[int, str, float]]:
        """Teacher-forced log-probabilities of continuation's tokens after context_ids, from one
        forward pass: [(token id, piece, log p)]."""
        if not isinstance(continuation, str):
            raise InputError("the continuation must be text")
        if not context_ids:
            raise InputError("the context is empty: scoring needs at least one token before")
        check_ids(context_ids, self.cfg.vocab_size, self.cfg.max_seq_len)
        room = self.cfg.max_seq_len - len(context_ids)
        self.check_fits("the continuation is", len(continuation), room,
                        f"the context window has {max(room, 0)} of its {self.cfg.max_seq_len}")
        check_unicode(continuation, "the continuation")
        cont = self.tokenizer.encode_continuation(continuation)
        if not cont:
            raise InputError("the continuation is empty")
        ids = context_ids + cont
        if len(ids) > self.cfg.max_seq_len:
            raise InputError(f"context and continuation are {len(ids)} tokens but the context window "
                             f"is {self.cfg.max_seq_len}")
        scored = self.prompt_logprobs(ids)[len(context_ids) - 1:]
        return [(t.token_id, self.tokenizer.piece(t.token_id), t.logprob) for t in scored]

    def prompt_logprobs(self, ids: list[int], top_n: int = 0) -> list[PromptToken]:
        """Every token of ids after the first, teacher-forced: its log-probability given the
        tokens before it, its rank and the top_n candidates there (the model's own
        distribution). The prompt is read PROMPT_ROWS positions at a time into one cache (a
        chunked prefill), each chunk's logits made and left before the next: besides the
        prompt's keys and values, what the pass holds is one chunk's activations, attention
        scores (chunk × positions so far) and logits (chunk × vocabulary), whatever the
        prompt's length (read whole, 7,580 tokens held 549 MiB more at the peak)."""
        check_ids(ids, self.cfg.vocab_size, self.cfg.max_seq_len)
        top_n = max(0, min(top_n, self.cfg.vocab_size))
        out: list[PromptToken] = []
        with self._work(), torch.inference_mode():
            tokens = torch.tensor([ids], device=self.device)  # (1, T)
            cache = self.model.new_cache(len(ids))
            for a in range(0, len(ids) - 1, PROMPT_ROWS):
                b = min(a + PROMPT_ROWS, len(ids) - 1)
                # The hidden state at position i predicts token i + 1 (the last token predicts none).
                h = self.model(tokens[:, a:b], cache, a, all_logits=True, head=False)[0]  # (b - a, hidden)
                logp = self.model.head(h).log_softmax(-1)  # (b - a, vocab)
                target = tokens[0, a + 1:b + 1, None]  # (b - a, 1)
                picked = logp.gather(-1, target)  # (b - a, 1)
                ranks = ((logp > picked).sum(-1) + 1).tolist()
                top_v, top_i = logp.topk(top_n, dim=-1) if top_n else (logp[:, :0], target[:, :0])
                for j, (lp, rank, tv, ti) in enumerate(zip(picked[:, 0].tolist(), ranks, top_v.tolist(),
                                                           top_i.tolist())):
                    out.append(PromptToken(ids[a + j + 1], lp, rank, list(zip(ti, tv))))
                del h, logp
            cache.free()
        return out

    def text_ids(self, text: str) -> tuple[list[int], int]:
        """The ids a typed text is fed as (with the BOS token where the model adds one), and
        how many come before the text's own tokens (1 with a BOS, else 0). A text that cannot
        fit the context window is refused by its length before it is tokenized."""
        if not isinstance(text, str) or not text:
            raise InputError("the text is empty")
        n = self.cfg.max_seq_len
        self.check_fits("the text is", len(text), n, f"the context window is {n}")
        check_unicode(text, "the text")
        ids = self.tokenizer.encode(text)
        bos = self.tokenizer.bos_id
        return ids, int(bos is not None and ids[:1] == [bos])

    def score_ids(self, ids: list[int], top_n: int = 10) -> list[TokenScore]:
        """Every token of ids given the tokens before it, from one forward pass: its log
        probability in the model's own distribution, its rank there (1 = the top choice) and the
        top_n tokens the model preferred. The first token has nothing before it: None."""
        if not ids:
            raise InputError("the text is empty")
        if len(ids) > self.cfg.max_seq_len:
            raise InputError(f"the text is {len(ids)} tokens but the context window is {self.cfg.max_seq_len}; "
                             f"shorten it by at least {len(ids) - self.cfg.max_seq_len} tokens")
        scored = self.prompt_logprobs(ids, top_n) if len(ids) > 1 else []
        piece = self.tokenizer.piece
        named = {j for p in scored for j, _ in p.top} | set(ids)
        return token_scores(ids, scored, {j: piece(j) for j in named})
