"""The page as people use it: Playwright driving Debian's chromium at 1400 px and 420 px, two
users at once, every HTTP response recorded. Runs that must be caught mid-way are held
(engine_hold.Hold, the `hold` fixture), never raced. Screenshots land in test-results/shots/test_ui_page/
(gitignored)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest

from browser import WAIT_MS, output_text, set_slider, shot, still_boxes, wait_loaded, wait_text
from browser import run_to_end as run_to_end_after
from conftest import no_early_end
from engine_hold import wait_until

SEED = "#seed input, #seed textarea"

# A chat template that, like SmolLM2's, adds a system prompt of its own when none is given.
DEFAULT_SYSTEM = "You are a tiny test assistant"
SMOL_LIKE_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def bias_token(monkeypatch, engine, token_id: int, every: int = 3, by: float = 1e4) -> None:
    """Make runs pick `token_id` on every `every`-th step (its logit raised in the model's output,
    before sampling), so an output is certain to hold that token (a newline, say) whatever the
    random weights."""
    forward, calls = engine.model.forward_paged, {"n": 0}

    def biased(*args, **kwargs):
        logits = forward(*args, **kwargs)  # (runs sampled this step, vocab)
        calls["n"] += 1
        if calls["n"] % every == 0:
            logits = logits.clone()
            logits[:, token_id] += by
        return logits

    monkeypatch.setattr(engine.model, "forward_paged", biased)


@pytest.fixture(scope="module")
def small_pool_app(tiny_dirs):
    """The page on a tiny model whose KV pool holds one long run: a second run waits for it."""
    from inference.serving.engine import Engine
    from inference.serving.kv_pool import BLOCK_SIZE
    from ui.handlers import Handlers
    from app import serve
    from ui.layout import build_ui

    probe = Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32", kv_pool_mib=1)
    per_block = BLOCK_SIZE * probe.cfg.kv_bytes_per_token(4)
    engine = Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32",
                                kv_pool_mib=12 * per_block / 2**20)  # 12 blocks of 16 positions
    no_early_end(engine)
    handlers = Handlers(engine)
    demo = build_ui(engine, handlers)
    _, url, _ = serve(demo, engine, port=None, block=False)
    yield url.rstrip("/"), engine, handlers
    demo.close()


@pytest.fixture(scope="module")
def chat_app(tiny_dirs, tmp_path_factory):
    """The page on a tiny model whose chat template has a default system prompt."""
    from inference.serving.engine import Engine
    from ui.handlers import Handlers
    from app import serve
    from ui.layout import build_ui

    d = tmp_path_factory.mktemp("smol_like") / "model"
    shutil.copytree(tiny_dirs["gqa_tied"], d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": SMOL_LIKE_TEMPLATE}))
    engine = Engine.from_hf_dir(d, device="cpu", dtype="float32")
    no_early_end(engine)
    handlers = Handlers(engine)
    demo = build_ui(engine, handlers)
    _, url, _ = serve(demo, engine, port=None, block=False)
    yield url.rstrip("/"), engine, handlers
    demo.close()


class Pages:
    """Browser pages opened by one test; each records every HTTP response it gets, and the
    test ends by checking that none was a 5xx."""

    def __init__(self, browser):
        self.browser, self.contexts, self.responses = browser, [], []

    def open(self, url: str, width: int = 1400, height: int = 1000, query: str = "?mode=completion"):
        """The page (by default in completion mode: these tests' runs keep their prompt, where a
        chat turn, the default of a model with a chat template, clears the box)."""
        ctx = self.browser.new_context(viewport={"width": width, "height": height},
                                       permissions=["clipboard-read", "clipboard-write"])
        self.contexts.append(ctx)
        page = ctx.new_page()
        page.set_default_timeout(WAIT_MS)
        page.on("response", lambda r: self.responses.append((r.status, r.request.method, r.url)))
        page.goto(url + "/" + query)
        wait_loaded(page)  # the link's settings and the saved work are in: the controls take input
        return page

    def server_errors(self) -> list:
        return [r for r in self.responses if r[0] >= 500]

    def close(self):
        for ctx in self.contexts:
            ctx.close()


@pytest.fixture
def pages(browser):
    p = Pages(browser)
    yield p
    p.close()
    assert p.server_errors() == [], p.server_errors()


def text_of(page, selector: str) -> str:
    return page.evaluate(f"(document.querySelector({selector!r})?.innerText || '')")


def set_number(page, selector: str, value) -> None:
    """Type a value into a number box and confirm it with Enter, as a person does; a slider's box
    ("#step input[type=number]") until the slider holds it."""
    if selector.endswith(" input[type=number]"):
        set_slider(page, selector.removesuffix(" input[type=number]"), value)
        return
    box = page.locator(selector)
    box.fill(str(value))
    box.press("Enter")


QUIET_JS = """() => ['#output', '#topk', '#stats', '#status', '#tokens', '#prompt-view'].every(
    (s) => !/(processing|\\b\\d+\\.\\ds\\b)/.test(document.querySelector(s)?.innerText || ''))"""


def refused(page, message: str) -> None:
    """Wait until a click on Generate was refused with `message`: said in the status line and
    in a toast, and the refused event over (gradio shows a timer on its outputs meanwhile)."""
    wait_text(page, "#status", message)
    page.locator(".toast-message-text", has_text=message).first.wait_for()
    page.wait_for_function(QUIET_JS)
    page.wait_for_function("!document.querySelector('#generate').disabled")


def run_to_end(page, button: str = "#generate") -> None:
    """Click `button`, and wait for this run's end."""
    run_to_end_after(page, lambda: page.click(button))


