"""Branches on the page: a candidate clicked in the bars continues the run from it as token ids
(the run's settings and seed), the tree keeps each branch with where it split, a branch can be
put on view again, and its link restores it (ui/branches)."""

from helpers import plain
from types import SimpleNamespace

import gradio as gr
import pytest

from inference.events import StepEvent
from inference.sampling.params import SamplingParams
from inference.sampling.replay import replay_state
from ui.controls import NAMES, Controls, controls_from_query

REQ = SimpleNamespace(session_hash="branches")


def run(h, c: Controls, history=None):
    rec = list(h.run.generate(*c.values(), REQ, history))[-1]["record"]
    h.run.after_run(rec, history, REQ)
    return rec


def click(h, rec, step, token, nodes):
    """The bars' candidate `token` of `step` clicked: the controls the branch runs with."""
    out = h.branches.branch(rec, nodes, SimpleNamespace(value=f"{step}:{token}"))
    return Controls(*[out[n] for n in NAMES]), out["branches"]


SETTINGS = dict(prompt="The quick brown fox", temperature=1.0, frequency_penalty=0.4, presence_penalty=0.2,
                max_new_tokens=10, seed="7")


def test_a_candidate_clicked_continues_the_run_from_it(h, tiny_engine):
    root = run(h, Controls(**SETTINGS))
    tree = h.branches.grow_tree(root, [])
    nodes = tree["branches"]
    assert len(nodes) == 1 and nodes[0]["record"] is root
    cand = next(c for c in root.steps[4].top if c.id != root.steps[4].token_id)  # not the one taken
    c, nodes = click(h, root, 4, cand.id, nodes)
    expected_prefix = [s.token_id for s in root.steps[:4]] + [cand.id]
    assert c.prefix_ids == ",".join(map(str, expected_prefix)) and c.seed == "7"
    assert c.max_new_tokens == 10  # as the person set it: the tokens the branch makes after the given ones
    branch = run(h, c)
    assert branch.given == expected_prefix and branch.prompt_ids == root.prompt_ids
    # The engine's own continuation after those ids, its stages counting them as generated.
    alone = [e for e in tiny_engine.generate_ids(root.prompt_ids, SamplingParams(
        temperature=1.0, frequency_penalty=0.4, presence_penalty=0.2, max_new_tokens=10, seed=7), top_n=5,
        given=expected_prefix) if isinstance(e, StepEvent)]
    assert [s.token_id for s in branch.steps] == [s.token_id for s in alone]
    assert branch.answer_text.startswith(tiny_engine.tokenizer.decode(expected_prefix))
    tree = h.branches.grow_tree(branch, nodes)
    nodes = tree["branches"]
    assert [n["parent"] for n in nodes] == [None, 0] and nodes[1]["record"] is branch
    assert nodes[1]["at"] == 4 and nodes[1]["raw"] == cand.raw_prob
    assert "step 4" in tree["branch_view"] and "tl-viewing" in tree["branch_view"]
    # A branch of the branch: its split counts the given tokens too.
    c2, nodes = click(h, branch, 1, branch.steps[1].top[1].id, nodes)
    branch2 = run(h, c2)
    tree = h.branches.grow_tree(branch2, nodes)
    nodes = tree["branches"]
    assert [n["parent"] for n in nodes] == [None, 0, 1] and nodes[2]["at"] == 5 + 1
    # Named as the branch's own step slider numbers it, and by its place in the answer.
    assert "step 1 (after 6 tokens of the answer): " in tree["branch_view"]
    assert "step 4: " in tree["branch_view"]
    # The root put on view again, with its controls (its link restores it).
    view = h.branches.view_branch(nodes, SimpleNamespace(value="0"))
    assert view["record"] is root and view["prefix_ids"] == "" and "▶" in view["bars"]
    view = h.branches.view_branch(nodes, SimpleNamespace(value="1"))
    assert view["record"] is branch and view["prefix_ids"] == c.prefix_ids


def test_a_greedy_branch_from_the_token_taken_is_the_run_to_the_letter(h):
    """The seam: the given tokens' text and the branch's own join to the run's text exactly
    (leading spaces and characters split across tokens included)."""
    c = Controls(**{**SETTINGS, "temperature": 0.0, "prompt": "今天天气真", "max_new_tokens": 12})
    root = run(h, c)
    for k in (0, 3, 7):
        c2, _ = click(h, root, k, root.steps[k].token_id, [])
        branch = run(h, c2)
        # Its max new tokens after the given ones: the run's own tokens, then more of them.
        assert len(branch.steps) == 12 and branch.given == [s.token_id for s in root.steps[:k + 1]]
        assert [s.token_id for s in branch.steps[:11 - k]] == [s.token_id for s in root.steps[k + 1:]]
        assert branch.answer_text.startswith(root.done.text)


