"""The glossary (ui/glossary.py): every term the page prints that is not everyday English (a
label, a column header, a unit, an abbreviation) has a short definition, and the model card, the
bars, the statistics and the lesson mark each term they print with it. The terms are found in
what the page prints by this test's own rules (acronyms, mixed capitals, Greek letters, units,
the sampling filters' names and a list of the field's words), not by the glossary's: a term the
glossary lacks is caught. The browser's side (hover, tap, focus, screen readers) is
test_glossary_browser.py."""

from __future__ import annotations

import html
import re
from types import SimpleNamespace

import gradio as gr
import pytest

from inference.lesson.explain import explain
from inference.lesson.roofline import Roofline
from ui import glossary
from ui.controls import Controls
from ui.layout import build_ui

REQ = SimpleNamespace(session_hash="glossary")
# The field's words a newcomer does not know, whatever their spelling: this test's list.
JARGON = ("logit", "softmax", "entropy", "perplexity", "surprisal", "prefill", "decode", "embedding", "quantized",
          "residual", "roofline", "tokenizer", "token", "greedy", "beam search", "beams", "drafter",
          "speculative decoding", "vocab", "logit lens", "sliding window", "causal mask", "masked mass",
          "chi-square", "p-value", "degrees of freedom", "arithmetic intensity", "bandwidth", "attention",
          "head dim", "log p", "seed", "temperature", "sampler order", "constraint", "byte token", "control token",
          "chat template", "context window", "KV cache", "parameters", "activations", "latency", "logit bias",
          "repetition penalty", "presence penalty", "frequency penalty", "min-p", "top-k", "top-p", "typical-p",
          "nats", "forbidden", "replay", "pre-norm", "full attention", "prompt lookup", "early exit",
          "acceptance rate", "length penalty", "max new tokens", "stop strings", "system prompt", "fork step",
          "top-1 agreement", "dequantized", "quantization lens", "bytes per token")
RULES = (
    r"\b[A-Z][A-Z0-9_]*[A-Z0-9](?:-\d+)?s?\b(?!/)",  # acronyms: KV, TTFT, GQA, Q4_K, UTF-8
    r"\b[a-zA-Z]*[a-z][A-Z][A-Za-z0-9]*\b",  # mixed capitals: RoPE, RMSNorm, SwiGLU, MiB, kFLOPs
    r"\b[A-Z][A-Za-z]* [\u03b1-\u03c9]\b|[A-Za-z]+-n?[\u03b1-\u03c9]|[\u03b1-\u03c9]",  # Greek: RoPE θ, Mirostat τ, top-nσ, μ
    r"(?<=\d )(?:ms|tok/s|[kMGT]?B/s|[kMGT]?FLOP/s)(?![\w/])",  # units after a number
)
# Printed words these rules catch that are everyday English or a name, not a term: the runs of
# A and B, a model's and a library's names, letters of a formula.
NOT_TERMS = {"A", "B", "AB", "I", "OK", "T", "P", "K", "W", "L", "N", "M", "Python", "PyPI", "NVIDIA", "Meta",
             "Google", "Gemma", "SmolLM2", "LLaMA", "vLLM", "ID", "BIAS", "ASCII", "HTML", "URL", "API"}


def printed_terms(text: str) -> set[str]:
    """The terms a text (HTML or Markdown) prints, by this test's rules: its words outside token
    pieces, quoted text and code."""
    text = re.sub(r"<(code|q|sub|script|style|svg|a)\b.*?</\1>", " ", text, flags=re.S)  # (a link: its panel's label says it)
    text = re.sub(r"<span class='tl-(?:tk|tok|c|pop)[^']*'.*?</span>", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)  # Markdown code
    text = re.sub(r"<ol class='lesson-steps'.*?</ol>", " ", text, flags=re.S)  # the chapters' titles: each its own
    words = html.unescape(re.sub(r"<[^>]+>", " ", text))
    found = {m.group(0).strip() for rule in RULES for m in re.finditer(rule, words)}
    found |= {w for w in JARGON if re.search(rf"(?<![\w-]){re.escape(w)}", words, re.I)}
    return {t for t in found if t not in NOT_TERMS and not t.isdigit()}