def stats_value(page, name: str) -> str:
    return page.evaluate("""(name) => {
        for (const row of document.querySelectorAll('#stats tr')) {
            const cells = row.querySelectorAll('td');
            if (cells.length === 2 && cells[0].innerText.trim() === name) return cells[1].innerText.trim();
        }
        return null; }""", name)


def open_accordion(page, title: str) -> None:
    page.get_by_text(title).first.click()


LINES_JS = """(sel) => [...document.querySelectorAll(sel)].map((el) => {
    const r = document.createRange(); r.selectNodeContents(el);
    const tops = new Set([...r.getClientRects()].filter((x) => x.width > 0).map((x) => Math.round(x.top)));
    return [el.innerText.trim(), tops.size]; })"""


def lines_per_cell(page, selector: str) -> list:
    """(text, number of lines it takes) for each element: a word broken mid-way takes two."""
    return page.evaluate(LINES_JS, selector)


# ---------------------------------------------------------------- sharing

def test_share_link_carries_the_last_runs_seed_and_really_copies(live_app, pages):
    from ui.controls import controls_from_query
    url, engine, handlers = live_app
    page = pages.open(url)
    page.fill("#prompt textarea", "The quick")
    page.fill(SEED, "")
    set_number(page, "#temperature input[type=number]", 1.2)
    run_to_end(page)
    seed = stats_value(page, "seed")
    assert seed and seed.isdigit()
    assert page.input_value(SEED) == ""  # the next run is random again; the link keeps this one's
    page.click("#copy-link")
    page.wait_for_function("(document.querySelector('#share-link textarea')?.value || '').includes('seed=')")
    link = page.input_value("#share-link textarea")
    assert f"seed={seed}" in link and "temperature=1.2" in link
    assert page.evaluate("navigator.clipboard.readText()") == link  # the click copied it
    c, problems = controls_from_query(dict(parse_qsl(urlsplit(link).query)), handlers.page.defaults)
    assert problems == [] and c.prompt == "The quick" and c.seed == seed and c.temperature == 1.2
    # The link reproduces the run.
    text = output_text(page)
    again = pages.open(url, query="?" + urlsplit(link).query)
    assert again.input_value(SEED) == seed
    run_to_end(again)
    assert output_text(again) == text


@pytest.mark.parametrize("width", [1400, 420])
def test_bad_link_values_are_ignored_and_named_one_per_line(live_app, pages, width):
    url, engine, handlers = live_app
    page = pages.open(url, width, query="?prompt=Hi&top_p=7&max_new_tokens=99999&temperature=0.3")
    items = page.locator("#notice li")
    items.first.wait_for()
    texts = items.all_inner_texts()
    assert len(texts) == 2 and "`top_p`" not in texts[0]  # Markdown's backticks become code
    assert "top_p" in texts[0] and "'7'" in texts[0]
    assert "max_new_tokens" in texts[1] and "99999" in texts[1]
    boxes = [items.nth(i).bounding_box() for i in range(2)]
    assert boxes[1]["y"] >= boxes[0]["y"] + boxes[0]["height"] - 1  # one per line
    # The good values are restored, the bad ones left at the page's defaults.
    assert page.input_value("#prompt textarea") == "Hi"
    assert float(page.input_value("#temperature input[type=number]")) == 0.3
    assert float(page.input_value("#top-p input[type=number]")) == handlers.page.defaults.top_p
    assert int(page.input_value("#max-new-tokens input[type=number]")) == handlers.page.defaults.max_new_tokens
    assert int(page.get_attribute("#max-new-tokens input[type=range]", "max")) == engine.cfg.max_seq_len - 1
    shot(page, f"bad-link-{width}", full=True)


# ---------------------------------------------------------------- controls in step with the run

