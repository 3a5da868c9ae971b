"""The page's handlers called directly, as plain functions, on a tiny model."""

from ui.shared.charts import chart_colors
import ui.shared.charts as charts_panel
from helpers import plain
import dataclasses
import json
import threading
from types import SimpleNamespace

import gradio as gr
import pytest

from inference.sampling.settings import SETTINGS, decode_logit_bias
from ui.controls import MAX_STOP_TEXT, Controls, controls_from_query, parse_stop, share_url
from ui.handlers import Handlers
from ui.shared.outputs import RUN_OUTPUTS
import ui.format as formatting
import ui.shared.view as run_render
import ui.experiments.render as exp_render
import ui.shared.kv as kv_panel
from ui.widgets import REBUILD, setting_control

ARGS = {"prompt": "The quick brown fox", "temperature": 0.0, "max_new_tokens": 12}


def run(h, **kw):
    c = Controls(**{**ARGS, **kw})
    return list(h.run.generate(*c.values(), SimpleNamespace(session_hash="s1")))


@pytest.fixture
def handlers(tiny_engine):
    return Handlers(tiny_engine, top_n=5)


def test_generate_streams_updates_and_ends_complete(handlers, tiny_engine):
    updates = run(handlers)
    assert len(updates) >= 2
    output, bars, stats, kv_text, notice, status, step, tokens, rec = (updates[-1][n] for n in RUN_OUTPUTS)
    assert len(rec.steps) == 12 and rec.done.reason == "length"
    assert "".join(t["token"] for t in tokens) == rec.done.text
    assert [formatting.bucket(t["prob"]) for t in tokens[:12]] == ["p ≥ 0.9"] * 12  # greedy: every token had p = 1
    assert output.count("class='tl-t ") == len(run_render.output_chips(rec, tiny_engine.tokenizer))
    assert "Step 11" in plain(bars) and "tl-chosen" in bars and step == 11
    assert "Run ended" in status and "max new tokens" in status
    assert all(u["api_tokens"] == [] for u in updates[:-1])  # the token list comes with the last update
    assert "| 5 |" not in stats and "tok/s" in stats
    assert len(handlers.page.registry) == 0  # the run is no longer registered
    # A gr.skip() rebuilds the component on the server: streaming updates send values.
    assert not any(isinstance(v, dict) for u in updates for v in u.values())
    assert all(set(u) == set(RUN_OUTPUTS) for u in updates)


def test_begin_shows_the_prompt_and_after_run_the_charts(handlers, tiny_engine):
    begun = handlers.run.begin(*Controls(**ARGS).values())
    prompt_view, tokens, timer = (begun[n] for n in ("prompt_view", "tokens", "live"))
    # The box shows what was fed: the tokenizer's <s> before the text, as the tokens list it.
    assert prompt_view == {"value": "<s>The quick brown fox", "visible": True, "__type__": "update"} and timer.active
    import re
    assert [int(i) for i in re.findall(r"<sub>(\d+)</sub>", tokens)] == tiny_engine.prompt_ids("The quick brown fox")
    # The charts are not emptied (Vega warns on an empty chart): the run's first step redraws them.
    assert not {"kv_chart", "latency", "run_chart", "rank_chart", "entropy_chart"} & set(begun)
    refused = handlers.run.begin(*Controls(**{**ARGS, "prompt": " "}).values())
    assert set(refused) == {"status"} and "empty" in refused["status"]  # every panel kept, the error said
    rec = run(handlers)[-1]["record"]
    assert handlers.run.live_tick(rec) == {}  # over: after_run draws the end
    after = handlers.run.after_run(rec)
    timer, kv, latency, slider = after["live"], after["kv_chart"], after["latency"], after["step"]
    rank_chart = after["rank_chart"]["value"]
    # Its axis spans whole ranks (Vega-Lite ticked a short span at 1.5, 2.5): from 0, at least 10.
    assert after["rank_chart"]["y_lim"] == [0, max(10, int(rank_chart["rank"].max() * 1.1 + 0.999) + 1)]
    assert not timer.active
    # Per step (step 0: after the prompt's prefill): used, and allocated, which is the server's pool
    # (all runs) while this run is its only one: one line named for both (ui/shared/charts._merged).
    assert list(kv.columns) == ["step", "MiB", "series"] and len(kv) == 2 * 12 and kv.step.min() == 0
    assert set(kv.series) == {"used", "allocated = server pool, all runs"}
    used = kv[kv.series == "used"]["MiB"].tolist()
    # The prompt's positions at step 0, then one more a step (the token just made is not yet fed).
    assert used == [(len(rec.prompt_ids) + k) * rec.kv_bytes_per_token / 2**20 for k in range(12)]
    assert len(latency) == 11 and len(rank_chart) == 12
    assert slider["maximum"] == 11 and slider["value"] == 11 and slider["interactive"]


