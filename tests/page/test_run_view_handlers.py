"""The run's view at the handlers: the output's popovers (raw and final numbers, coloured by
either), the output above its bars, the tokens view and the context line, the logit lens's
labels, raw and final as one number where nothing is filtered, and the KV chart (the browser's
checks are in test_run_view_browser.py)."""

import ui.shared.charts as charts_panel
import ui.format as fmt_module
import dataclasses
import re
from types import SimpleNamespace

import pytest

from helpers import page_run
import torch

from inference.sampling.params import SamplingParams
from inference.serving.step_stats import RowSampling, pick_rows
from ui.format import bars_html, fmt_p, token_label
from ui.inside.render import lens_html
from ui.controls import Controls
from ui.handlers import Handlers
from ui.layout import build_ui
from ui.run_state import RunRecord
import ui.shared.kv as kv_panel
import ui.shared.view as run_render

REQ = SimpleNamespace(session_hash="run-view")


def run(h, **kw):
    return page_run(h, REQ, **kw)


def popover_rows(pop: str) -> list[list[str]]:
    """The popover's rows (token, raw, final) as the numbers it shows in p mode."""
    rows = re.split(r"<span class='tl-alt[' ]", pop)[1:]  # [0]: the head line and the column names
    return [re.findall(r"<span class='tl-p'>(.*?)</span>", r) for r in rows]


def test_temperature_zero_popover_shows_raw_and_final_and_colours_by_either(h, tiny_engine):
    rec = run(h, temperature=0.0)
    out = run_render.output_html(rec, tiny_engine.tokenizer)
    chips = run_render.output_chips(rec, tiny_engine.tokenizer)
    pops = [p.split("data-i=")[0] for p in out.split("<span class='tl-pop'")[1:]]
    assert len(pops) == len(chips)
    for chip, pop in zip(chips, pops):
        step = rec.steps[chip.steps[0]]
        numbers = popover_rows(pop)
        shown = step.top[:5] + [c for c in step.top[5:] if c.id == step.token_id]
        # Every alternative: the model's raw probability beside the final one (greedy: 1 and 0).
        assert numbers == [[fmt_p(c.raw_prob), fmt_p(c.prob)] for c in shown]
        assert any(c.id != step.token_id and c.raw_prob >= 1e-4 for c in shown)  # raw alternatives show
        assert "<span class='tl-pop-cols'><span>token</span><span>raw</span><span>final</span>" in pop
    # Each chip carries its raw bucket too: colouring by raw differs from greedy's all-1 final.
    raw_classes = re.findall(r"class='tl-t tl-b0 tl-rb(\w)'", out)
    assert len(raw_classes) == len(chips)
    assert raw_classes == [fmt_module.bucket_class(c.raw)[4:] for c in chips]
    assert set(raw_classes) != {"0"}  # the tiny model is not that sure of its greedy tokens


def test_output_and_bars_in_view_together_wide_layout(tiny_engine):
    """The wide layout puts the output over its bars in one column (the browser test measures it)."""
    page = build_ui(tiny_engine).tokenlab_page
    right = page["output"].parent
    while right is not None and getattr(right, "elem_id", None) != "right-col":
        right = right.parent
    assert right is not None
    inside = []

    def walk(block):
        inside.append(getattr(block, "elem_id", None))
        for child in getattr(block, "children", []):
            walk(child)
    walk(right)
    assert inside.index("output") < inside.index("topk")
    assert "settings" not in inside and "prompt" not in inside


def test_tokens_view_and_context_line_agree_before_the_first_run(tiny_engine, h):
    page = build_ui(tiny_engine).tokenlab_page
    context, tokens = page["context_count"].value, page["tokens"].value
    ids = tiny_engine.prompt_ids(h.page.defaults.prompt, h.page.defaults.mode == "chat", "", [])
    assert re.search(r"Context: \*\*(\d+)\*\* prompt tokens", context).group(1) == str(len(ids))
    assert f"Prompt as it will be fed: {len(ids)} tokens" in tokens
    assert [int(i) for i in re.findall(r"<sub>(\d+)</sub>", tokens)] == ids
    # Typing: both follow one tokenization; after a run the view is that run's, said so.
    typed = h.run.preview("Once upon a time", "completion", "", 8)
    n = len(tiny_engine.prompt_ids("Once upon a time", False, "", []))
    assert f"**{n}** prompt tokens" in typed["context_count"] and f"fed: {n} tokens" in typed["tokens"]
    assert "tokens" not in h.run.preview("Once upon a time", "completion", "", 8, None, None, rec=run(h))


