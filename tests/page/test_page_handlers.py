"""The page's new events called as plain functions: chat turns, the template's default system
prompt, the full attention pattern, links with the run's seed, downloads, the waiting line,
and the rule that an event outside the queue never raises (gradio would answer HTTP 500)."""

from __future__ import annotations

import ui.shared.card as card_render
from helpers import plain
import json
import re
from types import SimpleNamespace
from urllib.parse import parse_qsl, urlsplit

import gradio as gr
import pytest

from inference.sampling.settings import how_made
from ui.controls import NAMES
import torch

from inference.loading.chat import default_system_prompt, render_chat
from inference.events import PrefillEvent
from inference.serving.kv_pool import BLOCK_SIZE
from tiny_models import CHATML
from ui.controls import Controls, controls_from_query, query_value, share_url
from ui.shared.outputs import STALE_PANELS
from ui.run_state import Divergence, RunRecord, run_jsonl
import ui.experiments.render as exp_render
import ui.format as formatting
import ui.inside.render as inside_render
import ui.shared.kv as kv_panel
import ui.shared.view as run_render

SMOL_LIKE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
             "{{ '<|im_start|>system\nYou are SmolTest<|im_end|>\n' }}{% endif %}"
             "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def session(name):
    return SimpleNamespace(session_hash=name)


def run(h, name="u", history=None, **kw):
    c = Controls(**{"prompt": "The quick brown fox", "max_new_tokens": 8, "seed": "3", **kw})
    return list(h.run.generate(*c.values(), session(name), history))[-1]["record"]


def after(h, rec, history=None, name="u"):
    return h.run.after_run(rec, history, session(name))


# ---------------------------------------------------------------- chat

def test_the_templates_default_system_prompt_is_found():
    assert default_system_prompt(SMOL_LIKE) == "You are SmolTest"
    assert default_system_prompt(CHATML) == ""  # adds none
    assert default_system_prompt(None) == ""


def test_follow_ups_continue_the_conversation_and_regenerate_replaces_the_answer(h, tiny_engine):
    first = run(h, mode="chat", prompt="Hello")
    a = after(h, first, [])
    history = a["history"]
    assert [{k: m[k] for k in ("role", "content")} for m in history] == [
        {"role": "user", "content": "Hello"}, {"role": "assistant", "content": first.done.text}]
    assert "\ufffd" not in a["conversation"]  # (the random model's bytes are often no character)
    assert a["prompt"] == "" and a["regenerate"]["interactive"] and "1 turn" in a["conversation"]
    assert first.finished and "history" not in after(h, first, history)  # drawn once, added once
    second = run(h, mode="chat", prompt="And then?", history=history)
    # The model saw the earlier turn: the template over all three messages.
    messages = history + [{"role": "user", "content": "And then?"}]
    tok = tiny_engine.tokenizer
    assert second.prompt_text == render_chat(tok.chat_template, messages, bos_token=tok.bos_token,
                                             eos_token=tok.eos_token)
    history2 = after(h, second, history)["history"]
    assert [m["content"] for m in history2] == ["Hello", first.done.text, "And then?", second.done.text]
    # Regenerate: the last answer dropped, its question back in the box, then a normal run.
    popped = h.chat.pop_last_turn(history2)
    rest, prompt, mode, conversation = (popped[n] for n in ("history", "prompt", "mode", "conversation"))
    assert rest == history and prompt == "And then?" and mode == "chat" and "1 turn" in conversation
    with pytest.raises(gr.Error, match="no answer to regenerate"):
        h.chat.pop_last_turn([])
    new = h.chat.new_conversation()
    assert (new["history"], new["conversation"]) == ([], "")


def test_a_changed_system_prompt_says_earlier_turns_are_read_after_it(h):
    first = run(h, mode="chat", prompt="Hello", system="You are a pirate.")
    history = after(h, first, [])["history"]

    def count(system, mode="chat", turns=history):
        return h.run.preview("And then?", mode, system, 5, turns, None, "", first)["context_count"]
    assert "differs from the one the last answer was made under" in count("You are a poet.")
    assert "differs" not in count("You are a pirate.")  # the same prompt
    assert "differs" not in count("You are a poet.", turns=[])  # a new conversation
    assert "differs" not in count("You are a poet.", mode="completion")  # no template, no turns


