"""The probability of any text (Engine.score_ids, `score-text`): every token's log-probability
equals transformers' float32 log-softmax, its rank an independent argsort's, and the first token
of a text without a BOS has no probability."""

import json
import math

import pytest
import torch

from inference.cli import main
from inference.errors import InputError
from inference.events import perplexity

TEXT = "The quick brown fox jumps over the lazy dog. 今天天气真好"


def reference(model_dir, ids):
    """transformers' float32 log-softmax at every position: (T, vocab), row i predicting ids[i + 1]."""
    transformers = pytest.importorskip("transformers")
    ref = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0].float().log_softmax(-1)


@pytest.mark.parametrize("name", ["mha", "gqa_tied"])
def test_score_ids_equal_transformers_and_an_argsort(tiny_dirs, name):
    from inference.serving.engine import Engine
    with Engine.from_hf_dir(tiny_dirs[name]) as engine:
        ids, before = engine.text_ids(TEXT)
        scores = engine.score_ids(ids, top_n=10)
    assert before == 1 and ids[0] == 1  # the tiny models' tokenizer adds a BOS
    logp = reference(tiny_dirs[name], ids)
    assert [s.id for s in scores] == ids
    assert scores[0].logprob is None and scores[0].rank is None and scores[0].prob is None
    order = logp.argsort(dim=-1, descending=True)  # (T, vocab)
    for i, s in enumerate(scores[1:], start=1):
        expected = float(logp[i - 1, ids[i]])
        assert abs(s.logprob - expected) <= 1e-4
        assert s.rank == int((order[i - 1] == ids[i]).nonzero()) + 1
        assert abs(s.surprisal_bits - (-expected / math.log(2))) <= 1e-4
        assert [c.id for c in s.top] == order[i - 1, :10].tolist()
        assert all(abs(c.prob - math.exp(float(logp[i - 1, c.id]))) <= 1e-4 for c in s.top)
    assert any(s.rank > 1 for s in scores[1:]) and any(s.rank < 50 for s in scores[1:])
    want = math.exp(-sum(float(logp[i - 1, ids[i]]) for i in range(1, len(ids))) / (len(ids) - 1))
    assert abs(perplexity(scores) - want) / want < 1e-5


def test_score_text_jsonl(tiny_dirs, capsys):
    model = tiny_dirs["mha"]
    assert main(["score-text", "--model", str(model), "--text", TEXT, "--jsonl", "--top", "3"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    tokens, summary = lines[:-1], lines[-1]
    from inference.serving.engine import Engine
    with Engine.from_hf_dir(model) as engine:
        ids = engine.tokenizer.encode(TEXT)
    logp = reference(model, ids)
    assert [t["id"] for t in tokens] == ids[1:]  # the BOS is context, not a token of the text
    for i, t in enumerate(tokens, start=1):
        assert set(t) == {"id", "piece", "prob", "logprob", "rank", "surprisal_bits", "top"}
        assert abs(t["prob"] - math.exp(float(logp[i - 1, ids[i]]))) <= 1e-4
        assert t["rank"] == int((logp[i - 1] > logp[i - 1, ids[i]]).sum()) + 1
        assert len(t["top"]) == 3
    want = math.exp(-sum(float(logp[i - 1, ids[i]]) for i in range(1, len(ids))) / (len(ids) - 1))
    assert summary["done"] and summary["tokens"] == summary["scored"] == len(ids) - 1 and summary["bos"]
    assert abs(summary["perplexity"] - want) / want < 1e-5


def test_without_a_bos_the_first_token_has_no_probability(tiny_dirs, tmp_path, capsys):
    import shutil
    model = tmp_path / "no_bos"
    shutil.copytree(tiny_dirs["mha"], model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**cfg, "add_bos_token": False}))
    assert main(["score-text", "--model", str(model), "--text", TEXT, "--jsonl"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    tokens, summary = lines[:-1], lines[-1]
    assert tokens[0]["prob"] is None and tokens[0]["rank"] is None and tokens[0]["surprisal_bits"] is None
    assert all(t["prob"] is not None for t in tokens[1:])
    logp = reference(model, [t["id"] for t in tokens])
    assert abs(tokens[1]["prob"] - math.exp(float(logp[0, tokens[1]["id"]]))) <= 1e-4
    assert not summary["bos"] and summary["tokens"] == len(tokens) and summary["scored"] == len(tokens) - 1
    assert main(["score-text", "--model", str(model), "--text", TEXT]) == 0
    assert f"{len(tokens)} tokens, {len(tokens) - 1} with a probability (the first has nothing before it)" \
        in capsys.readouterr().out


def test_a_single_token_has_no_perplexity(tiny_engine):
    scores = tiny_engine.score_ids([5])
    assert len(scores) == 1 and scores[0].logprob is None and perplexity(scores) is None


def test_bad_texts_are_one_line_errors(tiny_engine, tiny_dirs, capsys):
    with pytest.raises(InputError, match="the text is empty"):
        tiny_engine.text_ids("")
    with pytest.raises(InputError, match="the text is .* characters but the context window is 256 tokens"):
        tiny_engine.text_ids("x" * 10**6)
    with pytest.raises(InputError, match="the text is 300 tokens but the context window is 256"):
        tiny_engine.score_ids([5] * 300)
    assert main(["score-text", "--model", str(tiny_dirs["mha"]), "--text", ""]) == 2
    assert capsys.readouterr().err.strip() == "error: the text is empty"


def test_one_token_is_counted_in_the_singular(tiny_engine, tiny_dirs, capsys):
    """`score-text` and `score` count their tokens in words: "1 token", never "1 tokens"."""
    model = str(tiny_dirs["mha"])
    assert main(["score-text", "--model", model, "--text", "a"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2  # the tokenizer's own count: one token after its BOS
    assert lines[-1].startswith("1 token, 1 with a probability")
    assert main(["score", "--model", model, "--prompt", "x", "--continuation", " a"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and " over 1 token (" in lines[-1]


def test_top_0_lists_no_preferred_tokens_but_scores_every_one(tiny_dirs, capsys):
    """`score-text --top 0` is meaningful (unlike generate's, which is refused): each token's
    probability and rank without the tokens the model preferred."""
    model = str(tiny_dirs["mha"])
    assert main(["score-text", "--model", model, "--text", TEXT, "--jsonl", "--top", "0"]) == 0
    none = [json.loads(x) for x in capsys.readouterr().out.splitlines()[:-1]]
    assert main(["score-text", "--model", model, "--text", TEXT, "--jsonl"]) == 0
    five = [json.loads(x) for x in capsys.readouterr().out.splitlines()[:-1]]
    assert all(x["top"] == [] for x in none) and any(x["top"] for x in five)
    assert [{**x, "top": []} for x in five] == none
