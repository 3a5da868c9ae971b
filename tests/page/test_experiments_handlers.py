"""The sampling experiments on a page offering two models, each checked at its handler: replay under another sampler order lists each pipeline in its own order; compare
across two vocabularies finds the divergence in the texts, not the ids."""

from helpers import plain
import re
from types import SimpleNamespace

import pytest

from inference.sampling.cutoffs import apply_min_p, apply_top_k, apply_top_p
from inference.sampling.dynamic import apply_temperature
from inference.sampling.params import SamplingParams
from inference.sampling.settings import BY_NAME, DEFAULT_ORDER
from inference.serving.engine import Engine
from inference.serving.models import Models
from ui.controls import Controls, shaping_values
from ui.handlers import Handlers

REQ = SimpleNamespace(session_hash="experiments")
# The stages these tests move, by setting name: the function and the setting's value name.
REFERENCE = {"temperature": apply_temperature, "top_k": apply_top_k, "top_p": apply_top_p, "min_p": apply_min_p}


@pytest.fixture
def h(tiny_engine, monkeypatch):
    monkeypatch.setattr(tiny_engine, "eos_ids", set())  # runs go to max new tokens (conftest.no_early_end)
    return Handlers(tiny_engine, top_n=5)


def run(h, **kw):
    c = Controls(**{"prompt": "The quick brown fox", "max_new_tokens": 4, "seed": "3", **kw})
    return list(h.run.generate(*c.values(), REQ))[-1]["record"]


def table_after(md: str, title: str) -> list[tuple[str, int]]:
    """(stage cell, kept) of each row of the table that follows `title` in the markdown."""
    rows = []
    for line in md.split(title, 1)[1].lstrip().splitlines():
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[1][:1].isdigit():  # not the header nor its rule
            rows.append((cells[0], int(cells[1].replace(",", ""))))
    return rows


def kept_in_order(logits, values: dict, names: list[str]) -> list[int]:
    """The candidates left after each stage, applying the stages' own functions in `names`' order."""
    out = [logits.numel()]
    for n in names:
        logits = REFERENCE[n](logits, values[n])
        out.append(int(logits.isfinite().sum()))
    return out + out[-1:]  # the final distribution: what the last stage left


@pytest.mark.parametrize("run_kw, replay_kw, replay_order", [
    (dict(temperature=1.5, top_p=0.5, min_p=0.1), dict(temperature=1.5, top_p=0.5, min_p=0.1), "min_p,top_p,temperature"),
    (dict(temperature=0.0), dict(temperature=0.0, min_p=0.1, top_k=5), "min_p,top_k,temperature"),
])
def test_replay_in_another_order_lists_each_pipeline_in_its_own_order(h, tiny_engine, run_kw, replay_kw, replay_order):
    rec = run(h, **run_kw)
    md = h.experiments.replay_step(rec, 1, *shaping_values(**replay_kw, sampler_order=replay_order))["replay_md"]
    assert md.startswith("**Step 1**")
    logits = tiny_engine.step_logits(rec.seen_before(1))
    run_values = {n: getattr(rec.params, n) for n in REFERENCE}
    replay = {**{n: BY_NAME[n].default for n in REFERENCE}, **replay_kw}
    shown = [n for n in DEFAULT_ORDER if n in SamplingParams(**replay).changed + rec.params.changed]
    ran = table_after(md, "**The run**, in its order:")
    again = table_after(md, "**The replay**, in its order:")
    # Each column reads top to bottom as its pipeline ran: the default order for the run.
    assert [k for _, k in ran] == kept_in_order(logits, run_values, shown)
    order = replay_order.split(",")
    assert [k for _, k in again] == kept_in_order(logits, replay, sorted(shown, key=order.index))
    for rows in (ran, again):
        assert [k for _, k in rows] == sorted((k for _, k in rows), reverse=True)  # a filter only removes
    # A stage a pipeline leaves at its neutral value is said to be off, in its own table.
    assert [name.endswith("(off)") for name, _ in ran[1:-1]] == [n not in rec.params.changed for n in shown]
    assert not any(name.endswith("(off)") for name, _ in again)


