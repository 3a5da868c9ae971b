"""GGUF files of each family people run, as llama.cpp's converter writes them (tests/gguf_files.py),
each with a tokenizer trained on that family's split: our numbers within 1e-4 of transformers' on
what the file holds (top-10 probabilities, through the static cache and the paged decode), our
tokens equal to transformers' own GGUF tokenizer on hard strings, and the chat stopping where the
family's template ends a turn."""

import json

import pytest
import torch

from gguf_files import train_bpe_tokenizer_json, write_gguf
from inference.loading.gguf_import import import_gguf
from inference.request import prepare_run
from inference.sampling.params import SamplingParams
from inference.serving.engine import Engine
from tiny_families import FAMILIES, make_family_model
from tiny_models import TRAIN_TEXT

transformers = pytest.importorskip("transformers")

TOL = 1e-4
HARD = ["12345 3.14159 1,000,000 2024-06-01 007", "我想在apple工作1314151天～ 今天天气真好。",
        "🚀 (normal) 😶‍🌫️ (emojis) ✅ 🦙🦙", "def f(x):\n    return x**2  # square\n\n\tpass",
        "a  b   c\t\t d\n\n\n e   \n", "I've been 'told he's there, 'RE you sure? We'Ve a'lL",
        "HelloWorld CamelCase ÀÉÎõ naïve", "------======= ......!!!!!!?????? ''''''```````"]

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEMPLATES = {  # name -> (template, special tokens, bos, eos, eot, eom)
    "llama3": ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
               "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
               "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
               ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                "<|eom_id|>"], "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"),
    "chatml": (CHATML, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|endoftext|>", None, None),
    "tekken": ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST]{{ m['content'] }}[/INST]"
               "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}",
               ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], "<s>", "</s>", None, None),
    "deepseek": ("{% for m in messages %}{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}{% else %}"
                 "<｜Assistant｜>{{ m['content'] }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}",
                 ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"],
                 "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", None, None),
    "phi": ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
            ["<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>"], None, "<|endoftext|>", None, None),
    "olmo2": ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{% if m['role'] == 'assistant' %}"
              "{{ eos_token }}{% endif %}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
              ["<|endoftext|>", "<|pad|>", "<|user|>", "<|assistant|>"], None, "<|endoftext|>", None, None),
    "granite": ("{% for m in messages %}<|start_of_role|>{{ m['role'] }}<|end_of_role|>{{ m['content'] }}"
                "<|end_of_text|>\n{% endfor %}{% if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>"
                "{% endif %}", ["<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>"], None,
                "<|end_of_text|>", None, None),
}
GEMMA3 = dict(num_hidden_layers=6, layer_types=None, query_pre_attn_scalar=32, final_logit_softcapping=None,
              rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})
