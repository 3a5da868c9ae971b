"""The page's lesson handlers (ui/lesson) on the tiny engine: the chapters shown are the numbers
explain() computes, Back and Next stay within the lesson, a refusal is one line."""

from helpers import plain
from inference.lesson.explain import CHAPTERS
from ui.controls import Controls


def start(h, prompt, **controls):
    """The lesson's Start as the page sends it: every control, then the lesson's prompt."""
    return h.lesson.lesson_start(*Controls(**controls).values(), prompt)


def test_start_shows_chapter_one_and_moves_within_the_lesson(h):
    out = start(h, "The quick brown fox", temperature=0.7, top_p=0.8, seed="5")
    data = out["lesson_data"]
    assert [c["key"] for c in data["chapters"]] == [k for k, _ in CHAPTERS]
    ids = data["chapters"][0]["ids"]
    assert ids == h.page.engine.tokenizer.encode("The quick brown fox")
    view = out["lesson_view"]
    assert "Chapter 1 of 9: Tokenize" in view and f"<td>{ids[-1]}</td>" in view
    assert out["lesson_index"] == 0 and out["lesson_back"]["interactive"] is False
    moved = h.lesson.lesson_next(data, 0)
    assert moved["lesson_index"] == 1 and "Chapter 2 of 9: Embed" in moved["lesson_view"]
    last = h.lesson.lesson_next(data, 8)
    assert last["lesson_index"] == 8 and last["lesson_next"]["interactive"] is False
    assert "LLaMA-7B" in last["lesson_view"]
    assert h.lesson.lesson_back(data, 0)["lesson_index"] == 0
    settings = data["chapters"][5]["settings"]  # the page's settings and seed, not the model's defaults
    assert (settings["temperature"], settings["top_p"], settings["seed"]) == (0.7, 0.8, 5)


def test_every_chapter_names_a_panel_that_exists(h):
    from ui.layout import build_ui
    from ui.lesson.render import EXPLORE
    demo = build_ui(h.page.engine, h)
    ids = {getattr(b, "elem_id", None) for b in demo.blocks.values()}
    assert set(EXPLORE) == {k for k, _ in CHAPTERS}
    for key, links in EXPLORE.items():
        for elem_id, _ in links:
            assert elem_id in ids, (key, elem_id)


def test_an_empty_prompt_is_refused_in_one_line(h):
    out = start(h, "  ")
    assert out["lesson_data"] is None and "Type a prompt first" in out["lesson_view"]
    out = start(h, "The quick brown fox", top_p=1.5)  # a setting a run refuses: named in one line
    assert out["lesson_data"] is None and "Top-p" in out["lesson_view"] and "\n" not in out["lesson_view"]
    assert h.lesson.lesson_next(None, 0)["lesson_next"]["interactive"] is False


# ---------------------------------------------------------------- issue 62: what the lesson says


def chapter(out, key):
    return next(c for c in out["lesson_data"]["chapters"] if c["key"] == key)


def view(out, key):
    from ui.lesson.render import chapter_html
    data = out["lesson_data"]
    return plain(chapter_html(data, next(i for i, c in enumerate(data["chapters"]) if c["key"] == key)))


def test_the_lesson_follows_the_top_token_by_default_and_a_sampled_one_when_asked(h):
    # Temperature 1 and a seed: the lesson still follows the model's most likely token, and says so.
    out = start(h, "The quick brown fox", temperature=1.0, seed="4")
    top = chapter(out, "lm_head")["top"][0]["id"]
    s = chapter(out, "sampling")
    assert s["follow"] == "top" and s["chosen"]["id"] == top and s["chosen"]["rank"] == 1
    kv = chapter(out, "kv_cache")  # the cache demonstration's greedy tokens are the run's
    assert s["run_tokens"] == kv["tokens"][:len(s["run_tokens"])]
    assert "follows the most likely token" in view(out, "sampling")
    assert "it follows the most likely token at each step" in view(out, "tokenize")
    # Sampled: the run is the one Generate makes with these settings and seed.
    out = h.lesson.lesson_start(*Controls(temperature=1.0, seed="4", max_new_tokens=16).values(),
                                "The quick brown fox", "completion", "sampled")
    from helpers import page_run
    from types import SimpleNamespace
    rec = page_run(h, SimpleNamespace(session_hash="lesson"), prompt="The quick brown fox", temperature=1.0,
                   seed="4", max_new_tokens=16)
    s = chapter(out, "sampling")
    assert s["follow"] == "sampled" and s["run_tokens"] == [st.piece for st in rec.steps]
    assert "sampled with the page's settings (seed 4)" in view(out, "tokenize")