def test_logit_lens_labels_an_invisible_token_visibly():
    tok = SimpleNamespace(piece=lambda i: {0: "\u00a0", 1: "a"}[i])
    lens = lens_html(SimpleNamespace(lens=[[(0, 0.5), (1, 0.25)]]), tok)
    cells = re.findall(r"<td>(.*?) <small>", lens)
    assert cells == [token_label("\u00a0"), "a"] and cells[0] == "⟨U+00A0⟩"
    # The bars label it the same way.
    step = SimpleNamespace(top=[SimpleNamespace(id=0, piece="\u00a0", raw_prob=0.5, prob=0.5, forbidden=False)],
                           token_id=0, step=0, piece="\u00a0", prob=0.5, raw_prob=0.5, rank=1, masked_mass=None)
    assert "⟨U+00A0⟩" in bars_html(step)


def test_raw_and_final_are_the_same_number_with_nothing_filtered(h, tiny_engine):
    rec = run(h, temperature=1.0, max_new_tokens=12)
    assert rec.params.plain
    for i, s in enumerate(rec.steps):
        assert s.prob == s.raw_prob and all(c.prob == c.raw_prob for c in s.top)
        bars = bars_html(s)
        for raw, final in re.findall(r"<span class='tl-p'>(.*?)</span>.*?<span class='tl-p'>(.*?)</span>",
                                     bars.split("tl-head")[1]):
            assert raw == final
        # The reference: a float64 softmax of the step's logits.
        logits = rec.logits_at(i, tiny_engine.step_logits)
        ref = logits.double().softmax(-1)
        assert s.raw_prob == pytest.approx(float(ref[s.token_id]), abs=1e-6)
    # Directly: a float32 softmax differs from the raw number in its last digits; the no-op row
    # reports the raw one, a filtered row its own renormalised distribution.
    torch.manual_seed(0)
    logits = torch.randn(2, 500) * 4
    rows = [RowSampling(SamplingParams(temperature=1.0), None, torch.Generator().manual_seed(1), 8),
            RowSampling(SamplingParams(temperature=1.0, top_k=3), None, torch.Generator().manual_seed(1), 8)]
    plain, filtered = pick_rows(logits, rows)
    assert all(p == r for _, p, r in plain.top) and plain.prob == plain.raw_prob
    assert sum(p for _, p, _ in filtered.top) == pytest.approx(1.0) and filtered.prob > filtered.raw_prob