def test_replay_in_the_same_order_keeps_one_table(h):
    rec = run(h, temperature=1.5, top_p=0.5)
    md = h.experiments.replay_step(rec, 1, *shaping_values(temperature=1.0, top_p=0.5))["replay_md"]
    assert "**The run**" not in md and "| kept (run) |" in md and "| kept (replay) |" in md



@pytest.fixture(scope="module")
def two_vocabularies(tiny_dirs, tmp_path_factory):
    """Handlers over "mha" (sentencepiece) and "bpe" (a byte-level BPE): two tokenizers that
    split the same text into different ids."""
    from gguf_files import train_bpe_tokenizer_json
    from tiny_models import TRAIN_TEXT, make_tiny_model
    bpe = make_tiny_model(tmp_path_factory.mktemp("vocab"), "gqa_tied", dir_name="bpe",
                          tokenizer_json=train_bpe_tokenizer_json(TRAIN_TEXT, 400))
    dirs = {**tiny_dirs, "bpe": bpe}
    models = Models(["mha", "bpe"], lambda spec, pool_mib: Engine.from_hf_dir(
        dirs[spec], device="cpu", dtype="float32", kv_pool_mib=pool_mib or 8), needs=lambda spec: 1)
    with models:
        yield Handlers(models.engine(), models=models)


def forced(h, a_text: str, b_text: str) -> dict:
    """Compare A/B across the two vocabularies, each run held to its text by a regular expression."""
    c = Controls(prompt="The quick", temperature=0.0, max_new_tokens=20, seed="1", constraint="regex",
                 constraint_text=re.escape(a_text))
    return h.experiments.compare(*c.values(), *shaping_values(temperature=0.0, constraint="regex",
                                                  constraint_text=re.escape(b_text)), "bpe", REQ)


def parting(out: dict) -> str:
    """The comparison after its first paragraph, which lists what B changes (here B's model and
    constraint text, where they differ)."""
    differs, rest = plain(out["compare_md"]).split("\n\n", 1)
    assert differs.startswith("**B differs from A in") and "Model: mha → bpe" in differs
    return rest


def step_texts(out: dict, run: str) -> list[str]:
    return [text for text, _ in out[f"out_{run}"]]


def test_compare_across_vocabularies_finds_the_same_text_the_same(two_vocabularies):
    out = forced(two_vocabularies, "the fox", "the fox")
    a, b = step_texts(out, "a"), step_texts(out, "b")
    assert "".join(a) == "".join(b) == "the fox" and len(a) != len(b)  # the same text, other tokens
    assert parting(out).startswith("**A and B produced the same text** (their tokenizers differ")
    assert "divergence" not in out["compare_md"] and out["bars_a"] == out["bars_b"] == ""
    # No chart of the two models per step: the note says why.
    assert out["compare_chart"]["visible"] is False and "their tokenizers differ" in out["compare_md"]


def test_compare_across_vocabularies_finds_where_the_texts_differ(two_vocabularies):
    out = forced(two_vocabularies, "the quick fox", "the quiet fox")
    char = 7  # "the qui" is the same in both
    summary = parting(out)
    assert summary.startswith(f"**Their texts first differ at character {char}** (their tokenizers differ")
    for run in ("a", "b"):
        texts = step_texts(out, run)
        marked = [i for i, (_, label) in enumerate(out[f"out_{run}"]) if label == "diverges here"]
        # The step marked holds the character: the text before it ends at or before `char`, and with it past.
        assert len(marked) == 1 and len("".join(texts[:marked[0]])) <= char < len("".join(texts[:marked[0] + 1]))
        assert f"at {run.upper()}'s step {marked[0]}, {run.upper()} chose **" in summary
        assert out[f"bars_{run}"] and f"{run.upper()} at step {marked[0]}" in plain(out[f"bars_{run}"])


def test_compare_across_vocabularies_says_which_run_stopped(two_vocabularies):
    out = forced(two_vocabularies, "the fox", "the fox jumps")
    assert parting(out).startswith("**Same text until character 7, where A stopped**")
    assert out["bars_a"] == "" and out["bars_b"]