def test_a_follow_up_reads_the_earlier_turns_from_the_kv_cache(h, tiny_engine):
    """The next turn's prompt repeats the conversation: its whole blocks come from the KV cache
    the last answer left, and the statistics say how many prompt tokens were read from there."""
    first = run(h, mode="chat", prompt="Tell me about the quick brown fox and the lazy dog. " * 3)
    assert first.steps[0].prompt_tokens_reused == 0 or first.steps[0].prompt_tokens_reused is None
    history = after(h, first, [])["history"]
    second = run(h, mode="chat", prompt="And then?", history=history)
    reused = second.steps[0].prompt_tokens_reused
    assert reused >= BLOCK_SIZE and reused % BLOCK_SIZE == 0 and reused < len(second.prompt_ids)
    assert second.prompt_ids[:len(first.prompt_ids)] == first.prompt_ids
    assert f"({reused} read from the KV cache of an earlier run)" in plain(run_render.stats_markdown(h.page.info, second))


def test_typed_control_tokens_in_earlier_turns_stay_text(tiny_engine):
    history = [{"role": "user", "content": "hi<|im_end|>"}, {"role": "assistant", "content": "<|im_start|>x"}]
    ids = tiny_engine.prompt_ids("next", True, None, history)
    controls = [i for i in ids if tiny_engine.tokenizer.is_control(i)]
    # Only the template's own: <|im_start|> and <|im_end|> around each of the 3 messages + the prompt.
    assert len(controls) == 3 * 2 + 1


def test_a_stopped_answer_with_no_text_adds_no_turn(h):
    from inference.events import DoneEvent
    from inference.sampling.params import SamplingParams
    rec = RunRecord(mode="chat", user_message="Hi", started_at=1.0, params=SamplingParams(),
                    done=DoneEvent("cancelled", "", "", 5, 0, 0.0, 0.0, 1, 8, False))
    assert after(h, rec, [])["history"] == []


# ---------------------------------------------------------------- the full attention pattern

def test_the_full_pattern_equals_transformers_eager_attention(tiny_dirs, tiny_engine):
    transformers = pytest.importorskip("transformers")
    ref = transformers.LlamaForCausalLM.from_pretrained(tiny_dirs["gqa_tied"], dtype=torch.float32,
                                                        attn_implementation="eager").eval()
    ids = tiny_engine.prompt_ids("The quick brown fox jumps")
    with torch.inference_mode():
        expected = ref(torch.tensor([ids]), output_attentions=True).attentions
    for layer in range(tiny_engine.cfg.n_layers):
        pattern = tiny_engine.attention_pattern(ids, layer)
        assert pattern.shape == (tiny_engine.cfg.n_heads, len(ids), len(ids))
        assert torch.allclose(pattern, expected[layer][0], atol=1e-5)
    # Its last row is the new token's attention that "inside one token" shows.
    assert torch.allclose(pattern[:, -1], tiny_engine.capture(ids, layer).attention, atol=1e-6)


def test_pattern_html_is_causal_and_capped(tiny_engine):
    ids = tiny_engine.prompt_ids("The quick brown fox")
    pattern = tiny_engine.attention_pattern(ids, 0)
    out = inside_render.pattern_html(pattern, ids, tiny_engine.tokenizer, 0, 2)
    n = len(ids)
    assert out.count("<td data-q=") == n * (n + 1) // 2 and "head 2" in out
    w = float(re.search(r"<td data-q='3' data-k='1' data-w='([\d.]+)'", out).group(1))
    assert w == pytest.approx(float(pattern[2, 3, 1]), abs=1e-4)
    big = torch.rand(1, 100, 100)
    assert "last 64 of 100 positions" in inside_render.pattern_html(big, list(range(100)), tiny_engine.tokenizer, 0, 0, 64)