def test_controls_follow_the_run(live_app, pages, hold):
    url, engine, _ = live_app
    hold = hold(engine)
    page = pages.open(url)
    assert page.is_disabled("#stop") and "secondary" in page.get_attribute("#stop", "class")
    set_number(page, "#max-new-tokens input[type=number]", 30)
    page.fill(SEED, "4")
    page.click("#generate")
    hold.allow(6)
    wait_text(page, "#topk .tl-title", "Step 5:")
    # Generate cannot be clicked twice; Stop is live; the slider reads the step the bars show.
    assert page.is_disabled("#generate") and not page.is_disabled("#stop")
    assert "stop" in page.get_attribute("#stop", "class").split()
    page.wait_for_function("document.querySelector('#step input[type=number]').value === '5'")
    assert page.get_attribute("#step input[type=range]", "max") == "29"
    assert "Step 5" in text_of(page, "#topk .tl-title") and "Generating" in text_of(page, "#status")
    shot(page, "during-run-1400", full=True)
    hold.open()
    wait_text(page, "#status", "Run ended")
    page.wait_for_function("!document.querySelector('#generate').disabled")
    assert page.is_disabled("#stop") and "secondary" in page.get_attribute("#stop", "class").split()
    wait_text(page, "#topk .tl-title", "Step 29:")
    assert page.input_value("#step input[type=number]") == "29"
    # Arrow keys move the bars with the slider.
    page.focus("#step input[type=range]")
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")
    wait_text(page, "#topk .tl-title", "Step 27:")
    # A step typed and confirmed with Enter.
    set_number(page, "#step input[type=number]", 7)
    wait_text(page, "#topk .tl-title", "Step 7:")
    assert page.input_value("#step input[type=range]") == "7"


def test_stop_and_its_wording(live_app, pages, hold):
    url, engine, _ = live_app
    hold = hold(engine)
    page = pages.open(url)
    set_number(page, "#max-new-tokens input[type=number]", 50)
    page.click("#generate")
    hold.allow(3)
    wait_text(page, "#topk .tl-title", "Step 2:")
    page.click("#stop")
    wait_text(page, "#status", "Run ended")
    stats = text_of(page, "#stats")
    assert "Run ended: stopped on request" in stats and "Stopped: stopped" not in stats
    assert "stopped on request" in text_of(page, "#status")
    wait_until(lambda: engine.active_runs == 0, "the run's end")


# ---------------------------------------------------------------- stale and half-cleared panels

def test_a_new_run_clears_the_old_panels_and_bad_input_keeps_them_all(live_app, pages):
    url, engine, _ = live_app
    page = pages.open(url)
    page.fill("#prompt textarea", "The quick brown")
    set_number(page, "#max-new-tokens input[type=number]", 8)
    run_to_end(page)
    open_accordion(page, "Sampling experiments")
    page.click("#replay")
    wait_text(page, "#replay-stages", "Step 7")
    page.click("#likely")
    wait_text(page, "#likely-table", "all")
    open_accordion(page, "Inside one token")
    page.click("#inspect")
    wait_text(page, "#stages", "Prefill")
    assert text_of(page, "#attention")
    # A new run: nothing of the previous prompt's results is left.
    page.fill("#prompt textarea", "Once upon a time")
    run_to_end(page)
    for sel in ("#replay-stages", "#replay-bars", "#likely-table", "#stages", "#attention", "#lens", "#pattern"):
        assert text_of(page, sel).strip() == "", sel
    # Bad input: the error is shown and every panel keeps the last run.
    def panels():
        page.wait_for_function(QUIET_JS)  # no event's timer over a panel (seen once on #tokens in CI)
        return {"output": output_text(page), "bars": text_of(page, "#topk"), "stats": text_of(page, "#stats"),
                "prompt view": page.input_value("#prompt-view textarea"), "tokens": text_of(page, "#tokens")}
    before = panels()
    assert before["output"] and "Once upon a time" in before["prompt view"]
    for field, value, message in (("#prompt textarea", "   ", "the prompt is empty"),
                                  (SEED, "abc", "Seed must be a whole number")):
        page.fill(field, value)
        page.click("#generate")
        refused(page, message)
        assert panels() == before, field
        page.fill(field, "Once upon a time" if field.startswith("#prompt") else "")
    shot(page, "bad-input-kept-1400", full=True)


# ---------------------------------------------------------------- no 5xx, every refusal named

