"""A branch of a run continues after the prompt and given token ids (Engine.generate_ids's
`given`, the CLI's --prefix-ids): the model reads them, the sampling stages count them as
generated, and the numbers are transformers' for that context."""

import json

import pytest
import torch

from inference.events import StepEvent
from inference.sampling.params import SamplingParams

PROMPT = "The quick brown"


def tokens(events):
    return [e for e in events if isinstance(e, StepEvent)]


def test_a_branch_from_a_runs_own_tokens_is_that_run_from_there(tiny_engine):
    """Greedy, with every setting that counts generated tokens: continuing after the run's first
    k tokens gives the rest of the run, token for token and number for number."""
    settings = dict(temperature=0.0, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3,
                    dry_multiplier=0.8, dry_allowed_length=1)
    ids = tiny_engine.prompt_ids(PROMPT)
    run = tokens(tiny_engine.generate_ids(ids, SamplingParams(**settings, max_new_tokens=14, seed=1)))
    for k in (1, 6):
        given = [s.token_id for s in run[:k]]
        branch = tokens(tiny_engine.generate_ids(ids, SamplingParams(**settings, max_new_tokens=14 - k, seed=1),
                                                 given=given))
        assert [s.token_id for s in branch] == [s.token_id for s in run[k:]]
        assert max(abs(a.raw_prob - b.raw_prob) for a, b in zip(branch, run[k:])) < 1e-5
        assert max(abs(a.prob - b.prob) for a, b in zip(branch, run[k:])) < 1e-5
    # Sampled: the step after the given tokens is drawn from the run's own distribution at that
    # step (the draw itself starts a new random stream); the same ids as prompt are another state.
    hot = dict(settings, temperature=1.0)
    run = tokens(tiny_engine.generate_ids(ids, SamplingParams(**hot, max_new_tokens=8, seed=3), top_n=8))
    given = [s.token_id for s in run[:5]]
    branch = tokens(tiny_engine.generate_ids(ids, SamplingParams(**hot, max_new_tokens=1, seed=3), top_n=8,
                                             given=given))[0]
    as_prompt = tokens(tiny_engine.generate_ids(ids + given, SamplingParams(**hot, max_new_tokens=1, seed=3),
                                                top_n=8))[0]
    final = {c.id: c.prob for c in run[5].top}
    assert max(abs(c.prob - final[c.id]) for c in branch.top) < 1e-5
    assert max(abs(c.prob - final.get(c.id, 0.0)) for c in as_prompt.top) > 1e-3

def test_a_branch_from_another_candidate_is_transformers_continuation(tiny_engine, tiny_dirs):
    transformers = pytest.importorskip("transformers")
    ids = tiny_engine.prompt_ids(PROMPT)
    first = tokens(tiny_engine.generate_ids(ids, SamplingParams(temperature=0.0, max_new_tokens=1), top_n=5))[0]
    other = first.top[3].id  # the fourth candidate, not the one taken
    branch = tokens(tiny_engine.generate_ids(ids, SamplingParams(temperature=0.0, max_new_tokens=6), top_n=5,
                                             given=[other]))
    ref = transformers.LlamaForCausalLM.from_pretrained(tiny_dirs["gqa_tied"], dtype=torch.float32).eval()
    path = ids + [other]
    with torch.no_grad():
        out = ref.generate(torch.tensor([path]), max_new_tokens=6, do_sample=False, output_scores=True,
                           return_dict_in_generate=True, pad_token_id=0)
    assert [s.token_id for s in branch] == out.sequences[0, len(path):].tolist()
    probs = torch.softmax(out.scores[0][0].double(), -1)
    for c in branch[0].top:
        assert abs(c.raw_prob - probs[c.id].item()) < 1e-4


def test_cli_prefix_ids(tiny_dirs, tiny_engine, capsys):
    from inference.cli import main
    ids = tiny_engine.prompt_ids(PROMPT)
    run = tokens(tiny_engine.generate_ids(ids, SamplingParams(temperature=0.0, max_new_tokens=8)))
    given = [s.token_id for s in run[:3]]
    args = ["generate", "--model", str(tiny_dirs["gqa_tied"]), "--prompt", PROMPT, "--temperature", "0",
            "--max-new-tokens", "5", "--device", "cpu", "--dtype", "float32", "--jsonl"]
    assert main([*args, "--prefix-ids", ",".join(map(str, given))]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["token_id"] for x in lines[:-1]] == [s.token_id for s in run[3:8]]
    assert [x["step"] for x in lines[:-1]] == list(range(5))  # the new tokens' steps
    assert lines[-1]["text"] == "".join(s.text for s in run[3:8])
    assert main([*args, "--prefix-ids", "1,x"]) == 2
    assert "--prefix-ids must be token ids" in capsys.readouterr().err
    assert main([*args, "--prefix-ids", f"1,{10**9}"]) == 2
    assert "token ids must be integers in [0, 384)" in capsys.readouterr().err


def test_a_branch_reads_its_shared_prefix_from_the_runs_cached_blocks(tiny_engine):
    """The tree's shared prefix is not computed again: the run's whole blocks, kept in the prefix
    cache at its end, hold the prompt and the tokens the branch is given."""
    from inference.model.kv_cache import BLOCK_SIZE
    ids = tiny_engine.prompt_ids(PROMPT)
    run = tokens(tiny_engine.generate_ids(ids, SamplingParams(temperature=0.0, max_new_tokens=2 * BLOCK_SIZE)))
    given = [s.token_id for s in run[:BLOCK_SIZE + 4]]
    first = tokens(tiny_engine.generate_ids(ids, SamplingParams(temperature=0.0, max_new_tokens=1), given=given))[0]
    held = (len(ids) + len(given)) // BLOCK_SIZE * BLOCK_SIZE
    assert first.prompt_tokens == len(ids) + len(given)
    assert first.prompt_tokens_reused >= held - BLOCK_SIZE > 0