def page_texts(demo) -> dict[str, str]:
    """What the built page prints before any run: every component's label, help line and text."""
    out = {}
    for block in demo.blocks.values():
        name = getattr(block, "elem_id", None) or type(block).__name__
        for attr in ("label", "info", "value"):
            v = getattr(block, attr, None)
            if isinstance(v, str) and (attr != "value" or isinstance(block, (gr.Markdown, gr.HTML, gr.Button))):
                if block.__class__.__name__ == "HTML" and getattr(block, "elem_id", "") == "glossary-defs":
                    continue
                out[f"{name}.{attr}"] = out.get(f"{name}.{attr}", "") + " " + v
    return out


@pytest.fixture(scope="module")
def blocks(tiny_engine):
    """The card, a run's bars and statistics, the KV formula and every chapter of the lesson, as
    the page renders them on the tiny model."""
    from ui.handlers import Handlers
    from ui.lesson.render import chapter_html
    from ui.shared import card, kv, view
    h = Handlers(tiny_engine, top_n=8)
    c = Controls(prompt="The quick brown fox", max_new_tokens=6, seed="3", temperature=1.0, logit_bias="5:2")
    rec = list(h.run.generate(*c.values(), REQ))[-1]["record"]
    lesson = explain(tiny_engine, "The quick brown fox", {}, roofline=Roofline(1e10, 1e9, "cpu", "float32", "x"),
                     steps=4, seed=1)
    data = {"model": lesson.model, "prompt": lesson.prompt, "chapters": lesson.chapters, "mode": "completion",
            "follow": "top", "seed": 1}
    out = {"card": card.model_card(tiny_engine.describe()), "bars": h.page.bars(rec.steps[1], rec=rec, pick=True),
           "stats": view.stats_markdown(tiny_engine.describe(), rec), "kv": kv.kv_formula(tiny_engine.describe(), 20),
           **{f"lesson {c['key']}": chapter_html(data, i) for i, c in enumerate(lesson.chapters)}}
    from ui.experiments.render import compare_summary
    from ui.run_state import divergence
    out["compare"] = compare_summary(rec, rec, divergence(rec, rec))
    lens = {}  # the quantization lens's summary, table, charts' legend, forks and every step's numbers
    for o in h.lens.lens("", "The quick brown fox", ["q8_0", "q4_0"], 4, False, request=REQ):
        lens.update(o)
    out["lens"] = lens["lens_md"] + lens["lens_view"]
    # A constrained run: its bars and statistics say what the constraint cost.
    cc = Controls(prompt="The quick brown fox", max_new_tokens=4, seed="3", temperature=1.0, constraint="regex",
                  constraint_text="[a-z ]{3,40}")
    constrained = list(h.run.generate(*cc.values(), REQ))[-1]["record"]
    out["constrained bars"] = h.page.bars(constrained.steps[1], rec=constrained, pick=True)
    out["constrained stats"] = view.stats_markdown(tiny_engine.describe(), constrained)
    # A scored text's token clicked: the choices to run from it.
    scored = h.text_score.score_text_shown("The quick brown fox", "", REQ)
    out["run from a text"] = h.text_score.pick_token(scored["score_state"], SimpleNamespace(index=2))
    return out, h


