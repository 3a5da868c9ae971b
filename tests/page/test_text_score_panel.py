"""The "Probability of a text" panel and the /samples and /score_text endpoints: the numbers are
transformers' float32 ones, the run's prompt is scored as it was fed, and bad input is a one-line
refusal as /generate's."""

import math
import re
from types import SimpleNamespace

import gradio as gr
import pytest
import torch

from page_api import call
from ui.controls import Controls
from ui.handlers import Handlers

gradio_client = pytest.importorskip("gradio_client")

REQ = SimpleNamespace(session_hash="score", client=SimpleNamespace(host="198.51.100.3"), username=None)


def reference_logp(model_dir, ids):
    transformers = pytest.importorskip("transformers")
    ref = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0].float().log_softmax(-1)  # (T, vocab)


def test_score_text_shows_every_token_and_the_perplexity(tiny_engine, tiny_dirs):
    h = Handlers(tiny_engine)
    text = "Paris is the capital of France. 鲸鱼"
    out = h.text_score.score_text(text, "", REQ)
    ids = tiny_engine.tokenizer.encode(text)
    logp = reference_logp(tiny_dirs["gqa_tied"], ids)
    data = out["score_data"]
    assert data["bos"] and [t["id"] for t in data["tokens"]] == ids[1:]
    for i, t in enumerate(data["tokens"], start=1):
        assert abs(t["logprob"] - float(logp[i - 1, ids[i]])) <= 1e-4
    ppl = math.exp(-sum(float(logp[i - 1, ids[i]]) for i in range(1, len(ids))) / (len(ids) - 1))
    shown = float(re.search(r"\*\*Perplexity ([0-9.]+)\*\*", out["score_md"]).group(1))
    assert abs(shown - ppl) / ppl < 1e-5 and "read after &lt;s&gt;" in out["score_md"]
    html = out["score_view"]
    groups = tiny_engine.tokenizer.char_groups(ids[1:])
    assert html.count("class='tl-t ") == len(groups) < len(ids) - 1  # 鲸鱼: byte tokens, one chip a character
    assert "鲸" in html and "鱼" in html
    first = data["tokens"][0]
    assert f"id {first['id']} · p <span class='tl-p'>{first['prob']:.4f}</span>" in html
    assert f"rank {first['rank']}" in html and f"surprisal {first['surprisal_bits']:.2f} bits" in html
    assert html.count("the model's top 10 here:") == len(groups)


def test_score_the_prompt_of_the_run_as_fed(tiny_engine, tiny_dirs, monkeypatch):
    monkeypatch.setattr(tiny_engine, "eos_ids", set())
    h = Handlers(tiny_engine)
    # Before a run: one line where the summary goes, the Text box left as typed (not an output).
    assert h.text_score.score_prompt(None, REQ) == {"score_md": "⚠ Generate first: this scores the prompt of the run.",
                                         "score_view": h.text_score.score_text_shown("", "", REQ)["score_view"],
                                         "score_data": None, "score_state": None, "score_branch": ""}
    c = Controls(prompt="Hello there", mode="chat", temperature=0.0, max_new_tokens=2)
    rec = list(h.run.generate(*c.values(), REQ))[-1]["record"]
    out = h.text_score.score_prompt(rec, REQ)
    assert out["score_box"] == rec.prompt_text and "<|im_start|>" in rec.prompt_text
    tokens = out["score_data"]["tokens"]
    assert [t["id"] for t in tokens] == rec.prompt_ids  # the template's tokens, not the text re-tokenized
    assert tokens[0]["prob"] is None and "The prompt of the run, as fed" in out["score_md"]
    logp = reference_logp(tiny_dirs["gqa_tied"], rec.prompt_ids)
    assert all(abs(t["logprob"] - float(logp[i, t["id"]])) <= 1e-4 for i, t in enumerate(tokens[1:]))


def test_bad_text_is_a_one_line_error(tiny_engine):
    """/score_text refuses with an error; the page's click says the same line in the panel."""
    h = Handlers(tiny_engine)
    for text, message in [("", "the text is empty"), ("x" * 10**6, "characters but the context window is 256")]:
        with pytest.raises(gr.Error, match=message) as e:
            h.text_score.score_text(text, "", REQ)
        assert "\n" not in e.value.message
        shown = h.text_score.score_text_shown(text, "", REQ)
        assert shown["score_md"] == "⚠ " + e.value.message and shown["score_data"] is None
        assert "class='tl-t " not in shown["score_view"] and "score_box" not in shown


def test_the_endpoints_by_name(live_app):
    url, engine, _ = live_app
    client = gradio_client.Client(url, verbose=False)
    try:
        endpoints = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
        assert [p["parameter_name"] for p in endpoints["/score_text"]["parameters"]] == ["text", "model"]
        assert endpoints["/samples"]["parameters"][-1]["parameter_name"] == "n_samples"
        view, md, data = client.predict("The quick brown fox", "", api_name="/score_text")
        assert data["tokens"][0]["piece"] and re.search(r"\*\*Perplexity [0-9.]+\*\*", md)
        with pytest.raises(Exception, match="the text is empty"):
            client.predict("", "", api_name="/score_text")
        md, outcomes, first, samples = client.predict(*call(temperature=1.0, max_new_tokens=3, seed="11"), 5,
                                                      api_name="/samples")
        assert [s["seed"] for s in samples["samples"]] == [11, 12, 13, 14, 15]
        assert "**5 samples**" in md and "distinct text" in outcomes
        with pytest.raises(Exception, match="from 1 to 64, got 65"):
            client.predict(*call(), 65, api_name="/samples")
        with pytest.raises(Exception, match="Temperature must be in"):  # named as the page labels it
            client.predict(*call(temperature=-1.0), 3, api_name="/samples")
        assert engine.active_runs == 0
    finally:
        client.close()


def test_the_start_token_read_first_is_written_not_taken_for_html():
    """The summary names the token read before the text (<s>, Gemma's <bos>) as
    text: raw, Markdown took "<s>" for a strikethrough tag and struck the whole summary out."""
    from inference.events import TokenScore
    from ui.text_score.render import summary_md
    text = summary_md([TokenScore(5, "a", None, None, [])], [TokenScore(1, "<s>", None, None, [])], "The text")
    assert "read after &lt;s&gt; (the token the model adds first)" in text and "<s>" not in text
