"""The lesson's numbers (inference/lesson) against independent sources: the tokenizer's own
library, transformers' model, softmax by hand, a hand count from the config, the cache the model
allocates, and a greedy run of transformers. No test here asserts a time."""

import json
import math

import pytest
import torch

from helpers import hf_reference
from inference.lesson.explain import CHAPTERS, explain
from inference.lesson.roofline import Roofline, measure
from inference.model.config import ModelConfig

PROMPT = "The quick brown fox"
STEPS = 6
SETTINGS = {"temperature": 1.0, "top_k": 0, "top_p": 0.8, "repetition_penalty": 1.0}
# A stand-in roofline: these tests check counts and probabilities, never a measured speed.
ROOF = Roofline(1e10, 1e9, "cpu", "float32", "a test's stand-in")


@pytest.fixture(scope="module")
def lesson(tiny_engine):
    # Following a sampled token: the sampling chapter's walk is then the run's own distribution.
    return explain(tiny_engine, PROMPT, SETTINGS, roofline=ROOF, steps=STEPS, seed=1, follow="sampled")


@pytest.fixture(scope="module")
def hf(tiny_dirs):
    return hf_reference(tiny_dirs["gqa_tied"], attn_implementation="eager")


@pytest.fixture(scope="module")
def config(tiny_dirs):
    return json.loads((tiny_dirs["gqa_tied"] / "config.json").read_text())


def hf_logits(hf, ids) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0, -1].double()


def test_chapters_in_order(lesson):
    assert [c["key"] for c in lesson.chapters] == [k for k, _ in CHAPTERS]
    assert [c["chapter"] for c in lesson.chapters] == list(range(1, 10))
    json.dumps(lesson.chapters)  # plain data: the CLI prints it as it is


def test_ids_are_the_tokenizers(lesson, sp_model_bytes, tiny_engine):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_proto=sp_model_bytes)
    c = lesson.chapter("tokenize")
    assert c["ids"] == [tiny_engine.tokenizer.bos_id] + sp.EncodeAsIds(PROMPT)
    assert c["vocab_size"] == sp.GetPieceSize()
    assert c["n_tokens"] == len(c["ids"]) == len(c["pieces"])


def test_byte_tokens_named_as_the_character_they_make(tiny_engine, sp_model_bytes):
    from inference.lesson.text import tokenize
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_proto=sp_model_bytes)
    tok = tiny_engine.tokenizer
    text = "今天天气真好吗🙂"  # the tiny vocabulary has 今天天气真好 but not 吗 nor 🙂: those are bytes
    ids = tok.encode(text, add_bos=False)
    c = tokenize(tok, text, ids)
    split = [g for g in c["groups"] if g["tokens"] > 1]
    assert [g["text"] for g in split] == ["吗", "🙂"]
    for g in split:  # each named: its pieces' bytes, "=", and the character sp decodes them to
        char = sp.DecodeIds([ids[p] for p in g["positions"]])
        assert g["label"] == "".join(c["pieces"][p] for p in g["positions"]) + " = " + char
        assert g["text"] == char and len(char.encode()) == sum(c["tokens"][p]["bytes"] for p in g["positions"])
    assert "".join(g["text"] for g in c["groups"]).strip() == text


def test_embedding_rows_are_the_checkpoints(lesson, hf):
    c = lesson.chapter("embed")
    w = hf.model.embed_tokens.weight
    assert c["shape"] == list(w.shape) and c["bytes"] == w.numel() * 4
    for row in c["rows"]:
        assert row["first_values"] == pytest.approx(w[row["id"], :8].detach().tolist(), abs=1e-6)
        assert row["norm"] == pytest.approx(float(w[row["id"]].detach().norm()), rel=1e-5)


def test_rope_angles_by_hand_and_scores_depend_on_distance_only(lesson, config):
    c = lesson.chapter("rope")
    d = config["hidden_size"] // config["num_attention_heads"]
    theta = config.get("rope_theta", 10000.0)
    for pair in c["pairs"]:
        i = pair["pair"]
        assert pair["radians"] == pytest.approx([p * theta ** (-2 * i / d) for p in c["positions"]], rel=1e-6)
    scores = [s["score"] for s in c["scores"]]
    assert len({s["distance"] for s in c["scores"]}) == 1 and len(scores) >= 3
    assert scores == pytest.approx([scores[0]] * len(scores), rel=1e-4, abs=1e-5)
    assert len({s["query_position"] for s in c["scores"]}) == len(scores)  # moved, not repeated
    assert any(abs(o["score"] - scores[0]) > 1e-3 for o in c["other_distances"])  # another distance, another score