def test_a_branchs_replay_is_its_run(h, tiny_engine):
    """Replay rebuilds the state of a branch's step with its given tokens counted as generated."""
    root = run(h, Controls(**SETTINGS))
    c, _ = click(h, root, 3, root.steps[3].top[1].id, [])
    branch = run(h, c)
    i = 2
    ev = branch.steps[i]
    logits = tiny_engine.step_logits(branch.seen_before(i))
    vocab = logits.shape[-1]
    state = replay_state(branch.params, branch.params, branch.prompt_ids, branch.generated_before(i), vocab,
                         branch.seed, ev.sampler_state, tiny_engine.tokenizer)
    _, final = tiny_engine.replay(logits, branch.params, state, ev.token_id)
    assert max(abs(final[c.id].item() - c.prob) for c in ev.top) < 1e-5


def test_a_branch_link_restores_it_and_bad_ids_are_refused(h):
    root = run(h, Controls(**SETTINGS))
    c, _ = click(h, root, 2, root.steps[2].top[1].id, [])
    link = h.share.share_link(*c.values(), "http://x/", REQ)
    restored, problems = controls_from_query(dict(p.split("=", 1) for p in link.split("?")[1].split("&")))
    assert not problems and restored.prefix_ids.replace("%2C", ",") == c.prefix_ids
    for bad, message in (("1,x", "prefix ids must be token ids"), ("1,99999", "token ids must be integers in")):
        begun = h.run.begin(*Controls(**{**SETTINGS, "prefix_ids": bad}).values(), REQ)
        assert message in begun["status"]
    with pytest.raises(Exception, match="Let the run end"):
        h.branches.branch(None, [], SimpleNamespace(value="0:1"))
    with pytest.raises(Exception, match="not among step 2's candidates"):
        h.branches.branch(root, [], SimpleNamespace(value="2:383"))


def test_a_chat_branch_answers_with_the_given_text_and_its_own(h):
    c = Controls(**{**SETTINGS, "mode": "chat", "prompt": "Hello"})
    root = run(h, c, [])
    c2, _ = click(h, root, 1, root.steps[1].top[1].id, [])
    # The page's conversation holds the answered turn now: the branch continues the turn before it.
    assert h.branches.branch(root, [], SimpleNamespace(value=f"1:{root.steps[1].top[1].id}"))["history"] == root.history == []
    branch = list(h.run.generate(*c2.values(), REQ, []))[-1]["record"]
    after = h.run.after_run(branch, [], REQ)
    assert after["history"][-1]["content"] == branch.given_text + branch.done.text


def test_the_counters_count_the_given_tokens_and_a_prompt_typed_by_hand_leaves_the_branch(h, tiny_engine):
    root = run(h, Controls(**SETTINGS))
    c, _ = click(h, root, 4, root.steps[4].top[1].id, [])
    n = len(root.prompt_ids)
    # Before the run: the prompt, the 5 given tokens and the most new ones, as the engine will feed them.
    before = h.page.runs.count_context(c.prompt, c.mode, c.system, c.max_new_tokens, None, None, c.prefix_ids)
    assert f"**{n}** prompt tokens + **5** given + up to 10 new = {n + 15:,} of" in before
    assert "given" not in h.page.runs.count_context(c.prompt, c.mode, c.system, c.max_new_tokens)
    assert "the given ids must be token ids" in h.page.runs.count_context(c.prompt, c.mode, c.system, 10, None, None, "1,x")
    out = list(h.run.generate(*c.values(), REQ, None))[-1]
    branch = out["record"]
    assert len(branch.given) == 5 and len(branch.steps) == 10
    assert f"Context: **{n}** prompt + **5** given + **10** generated = {n + 15} of" in out["status"]
    # The cost of a token at the branch's real context: prompt, given and generated tokens.
    assert f"FLOPs / token (at {n + 15} ctx)" in plain(out["stats"])
    assert "| given tokens (continued after) | 5 |" in plain(out["stats"])
    # A prompt, system prompt, mode or model chosen by hand (the page's input event) drops the ids.
    assert h.branches.leave_branch(c.prefix_ids) == ""
    assert h.branches.leave_branch("") == gr.skip() and h.branches.leave_branch(None) == gr.skip()
    assert h.chat.new_conversation("Hi", "chat", "", 8)["prefix_ids"] == ""


