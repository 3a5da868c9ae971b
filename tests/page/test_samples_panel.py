"""The "Many samples" panel: its outcomes are the single runs with those seeds, its first-step
table is the model's distribution, its chi-square is Pearson's with a correct p-value, and it
keeps the page's limits and Stop."""

import math
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import gradio as gr
import pytest
import torch

from inference.events import StepEvent
from inference.sampling.params import SamplingParams
from ui.controls import Controls
from ui.handlers import Handlers
from server.limits import Limits
from ui.samples.stats import OTHER, Row, chi2_sf, goodness_of_fit


def req(session, host="198.51.100.9"):
    return SimpleNamespace(session_hash=session, client=SimpleNamespace(host=host), username=None)


# Upper 5% and 1% points of the chi-square distribution (any statistics table).
TABLE = [(3.841, 1, 0.05), (5.991, 2, 0.05), (7.815, 3, 0.05), (9.488, 4, 0.05), (11.070, 5, 0.05),
         (18.307, 10, 0.05), (6.635, 1, 0.01), (9.210, 2, 0.01), (23.209, 10, 0.01), (50.892, 30, 0.01)]


@pytest.mark.parametrize("x,df,p", TABLE)
def test_chi2_sf_matches_the_table(x, df, p):
    assert abs(chi2_sf(x, df) - p) < 2e-4


def test_chi2_sf_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in range(1, 64):
        for x in (0.01, 0.5, 1.0, df / 2, df, 2 * df + 3, 150.0, 2000.0):
            assert abs(chi2_sf(x, df) - stats.chi2.sf(x, df)) < 1e-12, (x, df)
    assert chi2_sf(0.0, 3) == 1.0
    with pytest.raises(ValueError):
        chi2_sf(1.0, 0)


def test_rare_tokens_are_pooled_until_each_group_is_expected_five_times():
    rows = [Row(1, "a", 20, 0.5, 20.0), Row(2, "b", 9, 0.25, 10.0), Row(3, "c", 5, 0.1, 4.0),
            Row(4, "d", 2, 0.05, 2.0), Row(OTHER, "rest", 4, 0.1, 4.0)]
    fit = goodness_of_fit(rows)
    assert [[r.id for r in g] for g in fit.groups] == [[2], [1], [3, 4, OTHER]]
    assert fit.df == 2
    assert math.isclose(fit.statistic, (9 - 10) ** 2 / 10 + (20 - 20) ** 2 / 20 + (11 - 10) ** 2 / 10)
    # A pool expected fewer than five times joins the smallest group.
    small = goodness_of_fit([Row(1, "a", 30, 0.75, 30.0), Row(2, "b", 8, 0.2, 8.0), Row(OTHER, "rest", 2, 0.05, 2.0)])
    assert [[r.id for r in g] for g in small.groups] == [[2, OTHER], [1]] and small.df == 1
    # One token takes everything (greedy): no test.
    assert goodness_of_fit([Row(1, "a", 16, 1.0, 16.0), Row(OTHER, "rest", 0, 0.0, 0.0)]) is None


@pytest.fixture
def h(tiny_engine, monkeypatch):
    monkeypatch.setattr(tiny_engine, "eos_ids", set())  # every sample goes to max new tokens
    return Handlers(tiny_engine)


def final(outs):
    return outs[-1]


def test_outcomes_are_the_single_runs_with_those_seeds(h, tiny_engine):
    c = Controls(prompt="The quick", temperature=1.0, top_p=1.0, max_new_tokens=4, seed="40")
    out = final(list(h.samples.samples(*c.values(), 12, req("s"))))
    data = out["samples_data"]
    assert data["seed"] == 40 and [s["seed"] for s in data["samples"]] == list(range(40, 52))
    for s in data["samples"]:
        alone = list(h.run.generate(*Controls(**{**c.__dict__, "seed": str(s["seed"])}).values(), req("one")))
        assert s["text"] == alone[-1]["record"].done.text
    counts = {}
    for s in data["samples"]:
        counts[s["text"]] = counts.get(s["text"], 0) + 1
    assert f"{len(counts)} distinct text" in out["samples_outcomes"]
    assert "**12 samples**, seeds 40–51" in out["samples_md"]


def test_first_step_table_is_the_distribution_sampled_from(h, tiny_engine):
    c = Controls(prompt="Paris is", temperature=0.7, top_k=30, top_p=1.0, max_new_tokens=2, seed="5")
    out = final(list(h.samples.samples(*c.values(), 64, req("s"))))
    rows, fit = out["samples_data"]["first_step"], out["samples_data"]["chi_square"]
    ids = tiny_engine.tokenizer.encode("Paris is")
    logits = tiny_engine.step_logits(ids).double()
    kept = logits.topk(30).indices
    masked = torch.full_like(logits, -math.inf)
    masked[kept] = logits[kept] / 0.7
    p = masked.softmax(-1)  # top-k 30, then temperature 0.7: the distribution sampled from
    listed = [r for r in rows if r["id"] is not None]
    assert len(listed) == 20
    for r in listed:
        assert abs(r["prob"] - float(p[r["id"]])) < 1e-4 and abs(r["expected"] - 64 * float(p[r["id"]])) < 64e-4
    other = next(r for r in rows if r["id"] is None)
    assert abs(other["prob"] - (1 - sum(float(p[r["id"]]) for r in listed))) < 1e-4
    assert sum(r["observed"] for r in rows) == 64
    # The figure is Pearson's over the groups the panel names, as scipy computes it.
    stats = pytest.importorskip("scipy.stats")
    groups = goodness_of_fit([Row(r["id"], "", r["observed"], r["prob"], r["expected"]) for r in rows]).groups
    observed = [sum(x.observed for x in g) for g in groups]
    expected = [sum(x.expected for x in g) for g in groups]
    ref = stats.chisquare(observed, [e * sum(observed) / sum(expected) for e in expected])
    assert abs(fit["statistic"] - ref.statistic) < 1e-3 and abs(fit["p_value"] - ref.pvalue) < 1e-3
    assert fit["df"] == len(groups) - 1 >= 1
    assert "Chi-square goodness of fit:</b> χ² = " in out["samples_first"]