def test_layers_mask_and_attention_against_transformers(lesson, hf, config):
    c = lesson.chapter("layers")
    ids = lesson.chapter("tokenize")["ids"]
    n = len(ids)
    assert c["mask"] == [[int(j <= i) for j in range(n)] for i in range(n)]
    with torch.no_grad():
        att = hf(torch.tensor([ids]), output_attentions=True).attentions[0][0, 0]  # layer 0, head 0: (n, n)
    assert torch.tensor(c["attention_layer0_head0"]) == pytest.approx(att, abs=1e-4)  # (4 decimals shown)
    assert (c["n_heads"], c["n_kv_heads"], c["intermediate"], c["n_layers"]) == (
        config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"],
        config["num_hidden_layers"])
    assert c["expansion"] == config["intermediate_size"] / config["hidden_size"] and c["mlp_matrices"] == 3


def test_lm_head_top_probabilities_are_transformers(lesson, hf):
    c = lesson.chapter("lm_head")
    logits = hf_logits(hf, lesson.chapter("tokenize")["ids"])
    probs = logits.softmax(-1)
    assert [t["id"] for t in c["top"][:3]] == probs.topk(3).indices.tolist()
    for t in c["top"]:
        assert t["prob"] == pytest.approx(float(probs[t["id"]]), abs=1e-4)
        assert t["logit"] == pytest.approx(float(logits[t["id"]]), abs=1e-4)
    assert c["tied"] is True and c["extra_bytes"] == 0


def test_temperature_table_is_softmax_of_the_logits(lesson, hf):
    logits = hf_logits(hf, lesson.chapter("tokenize")["ids"])
    table = lesson.chapter("sampling")["temperature_table"]
    for row in table:
        for t in (0.1, 1.0, 2.0):
            # Logits within 1e-5 of transformers'; divided by 0.1 they differ 10x more.
            assert row[f"T={t:g}"] == pytest.approx(float((logits / t).softmax(-1)[row["id"]]), abs=1e-3 if t < 1 else 1e-4)
    assert sum(row["T=0.1"] for row in table) > sum(row["T=2"] for row in table)


def test_top_p_walk_is_the_runs_final_distribution(lesson):
    c = lesson.chapter("sampling")
    walk = c["top_p"]
    kept = [r for r in walk["walk"] if r["kept"]]
    assert walk["p"] == 0.8 and not walk["shown_only"]
    assert kept and all(r["cumulative"] - r["prob"] < 0.8 for r in kept)
    assert kept[-1]["cumulative"] >= 0.8 or len(kept) == len(walk["walk"])
    final = {t["id"]: t["prob"] for t in c["final_top"]}  # the run's own step 0
    for r in walk["walk"]:
        if r["id"] in final:
            assert final[r["id"]] == pytest.approx(r["renormalised"], abs=1e-4)
    assert sum(r["renormalised"] for r in kept) == pytest.approx(1.0, abs=1e-9)
    assert c["chosen"]["id"] in {r["id"] for r in kept}  # the token appended was in the set


def test_repetition_penalty_rule(lesson, hf):
    c = lesson.chapter("sampling")["repetition_penalty"]
    assert c["shown_only"] and c["penalty"] == 1.3
    ids = set(lesson.chapter("tokenize")["ids"])
    for r in c["rows"]:
        assert r["id"] in ids
        x = r["logit"]
        assert r["penalised_logit"] == pytest.approx(x / 1.3 if x > 0 else x * 1.3, rel=1e-6)


def per_token_by_hand(cfg: dict, context: int, vocab: int) -> dict:
    h, I, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    nh, kvh = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // nh
    return {"attention projections (Q, K, V, output)": L * 2 * (h * nh * d + 2 * h * kvh * d + nh * d * h),
            "attention scores (QKᵀ and × V over the context)": L * 2 * 2 * nh * context * d,
            "MLP (gate, up, down)": L * 2 * 3 * h * I,
            "LM head": 2 * h * vocab}