def test_a_long_session_gets_no_5xx_and_every_refusal_names_its_field(live_app, pages):
    url, engine, _ = live_app
    page = pages.open(url)
    # Before any run: every experiment says what to do instead of failing.
    open_accordion(page, "Sampling experiments")
    page.click("#replay")
    wait_text(page, "#replay-stages", "Generate first")
    page.click("#likely")
    wait_text(page, "#likely-table", "Generate first")
    open_accordion(page, "Inside one token")
    page.click("#inspect")
    wait_text(page, "#stages", "Generate first")
    page.focus("#inspect-layer input[type=range]")
    page.keyboard.press("ArrowLeft")
    # Refused values, each named, none run.
    for selector, value, message in (
            ("#top-k input", "-3", "Top-k must be in [0, ∞)"),
            ("#top-k input", "2.5", "Top-k must be a whole number"),
            ("#top-k input", "", "Top-k must be a number")):
        page.fill(selector, value)
        page.click("#generate")
        refused(page, message)
    page.fill("#top-k input", "0")
    # A slider's box takes what its slider can hold: a typed 7 becomes 1, on show and in the run.
    for selector, value, shown in (("#top-p input[type=number]", "7", "1"),
                                   ("#temperature input[type=number]", "-1", "0"),
                                   ("#max-new-tokens input[type=number]", "0", "1")):
        page.fill(selector, value)
        page.locator(selector).press("Tab")
        page.wait_for_function(f"document.querySelector({selector!r}).value === {shown!r}")
    assert output_text(page) is None  # nothing ran
    # Then a normal session: run, steps, replay, score, inspect, heads, compare, share, chat.
    set_number(page, "#max-new-tokens input[type=number]", 12)
    run_to_end(page)
    page.click("#output .tl-t >> nth=2")
    page.focus("#step input[type=range]")
    page.keyboard.press("ArrowLeft")
    page.click("#replay")
    # Edit its controls once the click's replay is shown: on a busy machine its answer came after
    # the edit and the panel kept the run's settings' stages (1 failure in 3-4 beside a CPU burner)
    wait_text(page, "#replay-stages", "every token of the vocabulary through each stage")
    set_number(page, "#replay-top-k input", "-1")
    wait_text(page, "#replay-stages", "Top-k must be in")  # named by its label
    set_number(page, "#replay-top-k input", "3")
    wait_text(page, "#replay-stages", "Step")
    # A typed value reaches the replay before its slider clamps it: the schema names it.
    page.fill("#replay-top-p input[type=number]", "7")
    wait_text(page, "#replay-stages", "Top-p must be in (0, 1]")
    page.fill("#replay-top-p input[type=number]", "0.5")
    wait_text(page, "#replay-stages", "Step")
    page.click("#likely")
    wait_text(page, "#likely-table", "all")  # one experiment at a time, as a person clicks them
    page.click("#inspect")
    wait_text(page, "#stages", "Prefill")
    page.focus("#inspect-head input[type=range]")
    page.keyboard.press("ArrowRight")
    page.click("#compare")
    wait_text(page, "#compare-summary", "perplexity")
    page.click("#copy-link")
    page.locator("#mode input[value=chat]").check()
    run_to_end(page)
    assert page.is_disabled("#stop")  # nothing running
    assert not pages.server_errors()
    assert len(pages.responses) > 40


# ---------------------------------------------------------------- waiting, long prompts

def test_a_queued_user_sees_the_wait_and_a_long_prompt_its_prefill(small_pool_app, pages, hold):
    url, engine, _ = small_pool_app
    held = hold(engine)
    a = pages.open(url, 1400)
    b = pages.open(url, 420, 900)
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 4
    n = len(engine.prompt_ids(long_prompt))
    a.fill("#prompt textarea", long_prompt)
    set_number(a, "#max-new-tokens input[type=number]", 20)  # 11 of the pool's 12 blocks
    a.click("#generate")
    wait_until(lambda: held.started >= 1, "A's prefill")  # under way, and held
    wait_text(a, "#status", f"{n} prompt tokens")  # "Prefill of N" or, past a first chunk, "of N ... read"
    # (gradio may put a pending update's timer, "0.4s", above the line on a busy machine)
    assert re.sub(r"^[\d.]+s\s*", "", text_of(a, "#status")).startswith("Prefill of")
    assert f"prefill of {n} tokens" in text_of(a, "#output")
    b.fill("#prompt textarea", "Once upon a time")
    b.click("#generate")  # may grow to 9 blocks: it waits until A gives its blocks back
    wait_text(b, "#status", "Waiting for the server: 1st in line")
    assert "may grow to" in text_of(b, "#status") and "Waiting for the server" in text_of(b, "#output")
    assert "Waiting for the server" not in text_of(b, "#notice")  # said once
    first = float(re.search(r"([\d.]+) s so far", text_of(b, "#status")).group(1))
    b.wait_for_function(f"parseFloat((document.querySelector('#status').innerText.match(/([\\d.]+) s so far/) "
                        f"|| [0, 0])[1]) >= {first + 1.0}")  # the time counts up
    assert "No run yet" not in text_of(b, "#stats")
    assert b.is_disabled("#generate") and not b.is_disabled("#stop")
    shot(a, "prefill-1400", full=True)
    shot(b, "queued-420", full=True)
    held.open()
    wait_text(a, "#status", "Run ended")
    wait_text(b, "#status", "Run ended")
    assert output_text(a) is not None and output_text(b) is not None


# ---------------------------------------------------------------- labels