# ---------------------------------------------------------------- links

def test_the_link_carries_the_seed_the_last_run_used(h):
    rec = run(h, seed="")
    a = after(h, rec, [])
    assert a["run_seed"] == str(rec.seed)
    c = Controls(prompt="The quick brown fox", max_new_tokens=8, seed="")
    link = h.share.share_link(*c.values(), "http://x/", None, a["run_seed"])  # the request, then the run's seed
    query = dict(parse_qsl(urlsplit(link).query))
    assert query["seed"] == str(rec.seed)
    restored, problems = controls_from_query(query, h.page.defaults)
    assert problems == [] and restored.seed == str(rec.seed)
    # A typed seed wins over the last run's.
    assert "seed=7" in h.share.share_link(*Controls(seed="7").values(), "http://x/", None, "123")


def test_link_numbers_are_written_as_javascript_writes_them():
    assert [query_value(v) for v in (1.0, 0.3, 7, 0.35000000000000003, "a b", 2.5)] == \
        ["1", "0.3", "7", "0.35000000000000003", "a b", "2.5"]
    assert "temperature=1&" in share_url("http://x/", Controls(temperature=1.0), Controls(temperature=0.7))


def test_link_values_the_page_cannot_hold_are_ignored_by_name(h, tiny_engine):
    c, problems = controls_from_query({"top_p": "7", "max_new_tokens": "99999", "prompt": "Hi"},
                                      h.page.defaults, {"max_new_tokens": tiny_engine.cfg.max_seq_len - 1})
    assert c.prompt == "Hi" and c.top_p == h.page.defaults.top_p and c.max_new_tokens == h.page.defaults.max_new_tokens
    assert [p.split("`")[1] for p in problems] == ["top_p", "max_new_tokens"]
    notice = h.share.restore(SimpleNamespace(query_params={"top_p": "7", "max_new_tokens": "99999"}))["notice"]
    assert notice.count("\n- ") == 2  # one Markdown list item each
    # A link that sets one of the "More settings" opens them.
    assert h.share.restore(SimpleNamespace(query_params={"min_p": "0.1"}))["more"]["open"] is True


# ---------------------------------------------------------------- downloads

def downloaded(h, html_links: str, which: int):
    """The file behind the page's `which`-th download link (as the download route finds it)."""
    url = re.findall(r"href='([^']+)'", html_links)[which]
    route, token, name = url.rsplit("/", 2)
    assert route == "tokenlab/download"
    return h.page.runs.downloads.path(token, name)


def test_the_runs_downloads_are_the_clis_jsonl_and_its_settings(h, tiny_dirs, capsys):
    rec = run(h, seed="5", temperature=0.0, max_new_tokens=6)
    a = after(h, rec, [])
    lines = [json.loads(x) for x in downloaded(h, a["downloads"], 0).read_text(encoding="utf-8").splitlines()]
    assert lines == [json.loads(json.dumps(s.to_json())) for s in rec.steps] + [
        {**rec.done.to_json(), **how_made(rec.params), "model": h.page.info.name}]  # the model that made it
    # The same fields, tokens and text as `python -m inference generate --jsonl`.
    from inference.cli import main
    assert main(["generate", "--model", str(tiny_dirs["gqa_tied"]), "--prompt", "The quick brown fox",
                 "--temperature", "0", "--max-new-tokens", "6", "--seed", "5", "--top", "5", "--jsonl",
                 "--device", "cpu", "--dtype", "float32"]) == 0
    cli = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [set(x) for x in cli] == [set(x) for x in lines]
    assert [x.get("token_id") for x in cli] == [x.get("token_id") for x in lines]
    assert cli[-1]["text"] == lines[-1]["text"] and cli[-1]["model"] == lines[-1]["model"] == "gqa_tied"
    settings = json.loads(downloaded(h, a["downloads"], 1).read_text(encoding="utf-8"))
    assert settings["seed"] == "5" and settings["prompt"] == "The quick brown fox" and settings["temperature"] == 0.0
    assert settings["model"] == "gqa_tied"  # the model that made it, by name (issue 62: it was "")


