"""What a constraint costs, on the page: a constrained run's bars give each step's KL(constrained ‖
free), the chosen token's free p and the free distribution's top tokens the constraint removed, and
its statistics the output's log p with and without the constraint's renormalisation and a table of
every step. The printed numbers are checked against an independent computation: transformers'
float32 logits over the run's tokens, the regular expression's allowed tokens written out from
its definition (the bytes of each token), and the distributions and KL in numpy."""

from __future__ import annotations

import html
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from helpers import plain
from ui.controls import Controls
from ui.format import cost_html
from ui.handlers import Handlers
from ui.shared import view

pytest.importorskip("xgrammar")
transformers = pytest.importorskip("transformers")

REGEX = "[a-z ]{3,40}"
LETTERS = set(b"abcdefghijklmnopqrstuvwxyz ")
REQ = SimpleNamespace(session_hash="cost")
T = 0.8
NUMBER = r"\d+\.\d+(?:e-\d+)?|\de-\d+"  # as fmt_p prints a probability: 0.1234, 3.2e-05


def allowed_by_regex(tokenizer, text_so_far: str) -> np.ndarray:
    """(vocab,) bool: the tokens REGEX allows after `text_so_far`, from its definition: a token
    whose bytes are all [a-z ] and keep the text within 40 characters; an end-of-sequence token
    once the text is 3 or more; never a control token."""
    n = len(text_so_far)
    out = np.zeros(tokenizer.vocab_size, dtype=bool)
    for i, b in enumerate(tokenizer.token_bytes):
        if tokenizer.is_control(i):
            out[i] = i in tokenizer.eos_ids and n >= 3
        else:
            out[i] = bool(b) and set(b) <= LETTERS and n + len(b) <= 40
    return out


def words(page_html: str) -> str:
    """The words and numbers the page shows (p, not the log p the page's switch would show)."""
    text = re.sub(r"<span class='tl-lp'>[^<]*</span>", "", plain(page_html))
    return html.unescape(re.sub(r"<[^>]+>", "", text))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x[np.isfinite(x)].max())
    return e / e.sum()


@pytest.fixture(scope="module")
def run(tiny_engine, tiny_dirs):
    """A constrained run at temperature 0.8 (no cutoff), its page's bars and statistics, and per
    step the reference's free and constrained distributions."""
    h = Handlers(tiny_engine, top_n=8)
    c = Controls(prompt="The quick brown fox", max_new_tokens=8, seed="3", temperature=T, top_k=0, top_p=1.0,
                 min_p=0.0, constraint="regex", constraint_text=REGEX)
    rec = list(h.run.generate(*c.values(), REQ, None))[-1]["record"]
    ref = transformers.LlamaForCausalLM.from_pretrained(tiny_dirs["gqa_tied"], dtype=torch.float32).eval()
    ids = rec.prompt_ids + [s.token_id for s in rec.steps]
    with torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0].double().numpy()  # (T, vocab)
    tok, n = tiny_engine.tokenizer, len(rec.prompt_ids)
    dists = []
    for k, s in enumerate(rec.steps):
        x = logits[n - 1 + k] / T
        allowed = allowed_by_regex(tok, tok.decode([t.token_id for t in rec.steps[:k]]))
        dists.append((softmax(x), softmax(np.where(allowed, x, -np.inf)), allowed))
    return h, rec, dists


def test_each_steps_bars_give_the_kl_the_free_p_and_the_top_tokens_removed(run):
    h, rec, dists = run
    assert rec.steps and re.fullmatch(r"[a-z ]*", rec.done.text)
    for s, (free, constrained, allowed) in zip(rec.steps, dists):
        on = constrained > 0
        kl = float((constrained[on] * np.log(constrained[on] / free[on])).sum())
        assert kl == pytest.approx(-math.log(free[allowed].sum()), rel=1e-9)  # (the constraint first)
        bars = words(h.page.bars(s, rec=rec))
        shown = float(re.search(rf"KL\(constrained ‖ free\) = ({NUMBER}) nats", bars).group(1))
        assert abs(shown - kl) <= 1e-4 + 5e-5 * max(1, kl), (s.step, shown, kl)  # 4 decimals, float32 logits
        free_p = float(re.search(rf"gives the chosen token p = ({NUMBER})", bars).group(1))
        assert abs(free_p - free[s.token_id]) <= 1e-4
        # The free distribution's top 8, those the constraint forbids, most likely first.
        top = np.argsort(-free, kind="stable")[:8]
        expected = [int(i) for i in top if not allowed[i]]
        assert [c.id for c in s.constraint_removed] == expected
        assert words(cost_html(s)) in bars  # the bars carry the step's cost lines
        listed = words(cost_html(s)).split("Top tokens of the free distribution it removed:")
        assert (len(listed) == 2) == bool(expected)
        for c in s.constraint_removed:
            assert abs(c.prob - free[c.id]) <= 1e-4
        if expected:  # each with its free p, as the page prints it
            assert len(listed[1].split(" · ")) == len(expected)


