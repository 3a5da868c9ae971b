"""The quantization lens (inference/lenses/): the weights quantized on request are exactly gguf's
blocks of every Hugging Face matrix (the embedding included; norms float32), and the lens's
numbers (KL, top-1 agreement, rank, perplexity, fork step, bytes per token) are those computed
independently: transformers' float32 logits on the original weights and on gguf's dequantized
blocks, and transformers' own greedy runs on each."""

import json
import math

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize
from safetensors.torch import load_file

from inference.cli import main
from inference.errors import InputError
from inference.lenses.precisions import compare, fork_step, parse_precisions, source_note
from inference.lenses.quantize import TYPES, quantized_model, quantized_state
from inference.loading.load import load_hf_dir
from inference.model.layers import Linear
from quant_reference import blocks, greedy, hf_model

PROMPT = "The quick brown"
STEPS = 8
FUSED = {"attention.wqkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "attention.wo": ("self_attn.o_proj",), "feed_forward.w13": ("mlp.gate_proj", "mlp.up_proj"),
         "feed_forward.w2": ("mlp.down_proj",)}


def hf_matrices(model_dir, cfg) -> dict[str, list[torch.Tensor]]:
    """Our matrix name -> the Hugging Face tensors stacked in it, read from the safetensors file."""
    hf = load_file(str(model_dir / "model.safetensors"))
    out = {"tok_embeddings.weight": [hf["model.embed_tokens.weight"]]}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = [hf["lm_head.weight"]]
    for i in range(cfg.n_layers):
        for ours, theirs in FUSED.items():
            out[f"layers.{i}.{ours}.weight"] = [hf[f"model.layers.{i}.{t}.weight"] for t in theirs]
    return out


@pytest.mark.parametrize("which", ["mha", "gqa_tied"])
@pytest.mark.parametrize("name", list(TYPES))
def test_every_matrix_is_ggufs_blocks_of_its_hf_tensors_and_reads_back_as_gguf_dequantizes(tiny_dirs, which, name):
    loaded = load_hf_dir(tiny_dirs[which], "cpu", "float32")
    cfg = loaded.model.cfg
    state = quantized_state(loaded.model, TYPES[name])
    matrices = hf_matrices(tiny_dirs[which], cfg)
    for ours, tensors in matrices.items():  # every block of every matrix, the embedding included
        want = np.concatenate([blocks(t, name) for t in tensors])
        got = state[ours].parts[0].data.numpy()
        assert state[ours].types() == [name.upper()] and np.array_equal(got, want), ours
    floats = {k for k, v in state.items() if isinstance(v, torch.Tensor)}
    assert floats and all(k.endswith("norm.weight") for k in floats)  # the norms alone stay float32
    assert set(state) - floats == set(matrices)
    # The model on those blocks (the default products: repacked where they are integer ones)
    # holds gguf's dequantized numbers, bit for bit.
    model = quantized_model(loaded.model, TYPES[name])
    for ours, tensors in matrices.items():
        module = model.get_submodule(ours.removesuffix(".weight"))
        want = np.concatenate([dequantize(blocks(t, name), gguf.GGMLQuantizationType[name.upper()]) for t in tensors])
        assert torch.equal(module.qweight.dequantize(), torch.from_numpy(want.reshape(module.qweight.shape)))
    assert all(m.weight is None for m in model.modules() if isinstance(m, Linear))


@pytest.mark.parametrize("which", ["mha", "gqa_tied"])
def test_kl_rank_perplexity_and_fork_against_transformers_on_the_dequantized_weights(tiny_dirs, tiny_engine, which):
    model_dir = tiny_dirs[which]
    results = list(compare(model_dir, PROMPT, "float32,q8_0,q4_0,q4_1", STEPS))
    assert [r.precision for r in results] == ["float32", "q8_0", "q4_0", "q4_1"]
    ids = tiny_engine.prompt_ids(PROMPT)  # the same tokenizer in every tiny model
    f32 = hf_model(model_dir, None)
    ref_tokens = greedy(f32, ids, STEPS)
    assert results[0].tokens == ref_tokens[:len(results[0].tokens)]
    text = ids + results[0].tokens
    with torch.no_grad():
        p_logits = f32(torch.tensor([text])).logits[0, len(ids) - 1:-1].double()  # (steps, vocab)
    lp = p_logits.log_softmax(-1)
    forks = 0
    for r in results:
        ref = hf_model(model_dir, None if r.precision == "float32" else r.precision)
        with torch.no_grad():
            q_logits = ref(torch.tensor([text])).logits[0, len(ids) - 1:-1].double()
        lq = q_logits.log_softmax(-1)
        for s, row in enumerate(r.steps):
            kl = float((lp[s].exp() * (lp[s] - lq[s])).sum())
            assert abs(row.kl - kl) <= 1e-5 + 1e-3 * kl, (r.precision, s)
            top = int(p_logits[s].argmax())
            assert row.top1_agree == (int(q_logits[s].argmax()) == top)
            assert row.rank == int((q_logits[s] > q_logits[s, top]).sum()) + 1
        ppl = math.exp(-float(lq.gather(-1, torch.tensor(results[0].tokens)[:, None]).mean()))
        assert r.perplexity == pytest.approx(ppl, rel=1e-4)
        # The fork step: transformers' own greedy runs of the two models.
        theirs = greedy(ref, ids, STEPS)
        assert r.fork_step == fork_step(ref_tokens, theirs)
        assert r.tokens == theirs[:len(r.tokens)]
        forks += r.fork_step is not None
    assert results[0].steps and all(s.kl == 0.0 and s.rank == 1 for s in results[0].steps)
    assert forks >= 1  # 4 bits fork these random weights' texts: the check has something to check