def test_the_lesson_reads_the_prompt_in_the_pages_mode_and_says_why_an_example_is_not(h):
    out = h.lesson.lesson_start(*Controls(mode="chat", seed="1").values(), "Hello there", "chat", "top")
    assert chapter(out, "tokenize")["ids"] == h.page.engine.prompt_ids("Hello there", chat=True)
    assert "chat mode: your message inside the model's chat template" in view(out, "tokenize")
    assert "inside the model's chat template (chat mode)" in view(out, "tokenize")
    out = h.lesson.lesson_start(*Controls(mode="chat", seed="1").values(), "今天天气真", "completion", "top")
    assert "completion mode" in view(out, "tokenize")
    assert "(the page is in chat mode; the examples are texts to continue)" in view(out, "tokenize")


def test_chapter_1_counts_the_tokens_of_the_text_apart_from_control_tokens(h):
    out = start(h, "The quick brown fox", seed="1")
    c = chapter(out, "tokenize")
    control = [t for t in c["tokens"] if t["control"]]
    assert control and c["n_tokens"] == len(c["ids"])  # the tiny model's <s> first
    text = view(out, "tokenize")
    assert f"became <b>{c['n_tokens'] - len(control)} tokens</b>" in text
    assert f"1 control token among them" in text and f"{c['n_tokens']} ids in all" in text


def test_the_top_p_walk_always_shows_the_first_token_left_out(h):
    out = start(h, "The quick brown fox", top_p=0.99, seed="1")
    walk = chapter(out, "sampling")["top_p"]["walk"]
    assert len(walk) > 12 and not walk[-1]["kept"]  # a long walk: its end used to be cut from the table
    text = view(out, "sampling")
    assert text.count("stop: P reached") == 1 and f"{len(walk) - 11} more kept" in text
    import html
    assert html.escape(walk[-1]["piece"].replace(" ", "␣")) in text.split("stop: P reached")[0].rsplit("<tr>", 1)[1]


def test_the_repetition_penalty_lists_every_token_of_the_prompt(h):
    out = start(h, "the cat the cat sat", seed="1")
    ids = chapter(out, "tokenize")["ids"]
    rows = chapter(out, "sampling")["repetition_penalty"]["rows"]
    assert sorted(r["id"] for r in rows) == sorted(set(ids))
    assert [r["logit"] for r in rows] == sorted((r["logit"] for r in rows), reverse=True)


def test_chapter_4_says_attention_counts_every_score_and_what_the_causal_mask_keeps(h):
    from inference.lesson.summary import si
    out = start(h, "The quick brown fox", seed="1")
    c = chapter(out, "layers")
    n = c["n_positions"]
    assert c["scores_kept"] == n * (n + 1) // 2 and c["scores_counted"] == n * n
    scores = next(r for r in c["per_layer"] if r["stage"].startswith("attention softmax"))
    assert scores["stage"].endswith(f"all {n}×{n} scores") and "causal" not in scores["stage"]
    assert scores["flops"] == 4 * h.page.info.cfg.n_heads * n * n * h.page.info.cfg.head_dim  # QKᵀ and ·V, full
    assert f"the causal mask keeps {n * (n + 1) // 2} of the {n * n}: " \
           f"{si(scores['flops'] * n * (n + 1) // 2 // (n * n), 'FLOPs')}" in view(out, "layers")


def test_chapter_8_says_the_cache_after_the_steps_it_tables_and_shows_newlines(h):
    from inference.lesson.summary import mib
    from ui.lesson.render import _code
    out = start(h, "The quick brown fox", seed="1")
    c = chapter(out, "kv_cache")
    held = c["prompt_tokens"] + c["steps"] - 1
    assert f"{mib(c['bytes_per_position'] * held)} after the {c['steps']} steps below ({held} positions)" \
        in view(out, "kv_cache")
    assert "↵" in _code("\n") and "␣" in _code(" a")  # a newline token is never an empty cell


def test_the_lessons_charts_keep_their_labels_readable_on_a_phone(h):
    import re
    out = start(h, "The quick brown fox", seed="1")
    for key in ("prefill_decode", "kv_cache"):
        for svg in re.findall(r"<svg[^>]*>.*?</svg>", view(out, key), re.S):
            width = float(re.search(r"viewBox='0 0 ([\d.]+) ", svg).group(1))
            sizes = [float(x) for x in re.findall(r"font-size='([\d.]+)'", svg)]
            # The lesson's panel is about 360 px wide on a 420 px phone: every label at least 11 px.
            assert sizes and min(sizes) * 360 / width >= 11, (key, width, min(sizes))