@pytest.fixture(scope="module")
def other_cards(tmp_path_factory, sp_model_bytes, tiny_dirs):
    """The card of a Gemma 3 (sliding layers, its own RoPE bases), of a model computing on a GGUF
    file's Q4_K blocks, and of a model behind a vLLM server."""
    from gguf_files import write_gguf
    from inference.loading.gguf_import import import_gguf
    from inference.serving.engine import Engine
    from tiny_families import make_family_model
    from ui.shared import card as render
    root = tmp_path_factory.mktemp("glossary")
    d, _ = make_family_model(root, "gemma3_text", sp_model_bytes)
    with Engine.from_hf_dir(d, device="cpu", dtype="float32") as gemma:
        out = {"gemma card": render.model_card(gemma.describe())}
    from tiny_models import make_tiny_model
    src = make_tiny_model(root, "mha", sp_model=sp_model_bytes, hidden_size=256, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=256)  # k-quant blocks hold 256 values
    write_gguf(src, root / "m.gguf", "Q8_0", kquant="Q4_K")
    with Engine.from_hf_dir(import_gguf(root / "m.gguf", root / "imported", progress=False)) as blocks:
        out["GGUF card"] = render.model_card(blocks.describe())
    from inference.remote.discovery import server_info
    from inference.model.config import ModelConfig
    cfg = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, n_layers=30, n_heads=9, n_kv_heads=3)
    out["served card"] = render.model_card(server_info("M", "http://127.0.0.1:8000/v1", 2048, "raw", "probed at start",
                                                       cfg, "/models/M/config.json", None, 4, "the server's pool"))
    return out


def test_every_term_the_page_prints_has_a_definition(tiny_engine, blocks, other_cards):
    texts, h = blocks
    demo = build_ui(tiny_engine, h)
    everything = {**page_texts(demo), **texts, **other_cards}
    missing = {}
    for where, text in everything.items():
        for term in printed_terms(text):
            if glossary.lookup(term) is None:
                missing.setdefault(term, where)
    assert missing == {}, f"terms printed without a glossary entry (term: where): {missing}"


def test_the_card_the_bars_and_the_lesson_mark_each_term_they_print(blocks, other_cards):
    texts, _ = blocks
    unmarked = {}
    for where, text in {**texts, **other_cards}.items():
        marked = set(re.findall(r"<span class='tl-term'[^>]*data-term='([^']*)'", text))
        marked = {html.unescape(m).lower() for m in marked}
        for term in printed_terms(text):
            entry = glossary.lookup(term)
            # Marked as itself, or within a longer term marked (RoPE within RoPE θ, vocab within vocabulary).
            if entry is not None and not any(term.lower() in m or entry.lower() in m for m in marked):
                unmarked.setdefault(where, set()).add(term)
    assert unmarked == {}, f"terms printed but not marked with their definition: {unmarked}"


def test_the_rules_catch_a_term_without_an_entry():
    # A made-up abbreviation, a Greek-letter setting and a unit: each found, none in the glossary.
    found = printed_terms("<p>the ZQX score · Foo ψ</p> and Zeta λ")
    assert "ZQX" in found and "Zeta λ" in found and glossary.lookup("ZQX") is None
    assert printed_terms("<code>KV</code> <q>RoPE</q>") == set()  # token pieces and quoted text are not the page's words


def test_each_definition_is_found_by_its_id_and_the_settings_come_from_their_schema():
    from inference.sampling.settings import BY_NAME
    defs = glossary.definitions_html()
    ids = re.findall(r"id='([^']+)'", defs)
    assert len(ids) == len(set(ids)) == len(glossary.entries())
    marked = glossary.term_html("KV cache")
    described = re.search(r"aria-describedby='([^']+)'", marked).group(1)
    assert f"id='{described}'" in defs
    assert glossary.define("Top-p").startswith(BY_NAME["top_p"].help[:1].upper() + BY_NAME["top_p"].help[1:20])
    for word in ("KV heads", "RoPE θ", "kFLOPs", "top-k", "Top-k", "tok/s", "TTFT", "Q4_K", "log p", "nats"):
        assert glossary.lookup(word) is not None, word
    with pytest.raises(KeyError):
        glossary.term_html("ZQX")