def test_the_charts_colours_name_every_line_and_change_once_the_run_ends(handlers):
    """After each event that gives the charts data, one sends their colours (Gradio builds a
    chart's colour scale only when its colours change): every series of the data gets a colour of
    its own, and the map changes when the run ends, so that the chart is built with its last data."""
    rec = run(handlers)[-1]["record"]
    ended = chart_colors(rec)
    for name, column in (("kv_chart", "series"), ("run_chart", "metric")):
        frame = charts_panel.kv_frame(rec) if name == "kv_chart" else charts_panel.run_chart_frames(rec)[0]
        colors = {k: v for k, v in ended[name]["color_map"].items() if k != REBUILD}
        assert set(colors) == set(frame[column]) and len(set(colors.values())) == len(colors)
    running = dataclasses.replace(rec, done=None)
    assert chart_colors(running)["kv_chart"]["color_map"] != ended["kv_chart"]["color_map"]
    assert chart_colors(None) == {}


def test_live_charts_draw_the_running_run(tiny_engine, hold):
    hold(tiny_engine).one_token_per_update()
    h = Handlers(tiny_engine, top_n=5, update_interval_s=0.01)
    gen = h.run.generate(*Controls(**{**ARGS, "max_new_tokens": 30}).values())
    for n in range(6):  # the held run: each update carries one more token
        rec = next(gen)["record"]
        assert len(rec.steps) == n and rec.done is None
        if n:
            live = h.run.live_tick(rec)
            kv = live["kv_chart"]
            assert len(kv) == 2 * n and (("latency" not in live) if n == 1 else len(live["latency"]) == n - 1)
    gen.close()


def test_seed_used_is_reported_and_reproduces(handlers):
    a = run(handlers, temperature=1.2, seed="")[-1]["record"]
    assert isinstance(a.seed, int)
    b = run(handlers, temperature=1.2, seed=str(a.seed))[-1]["record"]
    assert [s.token_id for s in a.steps] == [s.token_id for s in b.steps]
    assert f"| {a.seed} |" in run_render.stats_markdown(handlers.page.info, a)


@pytest.mark.parametrize("kw, message", [
    (dict(prompt="   "), "empty"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0), "top_p"), (dict(seed="abc"), "seed"), (dict(top_k=1.5), "top_k"),
    (dict(mode="poetry"), "mode"), (dict(prompt="fox " * 400), "context window"),
])
def test_bad_input_is_a_gradio_error_with_one_line(handlers, kw, message):
    with pytest.raises(gr.Error, match=message) as e:
        run(handlers, **kw)
    assert "\n" not in str(e.value)


def test_replay_compare_and_samples_call_a_bad_setting_by_its_label(handlers):
    """The page names a control as it labels it (Top-k), in every panel, as Generate does; the
    script API (/generate) keeps its parameters' names (the test above)."""
    from inference.sampling.settings import SHAPING_SETTINGS
    rec = run(handlers, max_new_tokens=3)[-1]["record"]
    values = {n: getattr(rec.params, n) for n in SHAPING_SETTINGS}
    out = handlers.experiments.replay_step(rec, 1, *{**values, "top_k": -1}.values())
    assert out["replay_md"].startswith("⚠ Replay: Top-k must be in [0, ∞)") and "top_k" not in out["replay_md"]
    c = Controls(**{**ARGS, "max_new_tokens": 2})
    with pytest.raises(gr.Error) as e:
        handlers.experiments.compare(*c.values(), *{**values, "top_p": 0}.values(), "", SimpleNamespace(session_hash="s1"))
    assert e.value.message.startswith("Top-p must be in (0, 1]") and "\n" not in e.value.message
    for bad, message in [(dict(seed="abc"), "Seed must be a whole number"),
                         (dict(logit_bias="99999:5"), "Logit bias names token 99999")]:
        with pytest.raises(gr.Error) as e:
            list(handlers.samples.samples(*Controls(**{**ARGS, **bad}).values(), 2, SimpleNamespace(session_hash="s1")))
        assert e.value.message.startswith(message), e.value.message