# What llama.cpp assumes of a Gemma 2 file: every other layer slides, 1/sqrt(head_dim).
GEMMA2 = dict(query_pre_attn_scalar=32)
# id -> (tiny family, matrices' type, 256-wide rows' type, tokenizer.ggml.pre or "sentencepiece",
#        template, config changes, transformers reads the file's model too)
CASES = {
    "llama3.2": ("llama3_rope", "Q8_0", "Q4_K", "llama-bpe", "llama3", {}, False),  # rope_freqs: transformers drops it
    "mistral-nemo": ("llama", "Q4_0", "Q6_K", "tekken", "tekken", {}, True),
    "mistral-7b": ("llama", "Q8_0", "Q5_K", "sentencepiece", None, {}, True),
    "smollm2": ("llama", "Q4_1", "Q4_K", "smollm", "chatml", {}, True),
    "qwen2.5": ("qwen2_yarn", "Q8_0", "Q6_K", "qwen2", "chatml", {}, False),  # YaRN: transformers drops it
    "r1-distill-qwen": ("qwen2", "Q5_0", "Q4_K", "deepseek-r1-qwen", "deepseek", {}, True),
    "qwen3": ("qwen3", "Q8_0", "Q5_K", "qwen2", "chatml", {}, False),  # head_dim 24: transformers' GGUF config drops it
    # transformers' GGUF config takes Gemma's query_pre_attn_scalar as 256 (llama.cpp: head_dim)
    "gemma3": ("gemma3_text", "Q8_0", "Q5_K", "sentencepiece", None, GEMMA3, False),
    "gemma2": ("gemma2", "Q8_0", "Q6_K", "sentencepiece", None, GEMMA2, False),
    # transformers' GGUF config takes Phi-3's pad id as 32000, past a tiny vocabulary
    "phi3": ("phi3", "Q8_0", "Q4_K", "sentencepiece", None, dict(sliding_window=None), False),
    "phi3.5-mini": ("phi3_longrope", "Q8_0", "Q4_K", "sentencepiece", None, dict(sliding_window=None), False),
    # partial rotary (12 of 16 dims) and LongRoPE: Phi-4-mini's shape and vocabulary
    "phi4-mini": ("phi4_mini", "Q8_0", "Q6_K", "gpt-4o", "phi", {}, False),
    "smollm3": ("smollm3", "Q8_0", "Q4_K", "llama-bpe", "chatml", dict(num_hidden_layers=4, no_rope_layer_interval=4), False),
    "olmo2": ("olmo2", "Q8_0", "Q6_K", "dbrx", "olmo2", {}, False),
    "granite": ("granite", "Q8_0", "Q4_K", "refact", "granite", {}, False),
}
# Names transformers' GGUF tokenizer splits as the family does; for the others (GPT-2's split
# for "smollm", "refact") the reference is the family's own tokenizer.json.
TRANSFORMERS_SPLITS = ("llama-bpe", "tekken", "qwen2", "deepseek-r1-qwen", "gpt-4o", "dbrx")


def build(tmp_path, sp_model_bytes, case, split_max_tensors=0):
    family, qtype, kquant, pre, template, changes, _ = CASES[case]
    src, ref = make_family_model(tmp_path, family, sp_model_bytes, intermediate_size=256, **changes)
    specials = None
    if pre != "sentencepiece":
        text, tokens, bos, eos, eot, eom = TEMPLATES[template]
        (src / "tokenizer.model").unlink()
        (src / "tokenizer.json").write_text(train_bpe_tokenizer_json(TRAIN_TEXT + HARD * 10, 384, pre, tokens))
        (src / "tokenizer_config.json").write_text(json.dumps(
            {"bos_token": bos, "eos_token": eos, "add_bos_token": bos is not None, "chat_template": text}))
        specials = {k: t for k, t in (("bos", bos), ("eos", eos), ("eot", eot), ("eom", eom)) if t}
    path = tmp_path / f"{case}.gguf"
    held = write_gguf(src, path, qtype, tokenizer="llama" if pre == "sentencepiece" else "gpt2", kquant=kquant,
                      pre=pre, specials=specials, split_max_tensors=split_max_tensors)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in held.items()}, strict=False)
    ref.config._attn_implementation = "eager"
    first = path if not split_max_tensors else next(tmp_path.glob(f"{case}-00001-of-*.gguf"))
    return src, ref, first