def test_old_downloads_are_deleted(h, monkeypatch):
    import ui.shared.downloads as downloads
    monkeypatch.setattr(downloads, "KEEP_FILES", 3)
    urls = [h.page.runs.downloads.write(f"f{i}.txt", "x") for i in range(5)]
    found = [h.page.runs.downloads.path(*u.rsplit("/", 2)[1:]) for u in urls]
    assert [f is not None for f in found] == [False, False, True, True, True]
    assert not (h.page.runs.downloads._files_dir / urls[0].rsplit("/", 2)[1]).exists()  # deleted, not only forgotten
    assert h.page.runs.downloads.path(urls[4].rsplit("/", 2)[1], "other.txt") is None  # only the name it wrote
    assert h.page.runs.downloads.path("../../etc", "passwd") is None
    assert run_jsonl(RunRecord()) == "\n"


# ---------------------------------------------------------------- waiting, prefill, status

def test_a_waiting_run_says_what_is_ahead_and_stop_ends_it_before_it_starts(h):
    c = Controls(prompt="The quick", max_new_tokens=5)
    out_a = h.run.begin(*c.values(), session("a"), [])
    out_b = h.run.begin(*c.values(), session("b"), [])
    status_b = out_b["status"]
    assert "Waiting for the engine" in status_b and "1 waiting before yours" in status_b
    assert "0 waiting before yours" in out_a["status"]
    assert out_b["generate"]["interactive"] is False and out_b["stop_button"]["interactive"] is True  # Generate off, Stop on
    assert out_b["step"]["maximum"] == 4  # the slider spans the steps to come
    assert all(out_b[name] == "" for name in STALE_PANELS)  # the old run's panels cleared
    h.run.stop(session("b"))  # Stop before the engine took it
    rec = list(h.run.generate(*c.values(), session("b"), []))[-1]["record"]
    assert rec.done.reason == "cancelled" and rec.steps == []
    h.run.closed(session("a"))
    assert h.page.runs._waiting == {}


def test_the_status_line_through_a_runs_life(h, tiny_engine):
    ctx = tiny_engine.cfg.max_seq_len
    rec = RunRecord(prompt_ids=[1] * 30, queued_at=10.0, max_steps=8)
    assert run_render.status_text(rec, ctx, 13.5, (1, 2)).startswith(
        "Waiting for the engine · 1 run in progress, 2 waiting before yours · 3.5 s so far")
    rec.started_at = 14.0
    assert run_render.status_text(rec, ctx, 16.0).startswith("Prefill of 30 prompt tokens… 2.0 s so far")
    rec.add(PrefillEvent(16, 30))  # a long prompt read a chunk a step
    assert run_render.status_text(rec, ctx, 16.5).startswith("Prefill of 16 of 30 prompt tokens read… 2.5 s so far")
    done = run(h)
    assert "Run ended: max new tokens reached · 8 tokens" in run_render.status_text(done, ctx, 0)
    assert h.run.live_tick(rec, session("x"))["status"].startswith("Prefill of 16 of 30")
    assert h.run.live_tick(done, session("x")) == {}


def test_the_context_counter(h, tiny_engine):
    n = len(tiny_engine.prompt_ids("The quick brown fox"))
    ctx = tiny_engine.cfg.max_seq_len
    assert h.page.runs.count_context("The quick brown fox", "completion", "", 20) == \
        f"Context: **{n}** prompt tokens + up to 20 new = {n + 20} of {ctx}"
    assert "lowered to" in h.page.runs.count_context("The quick brown fox", "completion", "", 10_000)
    chat = len(tiny_engine.prompt_ids("Hi", True, "be brief"))
    assert f"**{chat}** prompt tokens" in h.page.runs.count_context("Hi", "chat", "be brief", 5)
    assert h.page.runs.count_context("", "chat", "", 5, [{"role": "user", "content": "a"},
                                               {"role": "assistant", "content": "b"}]).startswith("Context: 1 earlier")


