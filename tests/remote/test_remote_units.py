"""In front of a server, without one: which distribution the server's numbers are for each
setting, what a step reports from them, the server's metrics, and how the page shows a number
the server cannot give (a dash and a reason, never a zero)."""

import ui.shared.charts as charts_panel
import ui.shared.card as card_render
from helpers import plain
import math

import pytest

from inference.model.config import ModelConfig
from inference.events import Candidate, StepEvent
from inference.remote.discovery import server_info
from inference.remote.steps import meaning, split_text, token_numbers
from inference.sampling.params import SamplingParams
from inference.remote.metrics import kv_bytes_per_value, parse_load
from ui.run_state import RunRecord, run_summary
import ui.experiments.render as exp_render
import ui.format as formatting
import ui.shared.kv as kv_panel
import ui.shared.view as run_render

# Lines of vLLM 0.32's /metrics (the model's path shortened to M).
METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{engine="0",model_name="M"} 2.0
vllm:num_requests_waiting{engine="0",model_name="M"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="M"} 0.015
vllm:kv_cache_usage_perc{engine="0",model_name="other"} 0.9
vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",kv_cache_memory_bytes="2147483648",kv_cache_size_tokens="46592",num_gpu_blocks="364"} 1.0
"""
SMOL = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, n_layers=30, n_heads=9,
                   n_kv_heads=3, max_seq_len=8192, explicit_head_dim=64, tie_word_embeddings=True)


def params(**kw) -> SamplingParams:
    return SamplingParams(**kw)


@pytest.mark.parametrize("mode, kw, raw, final, one_hot, ranked", [
    ("raw", dict(temperature=1.0), True, True, False, True),  # nothing filtered: raw = final
    ("raw", dict(temperature=0.7), True, False, False, True),
    ("raw", dict(temperature=0.0), True, False, True, True),  # greedy: final is all on the chosen
    ("raw", dict(temperature=1.0, top_k=5), True, False, False, True),
    ("processed", dict(temperature=0.7, top_p=0.9), False, True, False, True),
    ("processed", dict(temperature=1.0), True, True, False, True),
    ("processed", dict(temperature=0.7, repetition_penalty=1.3), False, True, False, False),
    ("processed", dict(temperature=0.0), True, False, True, True),
    ("processed", dict(temperature=0.0, repetition_penalty=1.3), False, False, True, False),
])
def test_which_distribution_the_numbers_are(mode, kw, raw, final, one_hot, ranked):
    m = meaning(mode, params(**kw))
    assert (m.raw, m.final, m.one_hot, m.ranked) == (raw, final, one_hot, ranked)


def test_token_numbers_rank_only_among_the_returned():
    top = {"token_id:7": -0.3, "token_id:8": -1.5, "token_id:9": -9999.0}
    m = meaning("raw", params(temperature=0.8))
    inside = token_numbers(8, -1.5, top, 3, m)
    assert inside.rank == 2 and inside.prob is None and inside.raw_prob == pytest.approx(math.exp(-1.5))
    assert [i for i, _, _ in inside.top] == [7, 8, 9] and inside.top[2][2] == 0.0  # -inf written as -9999
    # The chosen token came from below the top 2 asked for: listed, but its rank is not known.
    outside = token_numbers(9, -9999.0, top, 2, m)
    assert outside.rank is None and [i for i, _, _ in outside.top] == [7, 8, 9]
    greedy = token_numbers(7, -0.3, top, 3, meaning("raw", params(temperature=0.0)))
    assert [p for _, p, _ in greedy.top] == [1.0, 0.0, 0.0] and greedy.prob == 1.0
    assert token_numbers(7, None, None, 3, m).top == []  # no log-probabilities asked for


def test_a_chunks_text_is_shared_by_its_tokens_pieces():
    assert split_text(" Paris.", [" Paris", "."]) == [" Paris", "."]
    assert split_text("é", ["\ufffd", "\ufffd"]) == ["", "é"]  # pieces do not spell it: on the last
    assert split_text("", []) == []


def test_metrics_of_the_whole_server():
    load = parse_load(METRICS, "M")
    assert (load.kv_cache_usage, load.running, load.waiting) == (0.015, 2, 1)
    assert load.pool_tokens == 46592 and load.pool_bytes == 2**31 and load.cache_dtype == "auto"
    values = 2 * 30 * 3 * 64
    assert kv_bytes_per_value(load, values, None)[0] == 4  # 2 GiB / 46,592 positions / 11,520 values
    assert kv_bytes_per_value(parse_load(METRICS.replace('"auto"', '"fp8"'), "M"), values, None)[0] == 1
    assert kv_bytes_per_value(None, values, "bfloat16")[0] == 2
    b, why = kv_bytes_per_value(parse_load("", "M"), values, None)
    assert b is None and "neither" in why
    empty = parse_load("", "M")
    assert empty.kv_cache_usage is None and empty.running is None


def remote_step(**kw) -> StepEvent:
    base = dict(step=0, token_id=7, piece=" Paris", text=" Paris", prob=None, raw_prob=0.7725,
                top=[Candidate(7, " Paris", None, 0.7725), Candidate(8, " the", None, 0.0645)],
                entropy=None, rank=None, kv_cache_bytes=None, kv_cache_capacity_bytes=None, ms=80.0,
                prefill_ms=80.0, prompt_tokens=5)
    return StepEvent(**{**base, **kw})


def test_bars_say_what_the_server_does_not_give():
    html = plain(formatting.bars_html(remote_step(), approx="From the server's log-probabilities"))
    assert "(sampled from) (not given by the server)" in html
    assert "raw model <span class='tl-p-word'>probability</span>" in html and "0.7725" in html
    assert "p = <span class='tl-p'>–</span>" in html and "rank not known" in html and "From the server" in html
    assert "0.0000" not in html  # an unknown number is a dash, not a zero


def test_charts_and_summaries_leave_out_what_is_not_known():
    rec = RunRecord(prompt_ids=[1, 2, 3, 4, 5], steps=[remote_step(), remote_step(step=1, rank=1)],
                    kv_bytes_per_token=46080)
    probs, ranks = charts_panel.run_chart_frames(rec)
    assert set(probs["metric"]) == {"chosen-token probability"} and list(ranks["step"]) == [1]
    kv = charts_panel.kv_frame(rec)
    assert set(kv["series"]) == {"this run, by the formula"}
    assert kv["MiB"].tolist() == [46080 * 5 / 2**20, 46080 * 6 / 2**20]  # step 0: the prompt's 5 positions
    assert charts_panel.kv_frame(RunRecord(prompt_ids=[1], steps=[remote_step()])) is None  # no config: no chart
    s = run_summary(rec)
    assert s["mean_p"] == pytest.approx(0.7725) and math.isnan(s["mean_entropy"])
    assert "| – |" in exp_render.compare_summary(rec, rec, None)
    from inference.remote.tokenizer import RemoteTokenizer
    assert run_render.highlighted_output(rec, RemoteTokenizer(None, "M"))[0] == (" Paris", "0.5 ≤ p < 0.9")


def info(cfg=SMOL, kv_bytes=4):
    return server_info("M", "http://127.0.0.1:8000/v1", 2048, "raw", "probed at start", cfg,
                      "/models/M/config.json" if cfg else None, None, kv_bytes, "the server's pool")


def test_remote_card_formula_and_stats():
    assert "context 2,048 tokens (the server's)" in plain(card_render.model_card(info()))
    assert "--engine-config" in plain(card_render.model_card(info(cfg=None)))
    text = plain(kv_panel.kv_formula(info(), 13))
    assert "2 × 30 × 3 × 64 × 4" in text and "46,080 bytes per position" in text
    assert "13 positions this run holds" in text and "by the formula" in text
    assert "11,520 × b bytes per position" in plain(kv_panel.kv_formula(info(kv_bytes=None)))
    assert "--engine-config" in plain(kv_panel.kv_formula(info(cfg=None)))
    assert info().kv_bytes_per_position == 46080
    rec = RunRecord(prompt_ids=[1] * 5, steps=[remote_step(), remote_step(step=1, ms=100.0)], seed=3)
    stats = plain(run_render.stats_markdown(info(), rec))
    assert "| 5 | 80 ms | 2 | 10.0 |" in stats and "at the page" in stats
    line = kv_panel.server_load_markdown(parse_load(METRICS, "M"))
    assert "1.5% in use of 46,592 positions" in line and "2 requests running" in line and "whole server" in line


def test_events_write_null_for_what_is_not_known():
    d = remote_step(step=1, prefill_ms=None, prompt_tokens=None).to_json()
    assert d["entropy"] is None and d["kv_cache_bytes"] is None and d["top"][0]["prob"] is None
    assert "prefill_ms" not in d  # as for the local engine: step 0 only


def test_the_page_in_front_of_a_server_says_what_it_cannot_show():
    """The layout with a RemoteEngine (no request is made to build it): notes in place of the
    controls that need the model's insides, the server's load beside the KV-cache formula."""
    from inference.remote.engine import RemoteEngine
    from inference.remote.http import ServerHTTP
    from ui.layout import build_ui

    engine = RemoteEngine(ServerHTTP("http://127.0.0.1:9/v1"), "M", 2048, "raw", "given", cfg=SMOL)
    engine.info = info()
    blocks = build_ui(engine).blocks.values()
    ids = {getattr(b, "elem_id", None) for b in blocks}
    assert {"inside-note", "replay-note", "charts-note", "server-load", "kv-formula"} <= ids
    assert not ids & {"replay", "inspect", "inspect-layer", "attention", "lens"}
    texts = " ".join(str(getattr(b, "value", "")) for b in blocks)
    assert "not available when the page is in front of a server" in texts
    assert "46,080 bytes per position" in texts and "served by vLLM" in texts
    assert "constraint-note" in ids and "is not reported" in texts  # the masked mass: said in its place