def test_flops_per_token_by_hand(lesson, config):
    c = lesson.chapter("flops")
    rows = {r["component"]: r["flops"] for r in c["model"]}
    for name, flops in per_token_by_hand(config, c["context"], config["vocab_size"]).items():
        assert rows[name] == flops, name
    assert rows["total"] == sum(v for k, v in rows.items() if k != "total")


def test_llama_7b_flops_per_token():
    from inference.lesson.cost import flops_per_token
    llama = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32}
    tiny = ModelConfig(vocab_size=10, hidden_size=8, intermediate_size=12, n_layers=2, n_heads=2, n_kv_heads=1)
    c = flops_per_token(tiny, 100, 4, ROOF, None)
    rows = {r["component"]: r["flops"] for r in c["llama_7b"]}
    for name, flops in per_token_by_hand(llama, 100, 32000).items():
        assert rows[name] == flops, name
    assert 13e9 <= rows["total"] <= 14e9  # all three MLP matrices counted
    book = c["textbook"]["llama_7b"]
    assert book["mlp_three_matrices"] - book["mlp_two_matrices"] == 32 * 2 * 4096 * 11008
    assert book["kv_bytes_all_heads"] == book["kv_bytes_kv_heads"]  # LLaMA-7B has a KV head per query head
    assert c["textbook"]["model"]["kv_bytes_all_heads"] == 2 * c["textbook"]["model"]["kv_bytes_kv_heads"]


def test_kv_bytes_are_the_cache_allocated(lesson, config, tiny_engine):
    c = lesson.chapter("kv_cache")
    d = config["hidden_size"] // config["num_attention_heads"]
    by_hand = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * d * 4
    assert c["bytes_per_position"] == by_hand == c["allocated_bytes_per_position"]
    cache = tiny_engine.model.new_cache(7)
    assert cache.k.nbytes + cache.v.nbytes == 7 * by_hand
    n = lesson.chapter("tokenize")["n_tokens"]
    assert [g["run_bytes"] for g in c["growth"]] == [by_hand * (n + s) for s in range(STEPS)]  # the run's pool


def test_no_cache_run_makes_the_cached_runs_tokens(lesson, hf):
    c = lesson.chapter("kv_cache")
    assert c["same_tokens"] and c["with_cache_tokens"] == c["without_cache_tokens"]
    ids = lesson.chapter("tokenize")["ids"]
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=STEPS, do_sample=False, min_new_tokens=STEPS)
    assert c["with_cache_tokens"] == out[0, len(ids):].tolist()
    with torch.no_grad():  # every step's top logit, both ways, is transformers' at that position
        logits = hf(out).logits[0, len(ids) - 1:-1]  # (STEPS, vocab)
    top = logits.max(-1).values.tolist()
    assert c["with_cache_top_logits"] == pytest.approx(top, abs=1e-4)
    assert c["without_cache_top_logits"] == pytest.approx(top, abs=1e-4)
    assert len(c["with_cache_ms"]) == len(c["without_cache_ms"]) == STEPS
    # Counted: without a cache a step recomputes the whole prefix.
    assert all(a > b for a, b in zip(c["without_cache_flops"][1:], c["with_cache_flops"][1:]))
    assert c["with_cache_flops"][0] == c["without_cache_flops"][0]  # step 0 is the same prefill


def test_prefill_and_decode_counts(lesson):
    c = lesson.chapter("prefill_decode")
    assert c["prompt_tokens"] == lesson.chapter("tokenize")["n_tokens"]
    assert len(c["decode_ms"]) == STEPS - 1
    pre, dec = c["prefill"], c["decode"]
    assert pre["intensity"] == pre["flops"] / pre["bytes"] and pre["intensity"] > dec["intensity"]
    assert dec["flops"] == lesson.chapter("flops")["model"][-1]["flops"]  # the same token's count
    assert dec["attainable_flops"] == min(ROOF.peak_flops, dec["intensity"] * ROOF.bandwidth)


