"""lm-evaluation-harness's local-completions model against the page's /v1, offline: a small
multiple-choice (loglikelihood) task whose data is written here. Its log-likelihoods must be
the engine's own for the token ids it asked about, and its accuracy follows from them."""

import json
import math

import pytest

lm_eval = pytest.importorskip("lm_eval")

ITEMS = [
    {"question": "The quick brown fox jumps over the lazy", "choices": [" dog", " cat", " car"], "answer": 0},
    {"question": "Paris is the capital of", "choices": [" France", " England", " Spain"], "answer": 0},
    {"question": "Once upon a time there was a little", "choices": [" model", " house", " tree"], "answer": 0},
    {"question": "Numbers 0123456789 and symbols", "choices": [" appear", " vanish"], "answer": 0},
    {"question": "London is the capital of", "choices": [" France", " England"], "answer": 1},
]

TASK = """task: tokenlab_tiny
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
"""


@pytest.mark.slow  # lm-eval imports for tens of seconds
def test_lm_eval_local_completions_runs_a_loglikelihood_task(live_app, tmp_path, monkeypatch):
    url, engine, _ = live_app
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    (tmp_path / "tokenlab_tiny.yaml").write_text(TASK.format(data=data))
    from lm_eval.tasks import TaskManager
    results = lm_eval.simple_evaluate(
        model="local-completions",
        # The remote tokenizer backend is found at /tokenizer_info and /tokenize (vLLM's routes).
        model_args={"base_url": url + "/v1/completions", "model": engine.name, "num_concurrent": 1,
                    "max_retries": 1, "tokenized_requests": True},
        tasks=["tokenlab_tiny"], task_manager=TaskManager(include_path=str(tmp_path)),
        log_samples=True, num_fewshot=0, batch_size=1)
    samples = results["samples"]["tokenlab_tiny"]
    assert len(samples) == len(ITEMS)
    tok = engine.tokenizer
    right = 0
    for sample in sorted(samples, key=lambda s: s["doc_id"]):
        item = ITEMS[sample["doc_id"]]
        got = [resp[0][0] for resp in sample["resps"]]  # each choice's (log-likelihood, greedy)
        # What lm-eval asks: the context's ids and the continuation's, from the server's
        # tokenizer (text as a continuation, no BOS), scored teacher-forced by the engine.
        expected = []
        for choice in item["choices"]:
            context = tok.encode_continuation(item["question"])
            whole = tok.encode_continuation(item["question"] + choice)
            scored = engine.prompt_logprobs(whole)
            expected.append(sum(t.logprob for t in scored[len(context) - 1:]))
        assert got == pytest.approx(expected, abs=1e-5)
        right += max(range(len(expected)), key=expected.__getitem__) == item["answer"]
    assert math.isclose(results["results"]["tokenlab_tiny"]["acc,none"], right / len(ITEMS))