def test_the_statistics_give_the_outputs_log_p_with_and_without_the_renormalisation(run, tiny_engine):
    h, rec, dists = run
    stats = view.stats_markdown(tiny_engine.describe(), rec)
    with_c = sum(math.log(c[s.token_id]) for s, (_, c, _) in zip(rec.steps, dists))
    free = sum(math.log(f[s.token_id]) for s, (f, _, _) in zip(rec.steps, dists))
    text = words(stats)
    shown_c = float(re.search(r"\| log p, renormalised \| (-?[0-9.]+) \|", text).group(1))
    shown_f = float(re.search(r"\| log p, free distribution \| (-?[0-9.]+) \|", text).group(1))
    assert abs(shown_c - with_c) <= 1e-3 and abs(shown_f - free) <= 1e-3, (shown_c, with_c, shown_f, free)
    assert shown_c > shown_f  # the constraint first: each allowed token's p grows by 1 / the allowed mass
    # The table of every step: its KL, p and free p as the bars print them.
    rows = re.findall(r"<tr><td>(\d+)</td>", stats)
    assert [int(r) for r in rows] == [s.step for s in rec.steps]
    for s, (f, c, allowed) in zip(rec.steps, dists):
        row = re.search(rf"<tr><td>{s.step}</td>(.*?)</tr>", stats).group(1)
        cells = [words(x) for x in re.findall(r"<td[^>]*>(.*?)</td>", row)]  # token, masked mass, KL, p, free p, removed
        assert abs(float(cells[2]) - -math.log(f[allowed].sum())) <= 2e-4
        assert abs(float(cells[3]) - c[s.token_id]) <= 1e-4 and abs(float(cells[4]) - f[s.token_id]) <= 1e-4


def test_an_unconstrained_run_shows_none_of_it(tiny_engine):
    h = Handlers(tiny_engine, top_n=8)
    rec = list(h.run.generate(*Controls(prompt="The quick brown fox", max_new_tokens=3, seed="3").values(),
                              REQ, None))[-1]["record"]
    assert rec.done.logprob is None and all(s.constraint_kl is None for s in rec.steps)
    assert "KL" not in h.page.bars(rec.steps[0], rec=rec)
    stats = view.stats_markdown(tiny_engine.describe(), rec)
    assert "renormalised" not in stats and "cost-steps" not in stats


def test_a_greedy_step_whose_free_choice_was_forbidden_costs_infinitely(tiny_engine, tiny_dirs):
    """Greedy: the free distribution is the one-hot of the argmax without the constraint; where
    the constraint forbids that token, KL is ∞ and the free p of the chosen token 0 (said so)."""
    h = Handlers(tiny_engine, top_n=8)
    c = Controls(prompt="The quick brown fox", max_new_tokens=6, seed="3", temperature=0.0,
                 constraint="regex", constraint_text="[0-9]{6}")
    rec = list(h.run.generate(*c.values(), REQ, None))[-1]["record"]
    ref = transformers.LlamaForCausalLM.from_pretrained(tiny_dirs["gqa_tied"], dtype=torch.float32).eval()
    ids = rec.prompt_ids + [s.token_id for s in rec.steps]
    with torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0]
    n = len(rec.prompt_ids)
    for k, s in enumerate(rec.steps):
        argmax = int(logits[n - 1 + k].argmax())
        bars = words(h.page.bars(s, rec=rec))
        if argmax != s.token_id:
            assert "KL(constrained ‖ free) = ∞ nats (it can draw a token the free distribution cannot)" in bars
            assert [c.id for c in s.constraint_removed] == [argmax]
        else:
            assert "KL(constrained ‖ free) = 0.0000 nats" in bars
    assert any(int(logits[n - 1 + k].argmax()) != s.token_id for k, s in enumerate(rec.steps))
    assert "| log p, free distribution | −∞ (a token of it had p 0 there) |" in words(
        view.stats_markdown(tiny_engine.describe(), rec))


def test_a_constrained_run_kept_in_the_browser_comes_back_with_what_its_constraint_cost(tiny_engine):
    """The saved work goes to the browser in Gradio's messages (orjson, which writes an infinity as
    null): a greedy run's ∞ KL and −∞ free log p, and the removed tokens, read back as they were."""
    orjson = pytest.importorskip("orjson")
    from ui.work.saved import read_run, run_json
    h = Handlers(tiny_engine, top_n=8)
    c = Controls(prompt="The quick brown fox", max_new_tokens=4, seed="3", temperature=0.0,
                 constraint="regex", constraint_text="[0-9]{6}")
    rec = list(h.run.generate(*c.values(), REQ, None))[-1]["record"]
    assert any(math.isinf(s.constraint_kl) for s in rec.steps) and math.isinf(rec.done.free_logprob)
    data = orjson.loads(orjson.dumps(run_json(rec)))
    back = read_run(data, lambda c, seed, hist: h.page.runs.prepare(Controls(**c), seed, hist), tiny_engine.cfg.vocab_size)
    assert [(s.constraint_kl, s.free_prob, s.constraint_removed) for s in back.steps] == \
           [(s.constraint_kl, s.free_prob, s.constraint_removed) for s in rec.steps]
    assert (back.done.logprob, back.done.free_logprob) == (rec.done.logprob, rec.done.free_logprob)
    assert [h.page.bars(s, rec=back) for s in back.steps] == [h.page.bars(s, rec=rec) for s in rec.steps]
    assert view.stats_markdown(tiny_engine.describe(), back) == view.stats_markdown(tiny_engine.describe(), rec)


def test_a_probability_just_under_1_never_reads_as_1():
    # A constraint that removed 0.99997 of the raw probability did not remove all of it: every
    # panel's one formatter says so (and a chart's tooltip parses the same number).
    from ui.format import fmt_p, plotted_p
    assert fmt_p(0.99997) == "0.99997" and fmt_p(0.999968) == "0.99997" and fmt_p(1.0) == "1.0000"
    assert fmt_p(0.99994) == "0.9999" and fmt_p(0.5) == "0.5000" and fmt_p(1e-5) == "1e-05"
    assert plotted_p(0.99997) == 0.99997 and fmt_p(float.fromhex("0x1.fffffep-1")) == "0.9999999"  # float32 below 1