def test_greedy_samples_have_no_test(h):
    c = Controls(prompt="The quick", temperature=0.0, max_new_tokens=3, seed="1")
    out = final(list(h.samples.samples(*c.values(), 8, req("g"))))
    assert "1 distinct text among 8 samples" in out["samples_outcomes"]
    assert "no test" in out["samples_first"] and out["samples_data"]["chi_square"] is None


def test_limits_are_kept(tiny_engine, hold):
    h = Handlers(tiny_engine, limits=Limits(max_new_tokens=8, runs_per_client=1, max_samples=4))
    for n, message in [(5, r"The server allows at most 4 samples at once; got 5\."),
                       (0, "from 1 to 64, got 0"), (2.5, "from 1 to 64, got 2.5")]:
        with pytest.raises(gr.Error, match=message):
            list(h.samples.samples(*Controls(max_new_tokens=4).values(), n, req("a")))
    with pytest.raises(gr.Error, match=r"at most 8 new tokens; got 9"):
        list(h.samples.samples(*Controls(max_new_tokens=9).values(), 2, req("a")))
    held = hold(tiny_engine)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(lambda: list(h.samples.samples(*Controls(max_new_tokens=8, seed="1").values(), 4, req("a"))))
        held.step(1)
        with pytest.raises(gr.Error, match="allows 1 at a time per visitor"):  # the same visitor, another tab
            list(h.run.generate(*Controls(max_new_tokens=3).values(), req("b")))
        h.run.stop(req("a"))  # Stop ends every sample within its step
        out = final(running.result(timeout=60))
    assert "**Stopped**: 4 samples ended early" in out["samples_md"]
    assert {s["reason"] for s in out["samples_data"]["samples"]} == {"cancelled"}
    assert tiny_engine.active_runs == 0 and len(h.page.registry) == 0


def test_the_page_caps_the_slider_and_says_the_limit(tiny_engine):
    from ui.layout import build_ui
    from ui.run.render import limits_markdown
    h = Handlers(tiny_engine, limits=Limits.shared())
    config = build_ui(tiny_engine, h).get_config_file()
    slider = next(c for c in config["components"] if c["props"].get("elem_id") == "n-samples")
    assert slider["props"]["maximum"] == 16 and "at most 16 on this server" in slider["props"]["info"]
    assert "at most 16 samples at once" in limits_markdown(h.page.limits)
    assert Limits.shared(max_samples=0).max_samples is None


def test_sample_runs_equal_the_engine_alone(tiny_engine):
    """The panel's runs are the engine's: its first step's tokens are those of generate_ids."""
    ids = tiny_engine.tokenizer.encode("The quick")
    first = [next(e for e in tiny_engine.generate_ids(ids, SamplingParams(temperature=1.0, max_new_tokens=1, seed=s))
                  if isinstance(e, StepEvent)).token_id for s in range(7, 11)]
    h = Handlers(tiny_engine)
    out = final(list(h.samples.samples(*Controls(prompt="The quick", temperature=1.0, top_p=1.0, top_k=0,
                                         max_new_tokens=1, seed="7").values(), 4, req("e"))))
    rows = out["samples_data"]["first_step"]
    listed = {r["id"] for r in rows if r["id"] is not None}
    expected = {t: first.count(t) for t in set(first) if t in listed}
    expected[None] = sum(t not in listed for t in first)
    assert {r["id"]: r["observed"] for r in rows if r["observed"]} == {k: v for k, v in expected.items() if v}


def test_every_other_token_is_exactly_0_where_the_settings_removed_them(h, tiny_engine):
    """Top-k 5 leaves no other token, so its row says 0, not the float residue of
    1 − the listed probabilities (4.47e-08); and a p-value shows no detected disagreement,
    never agreement."""
    c = Controls(prompt="Paris is", temperature=0.7, top_k=5, max_new_tokens=1, seed="5")
    out = final(list(h.samples.samples(*c.values(), 40, req("k5"))))
    other = next(r for r in out["samples_data"]["first_step"] if r["id"] is None)
    assert other["prob"] == 0.0 and other["expected"] == 0.0 and other["observed"] == 0
    assert "<i>every other token</i></td><td class='tl-num'>0</td>" in out["samples_first"]
    assert "e-0" not in out["samples_first"].split("every other token")[1].split("</tr>")[0]
    assert "agree with" not in out["samples_first"]
    fit = out["samples_data"]["chi_square"]
    if fit is not None and fit["p_value"] >= 0.05:
        assert "no disagreement with the model's probabilities was detected" in out["samples_first"]
    from ui.samples.render import fit_html
    from ui.samples.stats import Fit
    said = fit_html(Fit(1.0, 2, 0.19, [[Row(1, "a", 5, 0.5, 5.0)], [Row(2, "b", 5, 0.5, 5.0)]]), 10, [])
    assert "no disagreement with the model's probabilities was detected" in said and "19%" in said