def test_roofline_measures_positive_peaks():
    roof = measure(torch.device("cpu"), torch.float32)
    assert math.isfinite(roof.peak_flops) and roof.peak_flops > 0
    assert math.isfinite(roof.bandwidth) and roof.bandwidth > 0
    assert "matmul" in roof.how and "MiB" in roof.how


def test_a_server_without_internals_is_refused(tiny_engine, monkeypatch):
    from dataclasses import replace
    from inference.errors import NotAvailable
    info = tiny_engine.describe()
    monkeypatch.setattr(tiny_engine, "describe",
                        lambda: replace(info, capabilities=replace(info.capabilities, internals=False)))
    with pytest.raises(NotAvailable, match="local model"):
        explain(tiny_engine, PROMPT, roofline=ROOF)


def test_cli_prints_one_json_object_per_chapter(tiny_dirs, capsys):
    from inference.cli import main
    rc = main(["explain", "--model", str(tiny_dirs["gqa_tied"]), "--device", "cpu", "--prompt", PROMPT,
               "--steps", "3", "--seed", "2", "--top-p", "0.8", "--jsonl"])
    assert rc == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [c["key"] for c in lines] == [k for k, _ in CHAPTERS]
    assert lines[5]["top_p"]["p"] == 0.8 and lines[5]["settings"]["seed"] == 2
    assert main(["explain", "--model", str(tiny_dirs["gqa_tied"]), "--prompt", PROMPT, "--steps", "1"]) == 2
    assert "--steps must be" in capsys.readouterr().err


def test_on_a_gguf_files_blocks_the_lesson_counts_the_bytes_the_run_reads(tiny_dirs, tmp_path):
    """A model computing on its GGUF file's Q4_1 blocks (the default for an imported GGUF): the
    embedding and LM head are the blocks (20 bytes per 32 weights, by hand); a decode step's
    bytes are the run statistics' and "Inside one token"'s figure (decode_cost on the stored
    blocks), with the float32 one beside them; the rows are the float32 model's."""
    from gguf_files import write_gguf
    from inference.loading.gguf_import import import_gguf
    from inference.model.anatomy import decode_cost
    from inference.serving.engine import Engine

    write_gguf(tiny_dirs["gqa_tied"], tmp_path / "m.gguf", "Q4_1")
    model_dir = import_gguf(tmp_path / "m.gguf", tmp_path / "imported", progress=False)
    with Engine.from_hf_dir(model_dir) as blocks, Engine.from_hf_dir(model_dir, dtype="float32") as f32:
        info = blocks.describe()
        assert info.stored_bytes
        quant = explain(blocks, PROMPT, SETTINGS, roofline=ROOF, steps=3, seed=1)
        full = explain(f32, PROMPT, SETTINGS, roofline=ROOF, steps=3, seed=1)
    cfg = info.cfg
    q4_1 = cfg.vocab_size * cfg.hidden_size // 32 * 20
    embed, head = quant.chapter("embed"), quant.chapter("lm_head")
    assert embed["dtype"] == head["dtype"] == "Q4_1 blocks" and embed["bytes"] == head["bytes"] == q4_1
    assert embed["bytes_per_value"] == 20 / 32
    assert full.chapter("embed")["dtype"] == "float32"
    assert full.chapter("embed")["bytes"] == 4 * cfg.vocab_size * cfg.hidden_size
    for a, b in zip(embed["rows"], full.chapter("embed")["rows"]):
        assert a["first_values"] == pytest.approx(b["first_values"], abs=1e-6)
    n = quant.chapter("tokenize")["n_tokens"]
    c = quant.chapter("prefill_decode")
    assert c["decode_reads_blocks"] and c["decode"]["bytes"] == decode_cost(cfg, n + 1, 4, 4, info.stored_bytes).bytes
    assert c["decode_bytes_float32"] == decode_cost(cfg, n + 1, 4, 4).bytes > c["decode"]["bytes"]
    assert quant.chapter("flops")["model"][-1]["bytes"] == c["decode"]["bytes"]  # one number in two chapters
    assert not full.chapter("prefill_decode")["decode_reads_blocks"]
    assert full.chapter("prefill_decode")["decode"]["bytes"] == c["decode_bytes_float32"]