def test_bytes_per_token_count_every_matrix_as_held_an_embedding_row_and_the_norms(tiny_dirs):
    model_dir = tiny_dirs["gqa_tied"]
    results = {r.precision: r for r in compare(model_dir, PROMPT, "q8_0,q4_1", 2)}
    loaded = load_hf_dir(model_dir, "cpu", "float32")
    cfg = loaded.model.cfg
    matrices = hf_matrices(model_dir, cfg)
    values = sum(t.numel() for ts in matrices.values() for t in ts)  # the tied head: the embedding's
    norms = (2 * cfg.n_layers + 1) * cfg.hidden_size * 4
    for name, per_block in (("q8_0", 34), ("q4_1", 20)):
        want = values // 32 * per_block + cfg.hidden_size // 32 * per_block + norms
        assert results[name].bytes_per_token == want
    assert results["float32"].bytes_per_token == (values + cfg.hidden_size) * 4 + norms


def test_a_gguf_sources_own_blocks_are_its_float32_and_the_lens_says_it_quantizes_again(tiny_dirs, tmp_path):
    from gguf_files import write_gguf
    path = tmp_path / "m.gguf"
    write_gguf(tiny_dirs["gqa_tied"], path, "Q4_1")
    from inference.loading.default_model import resolve_model
    model_dir = resolve_model(str(path))
    note = source_note(model_dir)
    assert "4-bit GGUF file (Q4_1)" in note and "quantizes a quantized model again" in note
    assert source_note(tiny_dirs["gqa_tied"]) is None
    results = list(compare(model_dir, PROMPT, "float32,file", 6))
    own = results[1]
    assert own.precision == "file" and own.fork_step is None
    assert max(s.kl for s in own.steps) < 1e-8 and all(s.rank == 1 for s in own.steps)  # the same numbers, within the integer bound
    with pytest.raises(InputError, match="not read from a GGUF file"):
        parse_precisions("file", None)


@pytest.mark.parametrize("text,says", [("float32,q3_k", "unknown precision"), ("q8_0,Q8_0", "listed twice"),
                                       ("missing.gguf", "no such GGUF file")])
def test_a_precision_that_cannot_be_read_is_refused_in_one_line(text, says):
    with pytest.raises(InputError, match=says):
        parse_precisions(text, None)
    with pytest.raises(InputError, match="at most 1 precisions besides float32"):
        parse_precisions("q8_0,q4_0", None, limit=1)


def test_a_model_too_large_to_hold_two_precisions_is_refused_saying_how_much(tiny_dirs):
    with pytest.raises(InputError, match=r"float32 and one other precision at once: \d+\.\d\d GiB .* "
                                         r"0\.00 GiB are available"):
        next(compare(tiny_dirs["mha"], PROMPT, "q8_0", 4, available=lambda: 1 << 20))


def test_the_cli_prints_the_issues_jsonl(tiny_dirs, capsys):
    assert main(["quantize-compare", "--model", str(tiny_dirs["mha"]), "--prompt", PROMPT,
                 "--precisions", "float32,q8_0,q4_0", "--max-new-tokens", "4", "--jsonl"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    steps, summaries = lines[:-3], lines[-3:]
    assert [s["precision"] for s in summaries] == ["float32", "q8_0", "q4_0"]
    assert all(set(s) == {"precision", "fork_step", "bytes_per_token", "decode_tokens_per_s", "perplexity"}
               for s in summaries)
    assert all(set(s) == {"precision", "step", "kl", "top1_agree", "rank"} for s in steps)
    n = len(steps) // 3
    assert n >= 1 and [(s["precision"], s["step"]) for s in steps] == \
        [(p, k) for p in ("float32", "q8_0", "q4_0") for k in range(n)]
    assert main(["quantize-compare", "--model", str(tiny_dirs["mha"]), "--prompt", PROMPT, "--precisions", "q2"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_cli_table_says_each_precisions_numbers_and_the_text_that_forks(tiny_dirs, capsys):
    args = ["--model", str(tiny_dirs["mha"]), "--prompt", PROMPT, "--precisions", "q4_0", "--max-new-tokens", "6"]
    assert main(["quantize-compare", *args, "--jsonl"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    want = {s["precision"]: s for s in lines if "fork_step" in s}
    assert main(["quantize-compare", *args]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in out[1:3]}
    assert set(rows) == {"float32", "q4_0"}
    for name, s in want.items():  # bytes/token, perplexity and fork step as the JSONL says
        assert rows[name][1] == f"{s['bytes_per_token']:,}" and float(rows[name][3]) == pytest.approx(s["perplexity"], rel=1e-3)
        assert rows[name][-1] == ("–" if s["fork_step"] is None else str(s["fork_step"]))
    forks = [line for line in out if " forks at step " in line]
    assert out[4].startswith("float32: ") and len(forks) == (want["q4_0"]["fork_step"] is not None)