def test_capped_max_new_tokens_is_said(handlers, tiny_engine):
    prompt = " ".join(["fox"] * 60)
    n = len(tiny_engine.prompt_ids(prompt))
    updates = run(handlers, prompt=prompt, max_new_tokens=500)
    notice = updates[-1]["notice"]
    assert f"lowered from 500 to {tiny_engine.cfg.max_seq_len - n}" in notice


def test_select_step_and_token(handlers):
    rec = run(handlers)[-1]["record"]
    assert "Step 3" in plain(handlers.run.select_step(rec, 3))
    assert "Step 11" in plain(handlers.run.select_step(rec, 99))
    picked = handlers.run.select_token(rec, SimpleNamespace(index=4))
    bars, slider = picked["bars"], picked["step"]
    assert "Step 4" in plain(bars) and slider["value"] == 4


def test_the_bars_tag_the_tokens_the_logit_bias_moved_or_banned(handlers, tiny_engine):
    """A run's logit bias (ids and text alike) tags its candidates in the bars: "banned" at -100
    or less, "bias +2" otherwise; the others carry no tag."""
    import re
    free = run(handlers)[-1]["record"]
    tok = tiny_engine.tokenizer
    # Greedy's candidates at step 0: ban one written as its text, lift another by its id.
    first = [c for c in free.steps[0].top if tok.encode_continuation(tok.decode([c.id])) == [c.id]]
    piece = tok.decode([first[0].id])
    text_ids = {i for i, _ in decode_logit_bias(json.dumps(piece) + ":0", tok)}
    assert text_ids == {first[0].id}
    updates = run(handlers, logit_bias=f"{json.dumps(piece)}:-100 {first[1].id}:2")
    rec = updates[-1]["record"]
    for html_bars in (updates[-1]["bars"], handlers.run.select_step(rec, 0), handlers.run.select_token(rec, SimpleNamespace(index=0))["bars"]):
        rows = re.findall(r"<div class='tl-row(?! tl-head)[^']*'[^>]*>(.*?)</div>", html_bars)
        assert len(rows) >= 5
        for row in rows:
            tid = int(re.search(r"title='id (\d+)", row).group(1))
            tag = re.findall(r"<span class='tl-mark[^']*'[^>]*>([^<]*)</span>", row)
            assert tag == (["bias +2"] if tid == first[1].id else ["banned"] if tid in text_ids else []), row
    assert rec.steps[0].token_id != first[0].id  # a banned token is never chosen
    assert {first[0].id, first[1].id} <= {c.id for c in rec.steps[0].top}  # both tagged above
    assert rec.bias == {**{i: -100.0 for i in text_ids}, first[1].id: 2.0}
    # A run without a bias: no bias tags (greedy's others say temperature 0 removed them).
    assert not re.search(r"tl-mark(?! tl-removed)", handlers.run.select_step(free, 0))


def test_stop_ends_the_sessions_run(handlers, hold):
    held = hold(handlers.page.engine)
    c = Controls(prompt="The quick", max_new_tokens=200, temperature=1.0, seed="1")
    gen = handlers.run.generate(*c.values(), SimpleNamespace(session_hash="s2"))
    next(gen)
    held.step(3)  # the run has made 3 tokens and is held before the 4th
    handlers.run.stop(SimpleNamespace(session_hash="other"))  # another session's Stop does nothing
    held.step(2)
    handlers.run.stop(SimpleNamespace(session_hash="s2"))
    rec = list(gen)[-1]["record"]
    # The token being made at the Stop is the last one.
    assert rec.done.reason == "cancelled" and len(rec.steps) == 6
    assert handlers.page.engine.active_runs == 0


