"""Loading Hugging Face directories: shards, refusals and clear errors naming the problem."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from inference.serving.engine import Engine
from inference.errors import ModelError


def copy_dir(src, dst):
    shutil.copytree(src, dst)
    return dst


def logits_of(engine, ids=(1, 5, 9, 200, 33)):
    with torch.inference_mode():
        return engine.model(torch.tensor([ids]), engine.model.new_cache(len(ids)), 0)


def test_sharded_checkpoint_loads_the_same_weights(tiny_dirs, tmp_path):
    d = copy_dir(tiny_dirs["mha"], tmp_path / "sharded")
    weights = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, keys in shards.items():
        save_file({k: weights[k] for k in keys}, d / fname)
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: f for f, ks in shards.items() for k in ks}}))
    a = logits_of(Engine.from_hf_dir(tiny_dirs["mha"]))
    b = logits_of(Engine.from_hf_dir(d))
    assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_pickle_checkpoints_are_refused(tiny_dirs, tmp_path):
    d = copy_dir(tiny_dirs["mha"], tmp_path / "pickled")
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    with pytest.raises(ModelError, match="pickle"):
        Engine.from_hf_dir(d)
    with pytest.raises(ModelError, match="pickle"):
        Engine.load(str(d / "pytorch_model.bin"))


def test_shape_mismatch_names_the_tensor(tiny_dirs, tmp_path):
    d = copy_dir(tiny_dirs["mha"], tmp_path / "bad_shape")
    w = load_file(d / "model.safetensors")
    w["model.layers.1.mlp.up_proj.weight"] = torch.zeros(7, 64)
    save_file(w, d / "model.safetensors")
    with pytest.raises(ModelError, match=r"model\.layers\.1\.mlp\.up_proj\.weight has shape \[7, 64\]"):
        Engine.from_hf_dir(d)


def test_missing_and_unexpected_tensors_are_named(tiny_dirs, tmp_path):
    d = copy_dir(tiny_dirs["mha"], tmp_path / "missing")
    w = load_file(d / "model.safetensors")
    del w["model.layers.0.self_attn.k_proj.weight"]
    save_file(w, d / "model.safetensors")
    with pytest.raises(ModelError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight is missing"):
        Engine.from_hf_dir(d)
    w["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(64, 64)
    w["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    save_file(w, d / "model.safetensors")
    with pytest.raises(ModelError, match=r"unexpected tensor 'model\.layers\.0\.self_attn\.q_proj\.bias'"):
        Engine.from_hf_dir(d)


def test_config_that_disagrees_with_weights(tiny_dirs, tmp_path):
    d = copy_dir(tiny_dirs["mha"], tmp_path / "cfg")
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=r"model\.layers\.2\..* is missing"):
        Engine.from_hf_dir(d)


@pytest.mark.parametrize("cut", [4, 100, -1000])
def test_truncated_safetensors_is_a_clear_error(tiny_dirs, tmp_path, cut):
    d = copy_dir(tiny_dirs["mha"], tmp_path / f"trunc{cut}")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:cut])
    with pytest.raises(ModelError, match="model.safetensors"):
        Engine.from_hf_dir(d)


def test_header_that_lies_about_shapes(tiny_dirs, tmp_path):
    d = copy_dir(tiny_dirs["mha"], tmp_path / "lying")
    raw = bytearray((d / "model.safetensors").read_bytes())
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header["model.norm.weight"]["shape"] = [6400]  # more elements than its byte range holds
    new = json.dumps(header, separators=(",", ":")).encode()
    (d / "model.safetensors").write_bytes(len(new).to_bytes(8, "little") + new + raw[8 + n:])
    with pytest.raises(ModelError):
        Engine.from_hf_dir(d)


def test_embedding_rows_past_the_tokenizer_decode_to_nothing(tmp_path, sp_model_bytes):
    from tiny_models import make_tiny_model
    d = make_tiny_model(tmp_path, "mha", sp_model=sp_model_bytes, vocab_size=400)
    engine = Engine.from_hf_dir(d)
    tok = engine.tokenizer
    assert tok.vocab_size == 400 and tok.piece(399) == "<unused 399>" and tok.decode([399]) == ""
    with pytest.raises(ModelError, match="tokenizer has 384 tokens"):
        make_tiny_model(tmp_path, "mha", sp_model=sp_model_bytes, vocab_size=300, dir_name="small")
        Engine.from_hf_dir(tmp_path / "small")