def top10_gap(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest difference of the reference's 10 most likely tokens' probabilities, per row."""
    p, q = ours.float().softmax(-1), ref.float().softmax(-1)
    top = q.topk(10, dim=-1).indices
    return (p.gather(-1, top) - q.gather(-1, top)).abs().max().item()


@pytest.mark.parametrize("case", list(CASES))
def test_family_gguf_matches_transformers(tmp_path, sp_model_bytes, case):
    family, qtype, kquant, pre, template, _, transformers_reads = CASES[case]
    src, ref, path = build(tmp_path, sp_model_bytes, case)
    out = import_gguf(path, tmp_path / "imported", progress=False)
    assert not list(out.glob("*.safetensors"))  # no copy of the weights
    ids = torch.randint(5, 370, (1, 30), generator=torch.Generator().manual_seed(3))
    with Engine.from_hf_dir(out) as engine, torch.inference_mode():  # the file's blocks
        assert engine.cfg.family == ref.config.model_type
        assert engine.model.quantized
        ours = engine.model(ids, engine.model.new_cache(30), 0, all_logits=True)[0]
        expected = ref(input_ids=ids).logits[0]
        gap = top10_gap(ours, expected)
        # the paged path (the one-call step where the family's features allow it), a run at a time
        engine.eos_ids = set()
        params = SamplingParams(temperature=0.0, max_new_tokens=4)
        steps = [e for e in engine.generate_ids(ids[0].tolist(), params, top_n=10) if hasattr(e, "top")]
        seq = ids[0].tolist()
        for e in steps:
            probs = ref(input_ids=torch.tensor([seq])).logits[0, -1].softmax(-1)
            assert e.token_id == int(probs.argmax())
            gap = max([gap] + [abs(c.raw_prob - probs[c.id].item()) for c in e.top])
            seq.append(e.token_id)
        if transformers_reads:  # transformers' own reading of the file: the same model
            theirs = transformers.AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager").eval()
            gap = max(gap, top10_gap(ours, theirs(input_ids=ids).logits[0]))
    print(f"{case} ({qtype} + {kquant}, {pre}): max |top-10 prob diff| {gap:.2e}")
    assert gap <= TOL
    assert expected.abs().max() > 0.5  # not a comparison of near-zero logits (Granite's are divided by 2.5)


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][3] != "sentencepiece" or c == "gemma3"])
def test_family_gguf_tokenizes_as_transformers(tmp_path, sp_model_bytes, case):
    """Hard strings (digits, CJK, emoji, code, whitespace runs) split into the same tokens as
    transformers' own reading of the file's vocabulary (its GGUF tokenizer builder), or, for names
    it splits as GPT-2 does, as the family's own tokenizer.json (sentencepiece: the model file);
    and back to the same text."""
    import sentencepiece as spm
    from tokenizers import Tokenizer
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

    src, _, path = build(tmp_path, sp_model_bytes, case)
    pre = CASES[case][3]
    if pre in TRANSFORMERS_SPLITS:
        arch, vocab, _ = get_gguf_tokenizer(str(path))
        theirs = convert_gguf_tokenizer(arch, vocab)[0]
        encode = lambda t: theirs.encode(t, add_special_tokens=False).ids  # noqa: E731
    elif pre == "sentencepiece":
        own_sp = spm.SentencePieceProcessor(model_file=str(src / "tokenizer.model"))
        encode = own_sp.encode  # noqa: E731
    else:
        own = Tokenizer.from_file(str(src / "tokenizer.json"))
        encode = lambda t: own.encode(t, add_special_tokens=False).ids  # noqa: E731
    with Engine.from_hf_dir(import_gguf(path, tmp_path / "imported", progress=False)) as engine:
        tok = engine.tokenizer
        for text in HARD:
            assert tok.encode(text, add_bos=False) == encode(text), text
            prefix = " " if pre == "sentencepiece" else ""  # sentencepiece's dummy prefix, decoded as a continuation
            assert tok.decode(tok.encode(text, add_bos=False)) == prefix + text
        # A template's control tokens are its tokens, as transformers reads them (but for those spelled
        # outside the byte alphabet, DeepSeek's, which transformers' builder drops as mislabels).
        if pre not in ("sentencepiece", "deepseek-r1-qwen"):
            chat = f"{TEMPLATES[CASES[case][4]][1][-1]}user\n123 hi"
            assert tok.encode(chat, add_bos=False, controls=True) == encode(chat)


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][4]])
def test_family_chat_stops_where_its_template_ends_a_turn(tmp_path, sp_model_bytes, case):
    """The token the family's template writes after an assistant's message (eot, <|im_end|>,
    <|end|>, eos) is a stop, and so are the file's eot and eom: a chat whose first token is the
    turn's end (logit bias) ends there."""
    from jinja2 import Template

    _, _, path = build(tmp_path, sp_model_bytes, case)
    text, tokens, bos, eos, eot, eom = TEMPLATES[CASES[case][4]]
    rendered = Template(text).render(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "\ue000"}],
                                     bos_token=bos or "", eos_token=eos, add_generation_prompt=False)
    end = max((t for t in tokens if rendered.split("\ue000")[1].startswith(t)), key=len)
    with Engine.from_hf_dir(import_gguf(path, tmp_path / "imported", progress=False)) as engine:
        ids = {t: engine.tokenizer.special_tokens[t] for t in tokens}
        assert {ids[t] for t in (end, eot, eom) if t} <= engine.eos_ids
        params = SamplingParams(temperature=0.0, max_new_tokens=5, logit_bias=f"{ids[end]}:100")
        events = list(engine.run(prepare_run(engine, params, prompt="hi", chat=True)))
    assert events[-1].reason == "eos" and events[-1].generated_tokens == 1