def test_a_branchs_download_is_the_cli_run_with_its_prefix_ids(h, tiny_dirs, capsys):
    """The page's JSONL of a branch records the given ids among its settings, as the CLI's
    --prefix-ids summary does, so that the command line repeats the branch token for token."""
    import json

    from inference.cli import main
    from ui.run_state import run_jsonl
    root = run(h, Controls(**SETTINGS))
    c, _ = click(h, root, 3, root.steps[3].top[2].id, h.branches.grow_tree(root, [])["branches"])
    branch = run(h, c)
    page = [json.loads(line) for line in run_jsonl(branch).splitlines()]
    assert page[-1]["settings"]["prefix_ids"] == branch.given == [int(i) for i in c.prefix_ids.split(",")]
    assert main(["generate", "--model", str(tiny_dirs["gqa_tied"]), "--prompt", SETTINGS["prompt"], "--temperature", "1",
                 "--frequency-penalty", "0.4", "--presence-penalty", "0.2", "--max-new-tokens", "10", "--seed", "7", "--top-p", "1",
                 "--prefix-ids", c.prefix_ids, "--jsonl"]) == 0
    cli = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [s["token_id"] for s in cli[:-1]] == [s["token_id"] for s in page[:-1]] == [s.token_id for s in branch.steps]
    assert cli[-1]["settings"] == page[-1]["settings"] and cli[-1]["text"] == page[-1]["text"]



def a_branch(h):
    """The run of SETTINGS, a branch of it after its first 4 tokens and another 5th (5 given),
    and what the page drew at the branch's end."""
    root = run(h, Controls(**SETTINGS))
    c, _ = click(h, root, 4, root.steps[4].top[1].id, [])
    branch = list(h.run.generate(*c.values(), REQ, None))[-1]["record"]
    end = h.run.after_run(branch, None, REQ)
    assert len(branch.given) == 5 and len(branch.steps) == 10
    return root, branch, end


def test_a_branchs_inside_view_prefills_its_given_tokens_with_the_prompt(h, tiny_engine):
    """The stages' shapes, FLOPs and text count the given tokens as the captured context does."""
    root, branch, _ = a_branch(h)
    n, g = len(root.prompt_ids), 5
    inside = h.inside.inspect_step(branch, 2, 0)
    md, ctx = inside["stages_md"], n + g + 2
    # The context the model read at step 2 (the attention table's rows, the pattern's) is the reference.
    assert inside["attention"].count("<tr>") == ctx + 1 and inside["pattern"].count("<th class='tl-q'") == ctx
    assert f"Prefill: {n} prompt + {g} given = {n + g} tokens at once. Decode step 2: 1 token attending to {ctx} positions" in md
    heads, hidden = tiny_engine.cfg.n_heads, tiny_engine.cfg.hidden_size
    assert f"| token ids | [{n + g}] |" in md and f"| embedding lookup | [{n + g}, {hidden}] |" in md
    assert f"scores [{heads}, {n + g}, {n + g}]" in md and f"scores [{heads}, 1, {ctx}]" in md
    assert "given" not in h.inside.inspect_step(root, 2, 0)["stages_md"]


def test_a_branchs_token_view_says_its_given_tokens_apart_as_the_status_counts_them(h):
    import re
    root, branch, end = a_branch(h)
    n, g = len(root.prompt_ids), 5
    assert f"**{n}** prompt + **{g}** given + **10** generated" in end["status"]
    view = end["tokens"]
    assert f"Prompt of the run: {n} tokens" in view and f"Given (read after the prompt): {g} tokens" in view
    assert "Generated: 10 tokens" in view
    given, generated = view[view.index("tl-given-tokens"):view.index("Generated:")], view[view.index("Generated:"):]
    assert [int(i) for i in re.findall(r"<sub>(\d+)</sub>", given)] == branch.given
    assert [int(i) for i in re.findall(r"<sub>(\d+)</sub>", generated)] == [s.token_id for s in branch.steps]
    assert "Given" not in h.page.runs.drawn(root)["tokens"]


def test_how_likely_on_a_branch_names_its_given_tokens(h):
    root, branch, _ = a_branch(h)
    assert h.experiments.likelihood(branch, 2, " the").startswith("After the prompt, the 5 given tokens and the first 2 generated tokens (")
    assert h.experiments.likelihood(root, 2, " the").startswith("After the prompt and the first 2 generated tokens (")