def test_share_link_round_trips_through_the_query(handlers):
    c = Controls(prompt="今天天气真 & more?", mode="chat", system="be brief", temperature=0.3, top_k=40,
                 top_p=0.9, min_p=0.05, repetition_penalty=1.1, max_new_tokens=77, seed="42",
                 stop="\\n\nEND")
    url = handlers.share.share_link(*c.values(), "http://host:7860/")
    assert url.startswith("http://host:7860/?")
    from urllib.parse import parse_qsl, urlsplit
    query = dict(parse_qsl(urlsplit(url).query))
    restored, problems = controls_from_query(query, Controls.for_model(handlers.page.engine.generation_defaults))
    assert restored == c and problems == []
    values = handlers.share.restore(SimpleNamespace(query_params=query))
    from ui.controls import NAMES
    assert [values[n] for n in NAMES] == c.values() and values["notice"] == ""


def test_the_sampler_order_round_trips_through_the_link_and_its_view_shows_it(handlers):
    """The order a user writes travels in the share link and comes back; the order view lists
    every stage in the order it will run, those listed first, the ones turned on marked."""
    import re
    from urllib.parse import parse_qsl, urlsplit
    from inference.sampling.settings import DEFAULT_ORDER, SHAPING_SETTINGS
    from ui.controls import NAMES
    c = Controls(prompt="hi", top_k=40, xtc_probability=0.5, logit_bias='" Paris":-100 7:2',
                 sampler_order="xtc_probability, top_k")
    query = dict(parse_qsl(urlsplit(handlers.share.share_link(*c.values(), "http://host/")).query))
    assert query["sampler_order"] == "xtc_probability, top_k" and query["logit_bias"] == '" Paris":-100 7:2'
    values = handlers.share.restore(SimpleNamespace(query_params=query))
    assert [values[n] for n in NAMES] == c.values()
    view = handlers.run.order_view(*(values[n] for n in SHAPING_SETTINGS))
    stages = re.findall(r"<li class='([^']*)'[^>]*><code>(\w+)</code>", view)
    assert [n for _, n in stages] == ["xtc_probability", "top_k", *(n for n in DEFAULT_ORDER if n not in ("xtc_probability", "top_k"))]
    on = {n for cls, n in stages if "tl-on" in cls}
    assert on == {"xtc_probability", "top_k", "logit_bias"}
    assert {n for cls, n in stages if "tl-listed" in cls} == {"xtc_probability", "top_k"}
    bad = handlers.run.order_view(*(values[n] if n != "sampler_order" else "top_k,nope" for n in SHAPING_SETTINGS))
    error = re.search(r"<div class='tl-order-error'>(.*?)</div>", bad).group(1)
    assert error.startswith("⚠ Sampler order names stages") and "nope" in error and "\n" not in error
    assert [n for _, n in re.findall(r"<li class='([^']*)'[^>]*><code>(\w+)</code>", bad)] == list(DEFAULT_ORDER)


def test_bad_query_values_are_named_not_dropped():
    c, problems = controls_from_query({"temperature": "nan", "top_k": "x", "mode": "poetry", "bogus": "1",
                                       "seed": "-5", "prompt": "hi"})
    assert c.prompt == "hi" and c.temperature == Controls().temperature
    text = "\n".join(problems)
    for name in ("temperature", "top_k", "mode", "bogus", "seed"):
        assert name in text


def test_parse_stop_and_default_url():
    assert parse_stop("a\n\\n\\nEND\n\n") == ("a", "\n\nEND")
    assert share_url("http://x/?old=1", Controls()) .startswith("http://x/?prompt=")


def update_counts(engine, monkeypatch, tick: float, max_new: int) -> list[int]:
    """Steps shown after each page update of one run, against a clock that moves `tick` seconds
    at every look, with all of the run's tokens waiting once it has started."""
    import ui.streaming
    now = [0.0]
    monkeypatch.setattr(ui.streaming, "time", SimpleNamespace(
        perf_counter=lambda: now.__setitem__(0, now[0] + tick) or now[0]))
    gen = Handlers(engine).run.generate(*Controls(**{**ARGS, "max_new_tokens": max_new}).values())
    counts = [len(next(gen)["record"].steps)]  # starts the run
    for t in threading.enumerate():
        if t.name == "tokenlab-run":
            t.join()  # the run is over: its every token is waiting
    return counts + [len(u["record"].steps) for u in gen]