def test_a_split_gguf_file_loads_from_its_first_part(tmp_path, sp_model_bytes):
    src, ref, first = build(tmp_path, sp_model_bytes, "qwen3", split_max_tensors=8)
    parts = sorted(tmp_path.glob("qwen3-0000*-of-*.gguf"))
    assert len(parts) > 2 and first == parts[0]
    ids = torch.randint(5, 370, (1, 12), generator=torch.Generator().manual_seed(3))
    with Engine.from_hf_dir(import_gguf(first, tmp_path / "imported", progress=False)) as engine, torch.inference_mode():
        gap = top10_gap(engine.model(ids, engine.model.new_cache(12), 0, all_logits=True)[0], ref(input_ids=ids).logits[0])
    assert gap <= TOL
    parts[-1].unlink()
    from inference.errors import ModelError
    with pytest.raises(ModelError, match="part .* is missing"):
        import_gguf(first, tmp_path / "again", progress=False)


@pytest.mark.parametrize("case, words", [
    ("gemma2", ["family gemma2", "attention scores soft-capped", "logits soft-capped", "some layers see only the last W"]),
    ("smollm3", ["family smollm3", "some layers apply no RoPE at all"]),
    ("olmo2", ["family olmo2", "no norm before attention", "RMSNorm over the whole q"]),
    ("granite", ["family granite", "multiplied by a constant before the residual add", "logits divided by a constant"]),
])
def test_the_card_and_the_lesson_say_the_familys_turns_and_the_files_types(tmp_path, sp_model_bytes, case, words):
    """The model card names the family, each turn of its path and the file's bytes by type; the
    lesson's chapters show the turns (a layer without RoPE, soft-capped scores)."""
    from inference.lesson.path import layers, rope
    from tests.helpers import plain
    from ui.shared.card import model_card

    _, _, path = build(tmp_path, sp_model_bytes, case)
    with Engine.from_hf_dir(import_gguf(path, tmp_path / "imported", progress=False)) as engine:
        info = engine.describe()
        card = plain(model_card(info))
        ids = engine.tokenizer.encode("the cat sat on the mat")
        pattern = engine.attention_pattern(ids, 0)
        chapter = layers(engine.cfg, len(ids), 4, pattern)
        rotation = rope(engine.model, ids)
    for w in words:
        assert w in card, w
    qtype, kquant = CASES[case][1:3]
    assert f"{qtype} " in card and f"{kquant} " in card and "GGUF file" in card
    assert sum(info.file_types.values()) < path.stat().st_size  # the tensors' bytes, as stored
    assert set(info.file_types) == {qtype, kquant, "F32"}
    if case == "gemma2":
        assert "soft-capped to ±2" in next(s["note"] for s in chapter["steps"] if s["step"].startswith("scores"))
    if case == "smollm3":
        assert rotation["layers_without_rope"] == [3]