def test_newline_tokens_are_visible_and_clickable(live_app, pages, monkeypatch):
    url, engine, _ = live_app
    newline = engine.tokenizer.encode_continuation("\n")[-1]
    bias_token(monkeypatch, engine, newline, every=3)
    page = pages.open(url)
    set_number(page, "#max-new-tokens input[type=number]", 12)
    page.fill(SEED, "1")  # a random seed's run may end (EOS) before its third token
    run_to_end(page)
    assert "\n" in output_text(page)
    marks = page.locator("#output .tl-t", has_text="↵")
    steps = page.locator("#output .tl-t").count()
    assert marks.count() >= max(1, steps // 3), (marks.count(), steps)  # every third token a newline
    box = marks.first.bounding_box()
    assert box["width"] > 3 and box["height"] > 3  # drawn, hence clickable
    marks.first.click()
    page.wait_for_function("document.querySelector('#topk .tl-title').innerText.includes('↵')")
    legend = text_of(page, "#output .tl-legend")
    assert "p ≥ 0.9" in legend and "diverges" not in legend


def test_replay_starts_at_the_run_and_follows_its_controls(live_app, pages):
    url, engine, _ = live_app
    page = pages.open(url)
    set_number(page, "#temperature input[type=number]", 0.4)
    page.fill("#top-k input", "7")
    set_number(page, "#max-new-tokens input[type=number]", 10)
    page.fill(SEED, "3")
    run_to_end(page)
    open_accordion(page, "Sampling experiments")
    assert float(page.input_value("#replay-temperature input[type=number]")) == 0.4
    assert page.input_value("#replay-top-k input") == "7"
    assert float(page.input_value("#replay-top-p input[type=number]")) == 0.9  # the model's default
    page.click("#replay")
    wait_text(page, "#replay-stages", "Step 9")
    rows = page.evaluate("""[...document.querySelectorAll('#replay-stages tr')].slice(1).map(
        (r) => [...r.querySelectorAll('td')].map((c) => c.innerText.trim()))""")
    assert rows and all(r[1:4] == r[4:7] for r in rows)  # an untouched replay is the run
    bars = page.evaluate("""[...document.querySelectorAll('#replay-bars .tl-row:not(.tl-head)')].map(
        (r) => [...r.querySelectorAll('.tl-num .tl-p')].map((x) => x.innerText))""")
    assert bars and all(a == b for a, b in bars)
    # Moving a replay control updates the replay, with no button.
    before = text_of(page, "#replay-stages")
    page.focus("#replay-temperature input[type=range]")
    for _ in range(12):
        page.keyboard.press("ArrowRight")
    page.wait_for_function(f"document.querySelector('#replay-stages').innerText !== {before!r}")
    after = text_of(page, "#replay-stages")
    assert "Step 9" in after and after != before
    set_number(page, "#replay-top-k input", 1)
    page.wait_for_function("[...document.querySelectorAll('#replay-stages tr')].some("
                           "(r) => r.innerText.startsWith('top-k') && r.cells[4].innerText.trim() === '1')")
    shot(page, "replay-1400", full=True)


def test_default_system_prompt_is_shown_in_chat_mode_and_follow_ups_continue(chat_app, pages):
    url, engine, _ = chat_app
    page = pages.open(url, 1400, 1200)
    # Choosing a mode swaps the other mode's example for its own; a prompt of one's own stays.
    from ui.controls import CHAT_PROMPT, DEFAULT_PROMPT
    page.fill("#prompt textarea", DEFAULT_PROMPT)
    for mode, example in (("chat", CHAT_PROMPT), ("completion", DEFAULT_PROMPT), ("chat", CHAT_PROMPT)):
        page.locator(f"#mode input[value={mode}]").check()
        page.wait_for_function(f"document.querySelector('#prompt textarea').value === {example!r}")
    page.fill("#prompt textarea", "My own words")
    page.locator("#mode input[value=completion]").check()
    page.locator("#mode input[value=chat]").check()
    assert page.input_value("#prompt textarea") == "My own words"
    assert DEFAULT_SYSTEM in page.get_attribute("#system textarea, #system input", "placeholder")
    page.fill("#prompt textarea", "Hello there")
    set_number(page, "#max-new-tokens input[type=number]", 6)
    page.fill(SEED, "1")
    wait_text(page, "#context-count", f"{len(engine.prompt_ids('Hello there', True, ''))} prompt tokens")
    run_to_end(page)
    assert DEFAULT_SYSTEM in page.input_value("#prompt-view textarea")  # what the box said it would add
    first_answer = output_text(page)
    wait_text(page, "#conversation", "1 turn")
    assert page.input_value("#prompt textarea") == ""  # ready for the follow-up
    assert not page.is_disabled("#regenerate")
    page.fill("#prompt textarea", "And then?")
    run_to_end(page)
    # The follow-up repeats the conversation: its whole blocks came from the first turn's KV cache.
    wait_text(page, "#stats", "read from the KV cache of an earlier run")
    fed = page.input_value("#prompt-view textarea")
    assert first_answer in fed, (first_answer, fed)
    assert fed.index("Hello there") < fed.index(first_answer) < fed.index("And then?")  # earlier turn kept
    wait_text(page, "#conversation", "2 turns")
    # Regenerate the last answer: the conversation keeps the first turn and gets a new second.
    page.fill(SEED, "2")
    run_to_end(page, "#regenerate")
    wait_text(page, "#conversation", "2 turns")
    fed = page.input_value("#prompt-view textarea")
    assert fed.count("And then?") == 1 and fed.count("Hello there") == 1
    turns = page.locator("#conversation .tl-turn").all_inner_texts()
    assert len(turns) == 4 and "And then?" in turns[2]
    assert turns[3] == "assistant: " + output_text(page)  # the regenerated answer replaced the old
    shot(page, "chat-1400", full=True)
    page.click("#new-conversation")
    page.wait_for_function("document.querySelectorAll('#conversation .tl-turn').length === 0")


def test_attention_layer_change_updates_without_a_click(live_app, pages):
    url, engine, _ = live_app
    page = pages.open(url)
    set_number(page, "#max-new-tokens input[type=number]", 5)
    run_to_end(page)
    open_accordion(page, "Inside one token")
    page.click("#inspect")
    last = engine.cfg.n_layers - 1
    wait_text(page, "#attention", f"Layer {last}:")
    page.focus("#inspect-layer input[type=range]")
    page.keyboard.press("ArrowLeft")
    wait_text(page, "#attention", f"Layer {last - 1}:")


# ---------------------------------------------------------------- what users of similar tools expect

def test_tokens_show_their_alternatives_and_the_run_can_be_copied_and_downloaded(live_app, pages):
    from inference.events import DoneEvent, StepEvent
    url, engine, handlers = live_app
    page = pages.open(url)
    page.fill("#prompt textarea", "The quick brown")
    set_number(page, "#max-new-tokens input[type=number]", 9)
    page.fill(SEED, "8")
    run_to_end(page)
    token = page.locator("#output .tl-t").nth(1)
    token.hover()
    pop = token.locator(".tl-pop")
    pop.wait_for(state="visible")
    # "steps 1–2" where a character took two tokens (the tiny tokenizer's byte fallback)
    assert re.search(r"steps? \d+(–\d+)? · id \d+ · p = 0\.\d{4} \(raw p = 0\.\d{4}\)", pop.inner_text())
    assert pop.locator(".tl-alt").count() >= 2 and pop.locator(".tl-alt-chosen").count() == 1
    # Drawn over the page, not clipped by the output's scroll box: its middle is really it.
    assert page.evaluate("""(() => { const p = [...document.querySelectorAll('#output .tl-pop')]
        .find((x) => getComputedStyle(x).display !== 'none'); const r = p.getBoundingClientRect();
        return p.contains(document.elementFromPoint(r.left + r.width / 2, r.top + r.height - 3)); })()""")
    shot(page, "popover-1400", full=True)
    # Copy the text.
    page.click("#copy-text")
    page.wait_for_function("navigator.clipboard.readText().then((t) => t.length > 0)", polling=200)
    assert page.evaluate("navigator.clipboard.readText()") == output_text(page)
    # Download the run's steps (the CLI's --jsonl lines) and its settings.
    with page.expect_download() as d:
        page.click("#download-run")
    lines = [json.loads(x) for x in Path(d.value.path()).read_text().splitlines()]
    assert len(lines) == 10 and lines[-1]["done"] and lines[-1]["seed"] == 8
    # StepEvent.to_json's fields (those of step 0 included; a constraint's cost only in a constrained
    # run), then DoneEvent.to_json's.
    unconstrained = {"constraint_kl", "free_prob", "constraint_removed"}
    assert set(StepEvent.__dataclass_fields__) - {"pool", "wait_ms", "sampler_state"} - unconstrained <= set(lines[0])
    assert not unconstrained & set(lines[0]) and lines[0]["prompt_tokens"] > 0
    assert "prefill_ms" not in lines[1] and set(lines[-1]) == set(DoneEvent.__dataclass_fields__) | {"settings", "sampler_order", "model"}
    # The tiny model can emit a NUL byte, which no HTML page holds (its parser shows U+FFFD).
    text = "".join(x["text"] for x in lines[:-1]) + lines[-1]["tail"]
    assert text.replace("\x00", "\ufffd") == output_text(page)
    with page.expect_download() as d:
        page.click("#download-settings")
    settings = json.loads(Path(d.value.path()).read_text())
    assert settings["seed"] == "8" and settings["prompt"] == "The quick brown" and settings["max_new_tokens"] == 9
    # The tokenization view has the generated tokens too.
    assert "Generated: 9 tokens" in text_of(page, "#tokens")


def test_context_counter_while_typing_and_during_the_run(live_app, pages, hold):
    url, engine, _ = live_app
    hold = hold(engine)
    page = pages.open(url)
    ctx = engine.cfg.max_seq_len
    page.fill("#prompt textarea", "Once upon a time there was")
    n = len(engine.prompt_ids("Once upon a time there was"))
    set_number(page, "#max-new-tokens input[type=number]", 40)
    wait_text(page, "#context-count", f"Context: {n} prompt tokens + up to 40 new = {n + 40} of {ctx}")
    page.locator("#prompt textarea").press_sequentially(" a fox")
    n2 = len(engine.prompt_ids("Once upon a time there was a fox"))
    wait_text(page, "#context-count", f"Context: {n2} prompt tokens")
    page.click("#generate")
    hold.allow(4)
    wait_text(page, "#status", f"Context: {n2} prompt + 4 generated = {n2 + 4} of {ctx}")
    hold.open()
    wait_text(page, "#status", f"Context: {n2} prompt + 40 generated = {n2 + 40} of {ctx}")


def test_full_attention_pattern_with_hover(live_app, pages):
    url, engine, _ = live_app
    page = pages.open(url)
    page.fill("#prompt textarea", "The quick brown fox")
    set_number(page, "#max-new-tokens input[type=number]", 4)
    run_to_end(page)
    n = len(engine.prompt_ids("The quick brown fox")) + 3  # the context of the last step
    open_accordion(page, "Inside one token")
    page.click("#inspect")
    wait_text(page, "#stages", "Prefill")
    page.get_by_role("tab", name="Full pattern").click()
    page.locator("#pattern .tl-pattern").wait_for()
    assert page.locator("#pattern th.tl-q").count() == n
    assert page.locator("#pattern td[data-q]").count() == n * (n + 1) // 2  # causal: row i sees 0..i
    cell = page.locator("#pattern td[data-q='3'][data-k='1']")
    cell.hover()
    wait_text(page, "#pattern .tl-pat-info", "query 3")
    info = text_of(page, "#pattern .tl-pat-info")
    assert "→ key 1" in info and "weight 0." in info
    assert page.locator("#pattern th.tl-hl").count() == 2  # its row's and its column's token
    # Another head: redrawn from the kept capture.
    page.focus("#inspect-head input[type=range]")
    page.keyboard.press("ArrowRight")
    wait_text(page, "#pattern .tl-title", "head 1")
    shot(page, "pattern-1400", full=True)


# ---------------------------------------------------------------- layout at both widths

@pytest.mark.parametrize("width", [1400, 420])
def test_layout_at_both_widths(live_app, pages, width):
    url, engine, _ = live_app
    page = pages.open(url, width, 1000)
    long_prompt = "Once upon a time, a tiny language model predicted the next token. " * 3
    page.fill("#prompt textarea", long_prompt)
    set_number(page, "#max-new-tokens input[type=number]", 40)
    page.fill(SEED, "123456789")
    run_to_end(page)
    vw = width
    # Run statistics: no header or value broken over lines.
    cells = lines_per_cell(page, "#stats th, #stats td")
    assert len(cells) >= 14 and all(n == 1 for _, n in cells), cells
    # Narrow screens: the output and its bars come before the long list of settings.
    top = lambda sel: page.locator(sel).bounding_box()["y"]  # noqa: E731
    left = lambda sel: page.locator(sel).bounding_box()["x"]  # noqa: E731
    if width < 800:
        assert top("#prompt") < top("#output") < top("#topk") < top("#settings")
    else:  # the prompt over the settings on the left, the output over its bars on the right
        assert left("#output") > left("#prompt") + 300 and left("#topk") > left("#settings") + 300
        assert top("#prompt") < top("#settings") and top("#output") < top("#topk") < top("#output") + 400
    # Nothing is clipped by the window: bars, tokens.
    for sel in ("#topk .tl-bars", "#tokens .tl-chips", "#output .tl-out"):
        box = page.locator(sel).first.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= vw + 1, (sel, box)
    # The tokenization view scrolls (its height is capped).
    scroll = page.evaluate("""(() => { const el = document.querySelector('#tokens .tl-chips');
        const style = getComputedStyle(el), over = el.scrollHeight > el.clientHeight + 4;
        el.scrollTop = 60;
        return [style.overflowY, style.maxHeight, over, el.scrollTop]; })()""")
    if width > 800:
        assert scroll[:2] == ["auto", "220px"] and (scroll[3] > 0 or not scroll[2]), scroll
    else:  # a narrow (touch) screen shows every chip, with the page's own scroll: none is cut
        assert scroll[:3] == ["visible", "none", False], scroll
    shot(page, f"layout-{width}", full=True)
    # The replay table: its headers stay whole.
    open_accordion(page, "Sampling experiments")
    page.click("#replay")
    wait_text(page, "#replay-stages", "Step 39")
    heads = lines_per_cell(page, "#replay-stages th")
    assert len(heads) == 7 and all(n == 1 for _, n in heads), heads
    box = page.locator("#replay-stages table").bounding_box()
    assert box["x"] + min(box["width"], vw) <= vw + 1
    # Inside one token: the attention table is wide enough to read, the lens scrolls sideways.
    open_accordion(page, "Inside one token")
    page.click("#inspect")
    wait_text(page, "#stages", "Prefill")
    att = page.locator("#attention .tl-att").bounding_box()
    assert att["width"] >= min(300, vw - 60), att
    page.get_by_role("tab", name="Logit lens").click()
    lens = page.locator("#lens .tl-lens")
    lens.wait_for()
    lb = lens.bounding_box()
    assert lb["x"] + lb["width"] <= vw + 1 and page.evaluate(
        "getComputedStyle(document.querySelector('#lens .tl-lens')).overflowX") == "auto"
    page.get_by_role("tab", name="Attention", exact=True).click()
    shot(page, f"layout-inside-{width}", full=True)


# ---------------------------------------------------------------- popovers, candidate numbers, downloads, the system box

VISIBLE_POPOVERS_JS = """() => [...document.querySelectorAll('#output .tl-pop')]
    .filter((p) => getComputedStyle(p).display !== 'none').map((p) => Number(p.parentElement.dataset.i))"""

POPOVER_BY_ITS_TOKEN_JS = """(i) => {
    const t = document.querySelector(`#output .tl-t[data-i="${i}"]`), p = t.querySelector('.tl-pop');
    const a = t.getBoundingClientRect(), b = p.getBoundingClientRect();
    return Math.abs(b.top - (a.bottom + 4)) < 1.5 || Math.abs(b.bottom - (a.top - 4)) < 1.5; }"""


def test_one_popover_at_a_time_and_it_stays_by_its_token(live_app, pages):
    """A tapped token keeps focus, and with it its popover: hovering another token shows that
    one's alone, and the page's scrolling takes the open popover along with its token."""
    url, engine, _ = live_app
    page = pages.open(url, 420, 800)
    set_number(page, "#max-new-tokens input[type=number]", 24)
    page.fill(SEED, "5")
    run_to_end(page)
    page.locator("#output .tl-t[data-i='2']").click()  # a tap: focus
    assert page.evaluate(VISIBLE_POPOVERS_JS) == [2]
    page.locator("#output .tl-t[data-i='5']").hover()
    assert page.evaluate(VISIBLE_POPOVERS_JS) == [5]
    page.mouse.move(2, 2)  # away from the output: the tapped token's popover again
    assert page.evaluate(VISIBLE_POPOVERS_JS) == [2]
    assert page.evaluate(POPOVER_BY_ITS_TOKEN_JS, 2)
    page.evaluate("window.scrollBy(0, 150)")
    page.wait_for_function(POPOVER_BY_ITS_TOKEN_JS, arg=2)
    shot(page, "popover-scrolled-420", full=True)


@pytest.mark.parametrize("width", [1400, 420])
def test_candidate_numbers_stay_on_one_line(live_app, pages, width):
    """Small probabilities are written as 8.89e-05: the bars' number columns hold them whole,
    as p and as log p."""
    url, engine, _ = live_app
    token = engine.tokenizer.encode_continuation(" the")[-1]
    # A logit bias of 12 and nothing cut: the rest of the final distribution's top 10 below 1e-4.
    page = pages.open(url, width, 1000, f"?logit_bias={token}:12&temperature=1&top_k=0&top_p=1&min_p=0"
                                        "&seed=1&max_new_tokens=3")
    run_to_end(page)
    shown = page.locator("#topk .tl-num .tl-p").all_inner_texts()
    assert any("e-" in t for t in shown), (shown, text_of(page, "#topk .tl-title"), text_of(page, "#status"))
    cells = lines_per_cell(page, "#topk .tl-num")
    assert len(cells) == 20 and all(n == 1 for _, n in cells), cells  # raw and final, 10 rows
    page.locator("#show-logp input").check()  # log p shown instead: -15.2, 0.000
    page.wait_for_function("/^[-−0]/.test(document.querySelector('#topk .tl-num').innerText)")
    cells = lines_per_cell(page, "#topk .tl-num")
    assert all(re.fullmatch(r"[-−]?\d+\.\d{3}|−∞", t) and n == 1 for t, n in cells), cells
    shot(page, f"bars-small-numbers-{width}", full=True)


def test_a_new_run_takes_the_last_runs_downloads_and_seed_away(live_app, pages, hold):
    """While a run is going the page offers no download and no seed of the run before it: its
    files and its seed (a link made now would carry it) belong to another prompt."""
    url, engine, _ = live_app
    hold = hold(engine)
    hold.open()
    page = pages.open(url)
    page.fill(SEED, "")
    set_number(page, "#max-new-tokens input[type=number]", 6)
    run_to_end(page)
    first_seed = stats_value(page, "seed")
    assert page.locator("#download-run").count() == 1
    hold.close()
    page.fill("#prompt textarea", "Once upon a time")
    page.click("#generate")
    hold.allow(2)
    wait_text(page, "#topk .tl-title", "Step 1:")
    assert page.locator("#download-run").count() == 0 and "come with its end" in text_of(page, "#downloads")
    page.click("#copy-link")
    page.wait_for_function("(document.querySelector('#share-link textarea')?.value || '').includes('Once')")
    query = dict(parse_qsl(urlsplit(page.input_value("#share-link textarea")).query, keep_blank_values=True))
    assert query["seed"] == "" and first_seed not in page.input_value("#share-link textarea")
    hold.open()
    wait_text(page, "#status", "Run ended")
    page.locator("#download-run").wait_for()


@pytest.mark.parametrize("width", [1400, 420])
def test_the_system_box_is_wide_enough_to_read_the_default(chat_app, pages, width):
    """The system box shows the model's default system prompt: beside the mode at 1400 px,
    under it and the whole column wide at 420 px (half a narrow column cut the default off)."""
    url, engine, _ = chat_app
    page = pages.open(url, width, 900)
    page.locator("#mode input[value=chat]").check()
    page.locator("#conversation").wait_for()  # shown in chat mode, above the prompt: the layout moves
    system, prompt, mode = still_boxes(page, "#system textarea", "#prompt textarea", "#mode")
    if width < 800:
        assert system["width"] >= 0.8 * prompt["width"] and system["y"] >= mode["y"] + mode["height"], (system, mode)
    else:
        assert system["x"] > mode["x"] + mode["width"] - 1 and system["y"] < mode["y"] + mode["height"], (system, mode)
    shot(page, f"system-box-{width}", full=True)
