"""GGUF import of the other families (qwen2, qwen3, gemma3), as llama.cpp writes them: quantized
tensors dequantized through gguf's own code, a directory transformers reads as the same family,
and our numbers on it within 1e-4 of transformers'."""

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from gguf_files import write_gguf
from inference.loading.gguf_import import import_gguf
from inference.serving.engine import Engine
from tiny_families import FAMILIES, make_family_model

transformers = pytest.importorskip("transformers")

# Rows of 256 (the MLP's down projection) take the K-quant; the rest the block quant.
CASES = [
    ("qwen2", "Q8_0", "Q4_K", {}),
    ("qwen3", "Q5_0", "Q6_K", {}),
    # What llama.cpp assumes of a Gemma 3 file: 1/sqrt(head_dim), every 6th layer global,
    # sliding layers at base 10,000, no scaling: the tiny config says the same.
    ("gemma3_text", "Q8_0", "Q5_K", dict(
        num_hidden_layers=6, layer_types=None, query_pre_attn_scalar=32, final_logit_softcapping=None,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})),
]


@pytest.mark.parametrize("name, qtype, kquant, changes", CASES, ids=[c[0] for c in CASES])
def test_family_gguf_imports_to_what_the_file_holds(tmp_path, sp_model_bytes, name, qtype, kquant, changes):
    src, _ = make_family_model(tmp_path, name, sp_model_bytes, intermediate_size=256, **changes)
    held = write_gguf(src, tmp_path / "m.gguf", qtype, kquant=kquant)
    out = import_gguf(tmp_path / "m.gguf", tmp_path / "imported", progress=False)

    imported = load_file(str(out / "model.safetensors"))
    assert set(imported) == set(held)
    for key, value in held.items():  # bit for bit what gguf's dequantize makes of the file
        assert np.array_equal(imported[key], value), key

    ref = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    assert type(ref).__name__ == FAMILIES[name][1]
    ids = torch.randint(5, 370, (1, 30), generator=torch.Generator().manual_seed(3))
    with Engine.from_hf_dir(out, device="cpu", dtype="float32") as engine, torch.inference_mode():
        assert engine.cfg.family == name
        ours = engine.model(ids, engine.model.new_cache(30), 0, all_logits=True)[0]
        expected = ref(input_ids=ids).logits[0]
        text = "The quick brown fox jumps over the lazy dog."
        source = Engine.from_hf_dir(src, device="cpu", dtype="float32")
        assert engine.tokenizer.encode(text) == source.tokenizer.encode(text)
        source.close()
    diff = (ours - expected).abs().max().item()
    print(f"{name} GGUF ({qtype} + {kquant}): max |logit diff| vs transformers {diff:.2e}")
    assert diff <= 1e-4