def test_updates_are_paced_by_the_interval(tiny_engine, monkeypatch):
    """When no time passes every token after the first goes in one update; when an interval
    passes at every look at the clock, each token has an update of its own."""
    from ui.streaming import update_interval_for
    interval = update_interval_for(tiny_engine.describe())
    assert interval == 0.2  # a CPU engine: 5 updates a second
    assert update_counts(tiny_engine, monkeypatch, 0.0, 60) == [0, 1, 60]  # the first token at once
    counts = update_counts(tiny_engine, monkeypatch, interval, 60)
    assert counts == sorted(counts) and set(counts) == set(range(61)), counts


def test_many_runs_at_once_space_each_runs_updates(tiny_engine, monkeypatch):
    """With 8 runs going, each run's updates come half as often as alone (the server's pages
    together stay at 4 / interval updates a second): with a clock that moves 1.1 intervals at
    every look, each update carries two tokens instead of one."""
    from ui.streaming import paced_interval, update_interval_for
    interval = update_interval_for(tiny_engine.describe())
    assert [paced_interval(interval, n) for n in (0, 1, 4, 8, 20)] == [interval] * 3 + [2 * interval, 5 * interval]
    monkeypatch.setattr(type(tiny_engine), "active_runs", property(lambda self: 8))
    counts = update_counts(tiny_engine, monkeypatch, 1.1 * interval, 20)
    # The first token alone (at once), then two a time.
    assert counts == sorted(counts) and set(counts) == {0, 20} | set(range(1, 20, 2)), counts


def test_generate_on_the_page_names_every_bad_field_by_its_label(handlers):
    """Every control that cannot be used, in one message, each by the label the page shows it
    with (the schema's): a numeric setting below its minimum, a bad seed, a bad logit bias and
    bad stop strings, all at once. /generate keeps the parameter names, on one line."""
    numeric = [s for s in SETTINGS if s.kind is not str]
    bad = {s.name: s.minimum - 1 for s in numeric}
    c = Controls(**{**ARGS, **bad, "seed": "abc", "logit_bias": "x:y", "stop": "s" * (MAX_STOP_TEXT + 1)})
    status = handlers.run.begin(*c.values(), SimpleNamespace(session_hash="bad"), [])["status"]
    lines = status.split("\n")
    assert lines[0] == f"⚠ Not started: {len(numeric) + 3} fields cannot be used:"
    for s in numeric:
        assert f"- {s.label} must be in {s.range_text()} ({s.help}), got {s.minimum - 1!r}" in lines, s.name
    assert "- Seed must be a whole number or empty (random), got 'abc'" in lines
    assert any(line.startswith("- Logit bias entries are ID:BIAS") for line in lines)
    assert any(line.startswith(f"- Stop strings are {MAX_STOP_TEXT + 1:,} characters") for line in lines)
    assert not any(line.startswith(f"- {s.name} ") for s in SETTINGS for line in lines)  # no parameter name
    # One bad field: one line, named by its label.
    one = handlers.run.begin(*Controls(**{**ARGS, "top_k": -3}).values(), SimpleNamespace(session_hash="one"), [])
    assert one["status"] == ("⚠ Not started: Top-k must be in [0, ∞) (keep the k most likely tokens; 0 = off), "
                             "got -3")
    with pytest.raises(gr.Error) as e:
        run(handlers, top_k=-3, top_p=0)
    message = e.value.message
    assert message.startswith("top_k must be in [0, ∞)") and "; top_p must be in (0, 1]" in message
    assert "\n" not in message


def test_a_number_box_takes_its_range_from_the_schema_and_leaves_the_check_to_it():
    """The box carries the schema's range (the browser's input shows it; the page says a value
    beyond it under the field) but sends what was typed: the schema's message names it."""
    for s in SETTINGS:
        if s.control == "number":
            box = setting_control(s, s.default, 100)
            assert isinstance(box, gr.Number) and (box.minimum, box.maximum) == (s.minimum, s.maximum)
            assert box.preprocess(s.minimum - 3) == s.minimum - 3 and "tl-setting" in box.elem_classes
    js = open(run_render.__file__.rsplit("/shared/", 1)[0] + "/assets/clamp.js", encoding="utf-8").read()
    assert "is below the minimum" in js and "a run refuses it" in js  # the browser test types -3