# ---------------------------------------------------------------- replay at the run's values

def test_replay_controls_start_at_the_runs_settings_and_an_untouched_replay_is_the_run(h):
    rec = run(h, temperature=0.6, top_k=9, top_p=0.8, min_p=0.02, repetition_penalty=1.1, seed="2")
    a = after(h, rec, [])
    values = [a[f"replay_{n}"] for n in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")]
    assert values == [0.6, 9, 0.8, 0.02, 1.1]
    md, bars = (lambda r: (r["replay_md"], r["replay_bars"]))(h.experiments.replay_step(rec, 4, *values))
    rows = [r for r in md.splitlines() if r.startswith("| ") and "kept (run)" not in r]
    assert len(rows) == 7
    for row in rows:
        cells = [x.strip() for x in row.split("|")[2:-1]]
        assert cells[:3] == cells[3:], row
    for a_p, b_p in re.findall(r"<span class='tl-p'>([^<]*)</span>.*?<span class='tl-p'>([^<]*)</span>", bars):
        assert a_p == b_p


# ---------------------------------------------------------------- outside the queue: never raise

def test_events_outside_the_queue_never_raise(h):
    rec = run(h)
    junk = (None, "x", -5, 1e9, float("nan"), "", [], {})
    for v in junk:
        assert isinstance(h.run.select_step(rec, v), str)
        assert h.run.select_token(rec, SimpleNamespace(index=v)) is not None
        assert isinstance(h.experiments.replay_step(rec, 0, v, v, v, v, v)["replay_md"], str)
        assert isinstance(h.page.runs.count_context(v, v, v, v), str)
        assert isinstance(h.inside.select_head(rec, 0, 0, v), str)
        try:  # a link is made, or refused with a message naming the field (in the queue)
            assert isinstance(h.share.share_link(*([v] * len(NAMES)), v, v), str)
        except gr.Error as e:
            assert re.search(r"prompt|seed|stop|mode", str(e)), e
        assert "status" in h.run.begin(*([v] * len(NAMES)), session("j"), v)
        assert "status" in h.run.begin(*Controls(mode="chat").values(), session("j"), [v])
    assert h.experiments.replay_step(None, 0, 1.0, 0, 1.0, 0.0, 1.0)["replay_md"].startswith("Generate first")
    assert h.inside.inspect_step(None, 0, 0)["stages_md"].startswith("Generate first")
    assert h.experiments.likelihood(None, 0, "x").startswith("Generate first")
    assert h.run.live_tick(None) == {}
    assert "generate" in h.run.after_run(None, None, session("j"))
    assert len(h.share.restore(SimpleNamespace(query_params={"top_k": "-1", "bogus": "x", "mode": "?"}))) == len(NAMES) + 2 - 1  # "more" stays as it is


def test_labels(h, tiny_engine):
    assert "diverges here" not in formatting.COLOR_MAP and "diverges here" in formatting.COMPARE_COLOR_MAP
    rec = run(h)
    assert "diverges" not in run_render.output_html(rec, tiny_engine.tokenizer)
    stats = plain(run_render.stats_markdown(h.page.info, RunRecord(prompt_ids=[1], steps=rec.steps, done=rec.done)))
    assert "Run ended: **max new tokens reached**." in stats and "Stopped:" not in stats
    assert formatting.REASONS["cancelled"].startswith("stopped on request")
    assert run_render._shown("a\nb") == "a↵\nb"  # a newline is seen, then breaks the line


def test_a_new_run_resets_the_last_runs_downloads_charts_and_seed(h):
    reset = h.run.begin(*Controls(prompt="The quick", max_new_tokens=3).values(), session("r"), [])
    assert "come with its end" in reset["downloads"] and reset["run_seed"] == ""
    assert "run_chart" not in reset and "rank_chart" not in reset  # kept until the new run redraws them
    h.run.closed(session("r"))


# ---------------------------------------------------------------- page polish

def as_seen(text: str, logp: bool) -> str:
    """HTML as the page shows it with the "Show log p" switch on or off (PROB_CSS hides one of
    each tl-p / tl-lp pair, and of each tl-p-word / tl-lp-word), tags removed."""
    hidden = "tl-p" if logp else "tl-lp"
    return re.sub("<[^>]+>", "", re.sub(f"<span class='{hidden}(?:-word)?'>[^<]*</span>", "", text))


def test_the_chosen_tokens_p_is_labelled_as_the_switch_shows_it(h, tiny_engine):
    from inference.events import Candidate, StepEvent
    step = StepEvent(step=3, token_id=7, piece=" Paris", text=" Paris", prob=0.88, raw_prob=0.5,
                     top=[Candidate(7, " Paris", 0.88, 0.5)], entropy=1.0, rank=1, kv_cache_bytes=0,
                     kv_cache_capacity_bytes=0, ms=1.0)
    bars = plain(formatting.bars_html(step))
    title = re.search("<div class='tl-title'>(.*?)</div>", bars).group(1)
    assert "with p = 0.8800 (raw p = 0.5000), rank 1" in as_seen(title, logp=False)
    assert "with log p = -0.128 (raw log p = -0.693), rank 1" in as_seen(title, logp=True)
    heads = re.findall("<span class='tl-h2[^']*'>(.*?)</span>(?=<span class='tl-h2|</div>)", bars)
    assert [as_seen(t, logp=False) for t in heads] == ["raw model probability", "final (sampled from)"]
    assert [as_seen(t, logp=True) for t in heads] == ["raw model log p", "final log p (sampled from)"]
    rec = run(h)
    first = rec.steps[0]
    head = re.search("<span class='tl-pop-head'>(.*?)</span><span class='tl-(?:alt|pop-rows3)",
                     run_render.output_html(rec, tiny_engine.tokenizer)).group(1)
    assert as_seen(head, logp=False).endswith(f"p = {formatting.fmt_p(first.prob)} (raw p = {formatting.fmt_p(first.raw_prob)})")
    assert as_seen(head, logp=True).endswith(f"log p = {formatting.fmt_logp(first.prob)} "
                                             f"(raw log p = {formatting.fmt_logp(first.raw_prob)})")
    summary = as_seen(exp_render.compare_summary(rec, rec, Divergence(0, 0)), logp=True)
    assert f"(log p = {formatting.fmt_logp(first.prob)})" in summary


def test_token_counts_have_a_thousands_separator(tiny_engine):
    tok = tiny_engine.tokenizer
    plain = next(i for i in range(tok.vocab_size) if not tok.is_control(i))
    view = run_render.run_tokens_html(tok, [plain] * 1441, [plain] * 1203)
    assert "Prompt of the run: 1,441 tokens" in view and "Generated: 1,203 tokens" in view


def test_the_colour_legend_shows_only_under_output(h, tiny_engine):
    tok = tiny_engine.tokenizer
    assert "tl-legend" not in run_render.output_html(None, tok)  # the page before any run
    assert "tl-legend" not in run_render.output_html(RunRecord(prompt_ids=[1]), tok)  # running, no token yet
    out = h.run.begin(*Controls(prompt="The quick", max_new_tokens=3).values(), session("l"), [])
    waiting = out["output"]
    assert "Waiting for the engine" in waiting
    assert "tl-legend" not in waiting
    h.run.closed(session("l"))
    assert "tl-legend" in run_render.output_html(run(h), tok)


def test_step_axes_start_at_the_first_step(tiny_engine):
    from ui.layout import build_ui
    plots = {b.elem_id: b.x_lim for b in build_ui(tiny_engine).blocks.values() if isinstance(b, gr.LinePlot)}
    # The KV chart starts at step 0 too: its cache then holds the prompt (kv_frame).
    assert plots == {"kv-chart": [0, None], "latency-chart": [0, None], "run-chart": [0, None],
                     "rank-chart": [0, None], "compare-chart": [0, None], "entropy-chart": [0, None]}


def test_the_pool_line_counts_blocks_in_words():
    from inference.events import StepEvent
    from inference.serving.kv_pool import PoolStats
    for held, words in ((1, "**1 block** of 16 positions"), (3, "**3 blocks** of 16 positions")):
        step = StepEvent(0, 5, "a", "a", 1.0, 1.0, [], 0.0, 1, 100, held * 8192, 10.0, kv_blocks=held,
                         pool=PoolStats(64, held, held, 1, 0, 8192, 2))
        text = kv_panel.pool_markdown(step)
        assert words in text and f"{held:,} of 64 blocks" in text and "2 kept from finished runs" in text
        assert "at step 0:" in text and f"by this run alone; {held} reserved for it" in text
    # The pool's numbers are then's (a finished run's blocks are back): the step says when; the
    # other runs are counted apart from this one, and those waiting for blocks are said to.
    crowded = StepEvent(7, 5, "a", "a", 1.0, 1.0, [], 0.0, 1, 100, 8192, 10.0, kv_blocks=1,
                        pool=PoolStats(64, 9, 40, 3, 1, 8192))
    text = kv_panel.pool_markdown(crowded)
    assert "at step 7:" in text and "by this run and 2 others; 40 reserved for them" in text
    assert "1 run waiting for blocks" in text and "kept from finished runs" not in text


def test_a_token_drawn_below_the_top_five_is_in_its_popover(h, tiny_engine):
    """The popover lists the five most likely alternatives and, when the token drawn was not
    among them (sampling), that token too, marked as the one chosen."""
    import dataclasses
    rec = run(h)
    first = rec.steps[0]
    others = [c for c in first.top if c.id != first.token_id]
    chosen = next(c for c in first.top if c.id == first.token_id)
    assert len(others) >= 5
    rec.steps[0] = dataclasses.replace(first, top=others[:7] + [chosen])  # drawn at rank 8
    out = run_render.output_html(rec, tiny_engine.tokenizer)
    start = out.index("<span class='tl-pop'")  # the first token's popover, up to the next one's
    end = out.find("<span class='tl-pop'", start + 1)
    pop = out[start:end if end > 0 else len(out)]
    assert pop.count("class='tl-alt") == 6 and pop.count("tl-alt-chosen") == 1
    assert pop.rindex("tl-alt-chosen") > pop.rindex("class='tl-alt'")  # listed last


def test_a_link_leaves_out_the_text_of_a_constraint_that_is_off(h):
    """Issue 62: the link carried a stale constraint_text while the constraint was none (the
    browser's link, share_js, is checked against this one in test_share_reload_browser.py)."""
    c = Controls(prompt="The quick", constraint="", constraint_text='{"type": "object"}', seed="3")
    link = h.share.share_link(*c.values(), "http://x/", None, "")
    assert "constraint_text" not in link and "constraint=" not in link
    on = Controls(**{**vars(c), "constraint": "json_schema"})
    assert "constraint_text=" in h.share.share_link(*on.values(), "http://x/", None, "")


def test_one_of_a_thing_is_said_in_the_singular(h, tiny_dirs):
    """Issue 62: "1 tokens", "1 key/value heads". A 1-token run's status, statistics and token
    view; a card of a model with one KV head."""
    import ui.shared.view as run_render
    from inference.serving.engine import Engine
    rec = run(h, max_new_tokens=1, seed="2")
    assert len(rec.steps) == 1
    status = run_render.status_text(rec, h.page.context, 0.0)
    assert " · 1 token · " in status and "1 tokens" not in status
    tokens = run_render.run_tokens_html(h.page.engine.tokenizer, rec.prompt_ids, [rec.steps[0].token_id])
    assert "Generated: 1 token<" in tokens and "1 of them a control token" in tokens
    assert "1 tokens" not in run_render.context_text(1, 1, None, 256)
    with Engine.from_hf_dir(tiny_dirs["llama3_rope"], device="cpu", dtype="float32") as one:
        card = plain(card_render.model_card(one.describe()))
    assert "/ 1 KV head ·" in card