def test_kv_chart_legend_has_a_line_for_each_entry_and_its_panel_says_mib(h):
    rec = run(h)
    frame = charts_panel.kv_frame(rec)
    lines = {name: tuple(g.MiB) for name, g in frame.groupby("series")}
    assert len(set(lines.values())) == len(lines)  # no entry whose line hides under another's
    # This run alone in the pool: its allocation is the pool's use, one line named for both.
    def pool_using(blocks):
        return dataclasses.replace(rec, steps=[dataclasses.replace(
            s, pool=dataclasses.replace(s.pool, blocks_used=blocks(s))) for s in rec.steps])
    alone = pool_using(lambda s: s.kv_cache_capacity_bytes // s.pool.bytes_per_block)
    assert set(charts_panel.kv_frame(alone).series) == {"used", "allocated = server pool, all runs"}
    crowded = pool_using(lambda s: 3 * s.kv_cache_capacity_bytes // s.pool.bytes_per_block)
    assert set(charts_panel.kv_frame(crowded).series) == {"used", "allocated", "server pool, all runs"}
    text = kv_panel.pool_markdown(rec.steps[-1]) + kv_panel.kv_formula(h.page.info, None, rec.steps[-1].kv_cache_bytes)
    assert "MiB" in text and not re.search(r"\d (k|M|G)B\b", text)


def test_a_bar_at_zero_names_the_stage_that_removed_it(h):
    """A candidate at final 0 says which stage removed it, the first that did.
    The reference is the raw probabilities themselves: with temperature 1 before them, top-k
    keeps the k most likely, and min-p (after it) those at least min_p × the most likely."""
    rec = run(h, temperature=1.0, top_k=3, min_p=0.3, max_new_tokens=6)
    seen = set()
    for step in rec.steps:
        top = sorted(step.top, key=lambda c: -c.raw_prob)  # the raw order: top-k's
        best = top[0].raw_prob
        for rank, c in enumerate(top, 1):
            want = "top_k" if rank > 3 else "min_p" if c.raw_prob < 0.3 * best - 1e-6 else ""
            if abs(c.raw_prob - 0.3 * best) < 1e-6:
                continue  # too close to call between two computations
            assert c.removed_by == want, (step.step, rank, c)
            assert (c.prob == 0) == bool(want)
            seen.add(want)
        bars = h.page.bars(step, rec=rec)
        assert bars.count("title='removed by the top-k stage") == sum(c.removed_by == "top_k" for c in step.top)
        assert bars.count("title='removed by the min-p stage") == sum(c.removed_by == "min_p" for c in step.top)
    assert seen == {"top_k", "min_p", ""}, seen
    # Greedy keeps one token: every other candidate says temperature 0.
    greedy = run(h, temperature=0.0, max_new_tokens=2).steps[0]
    assert all(c.removed_by == ("" if c.id == greedy.token_id else "temperature") for c in greedy.top)
    assert ">temperature 0<" in h.page.bars(greedy)
    # An unknown stage name (saved work read back) shows nothing of it.
    from ui.format import removed_mark
    assert removed_mark("<script>") == "" and removed_mark("") == ""


def test_the_page_before_a_run_shows_no_empty_boxes_and_titled_axes(tiny_engine, h):
    """No empty "Prompt as fed to the model" box before a run (the tokens view
    says what will be fed); once fed, it holds the start-of-text token the tokenizer put before
    the text (Gemma's <bos>, the tiny model's <s>), as the tokens list it; the latency chart
    names its axes and unit."""
    page = build_ui(tiny_engine).tokenlab_page
    assert page["prompt_view"].visible is False
    latency = page["latency"]
    assert latency.y_title == "time per token (ms)" and latency.x_title.startswith("step")
    begun = h.run.begin(*Controls(prompt="The quick", mode="completion", max_new_tokens=2).values())
    ids = tiny_engine.prompt_ids("The quick", False, "", [])
    bos = tiny_engine.tokenizer.piece(ids[0])
    assert tiny_engine.tokenizer.is_control(ids[0]) and bos == "<s>"  # the reference: the ids fed
    assert begun["prompt_view"] == {"value": bos + "The quick", "visible": True, "__type__": "update"}
    # Text that already holds it (a chat template that writes it) is not given a second one.
    from ui.shared.view import fed_text
    assert fed_text(tiny_engine.tokenizer, RunRecord(prompt_text="<s>Hi", prompt_ids=ids)) == "<s>Hi"
    assert fed_text(tiny_engine.tokenizer, RunRecord(prompt_text="Hi", prompt_ids=ids[1:])) == "Hi"


def test_the_two_models_chart_shows_only_with_two_models_compared(tiny_dirs):
    """On a page offering two models the chart is not there, empty, before a
    comparison of two models fills it (test_model_picker: it is shown then)."""
    from tiny_models import offered
    models = offered({"mha": tiny_dirs["mha"], "gqa_tied": tiny_dirs["gqa_tied"]})
    try:
        page = build_ui(models.engine(), Handlers(models.engine(), models=models)).tokenlab_page
        assert page["compare_chart"].visible is False
    finally:
        models.close()


def test_a_control_character_in_the_output_is_written_as_its_code_point(h, tiny_engine):
    """A token whose text is a control character (the tiny model's ⟨U+0004⟩) prints as nothing:
    the output writes its code point, so it can be seen and clicked; newlines and tabs stay text."""
    rec = run(h)
    step = rec.steps[0]
    rec.steps[0] = dataclasses.replace(step, text="a\x04\u200bb\n\tc", piece="a\x04\u200bb\n\tc")
    out = run_render.output_html(rec, tiny_engine.tokenizer)
    assert "a<span class='tl-cc'>⟨U+0004⟩</span><span class='tl-cc'>⟨U+200B⟩</span>b↵\n\tc" in out
