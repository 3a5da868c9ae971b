"""GGUF import: tiny files written with gguf.GGUFWriter load to the same model; bad files fail clearly."""

import struct

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from gguf_files import train_bpe_tokenizer_json, write_gguf
from inference.serving.engine import Engine
from inference.errors import ModelError
from inference.loading.gguf_import import import_gguf
from test_tokenizer import TEXTS
from tiny_models import TRAIN_TEXT, make_tiny_model

IDS = [1, 7, 42, 99, 150, 3, 77, 200]


def logits(engine, ids=IDS):
    with torch.inference_mode():
        return engine.model(torch.tensor([ids]), engine.model.new_cache(len(ids)), 0, all_logits=True)


def reference_dir(src, held, dst):
    """A copy of src whose weights are exactly what the GGUF holds (after its quantization)."""
    import shutil
    shutil.copytree(src, dst)
    save_file({k: torch.from_numpy(v) for k, v in held.items()}, str(dst / "model.safetensors"))
    return dst


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    tj = train_bpe_tokenizer_json(TRAIN_TEXT, 400)
    return make_tiny_model(tmp_path_factory.mktemp("bpe"), "gqa_tied", seed=7, tokenizer_json=tj,
                           dir_name="bpe")


@pytest.mark.parametrize("name, qtype", [("mha", "F32"), ("gqa_tied", "F32"), ("gqa_tied", "F16"), ("mha", "BF16"),
                                         ("mha", "Q8_0"), ("gqa_tied", "Q4_0"), ("gqa_tied", "Q4_1")])
def test_gguf_with_sentencepiece_vocab_matches_its_source(tiny_dirs, tmp_path, name, qtype):
    src = tiny_dirs[name]
    held = write_gguf(src, tmp_path / "m.gguf", qtype, tokenizer="llama")
    imported = Engine.from_hf_dir(import_gguf(tmp_path / "m.gguf", tmp_path / "imported", progress=False))
    ref = Engine.from_hf_dir(reference_dir(src, held, tmp_path / "ref"))
    diff = (logits(imported) - logits(ref)).abs().max().item()
    assert diff <= 1e-4, diff
    if qtype == "F32":  # the file holds the source weights exactly
        assert (logits(imported) - logits(Engine.from_hf_dir(src))).abs().max().item() <= 1e-5
    src_tok, tok = Engine.from_hf_dir(src).tokenizer, imported.tokenizer
    for text in TEXTS + ["<|im_start|>user\nhi<|im_end|>"]:
        assert tok.encode(text) == src_tok.encode(text)
    assert tok.chat_template == src_tok.chat_template
    assert imported.cfg.tie_word_embeddings == Engine.from_hf_dir(src).cfg.tie_word_embeddings


def test_gguf_with_byte_level_bpe_matches_its_source(bpe_dir, tmp_path):
    held = write_gguf(bpe_dir, tmp_path / "b.gguf", "Q8_0", tokenizer="gpt2")
    imported = Engine.from_hf_dir(import_gguf(tmp_path / "b.gguf", tmp_path / "imported", progress=False))
    ref = Engine.from_hf_dir(reference_dir(bpe_dir, held, tmp_path / "ref"))
    assert (logits(imported) - logits(ref)).abs().max().item() <= 1e-4
    src_tok = Engine.from_hf_dir(bpe_dir).tokenizer
    for text in TEXTS + ["<|im_start|>user\n123 hi<|im_end|>"]:
        assert imported.tokenizer.encode(text) == src_tok.encode(text)
        ids = imported.tokenizer.encode(text)
        assert imported.tokenizer.decode(ids) == text
    assert imported.tokenizer.bos_id == src_tok.special_tokens["<|im_start|>"]


@pytest.mark.parametrize("kquant", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_quants_dequantize_through_gguf(sp_model_bytes, tmp_path, kquant):
    src = make_tiny_model(tmp_path, "mha", sp_model=sp_model_bytes, hidden_size=256,
                          num_attention_heads=4, num_key_value_heads=2, intermediate_size=256)
    held = write_gguf(src, tmp_path / "k.gguf", "F32", kquant=kquant)
    out = import_gguf(tmp_path / "k.gguf", tmp_path / "imported", progress=False)
    # The float32 products on the blocks sum as the float32 model does: its logits within 1e-4.
    imported = Engine.from_hf_dir(out, products="float32")
    ref = Engine.from_hf_dir(reference_dir(src, held, tmp_path / "ref"))
    assert (logits(imported) - logits(ref)).abs().max().item() <= 1e-4
    # The integer products read the same numbers: each weight repacked from the file dequantizes
    # to the same bits (their sums are within the bound of tests/model/test_islices.py).
    integer = Engine.from_hf_dir(out, products="integer")
    pairs = [(a.qweight, b.qweight) for a, b in zip(integer.model.modules(), imported.model.modules())
             if getattr(a, "qweight", None) is not None]
    assert pairs and any(q.integer for q, _ in pairs)
    assert all(torch.equal(q.dequantize(), f.dequantize()) for q, f in pairs)


def test_default_cli_path_imports_gguf_files(tiny_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_gguf(tiny_dirs["mha"], tmp_path / "m.gguf", "F32")
    engine = Engine.load(str(tmp_path / "m.gguf"))
    assert (tmp_path / "cache" / "token-lab" / "gguf").is_dir()
    assert (logits(engine) - logits(Engine.from_hf_dir(tiny_dirs["mha"]))).abs().max().item() <= 1e-5


def test_two_processes_opening_a_new_gguf_at_once_import_it_once(tiny_dirs, tmp_path, monkeypatch):
    """Two apps (or test workers) started together on a fresh cache: the second waits for the
    first's import and then uses it, instead of importing over the directory the first reads."""
    import fcntl
    import threading
    import types

    from inference.loading import default_model
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_gguf(tiny_dirs["mha"], tmp_path / "m.gguf", "F32")
    first_in, second_waits = threading.Event(), threading.Event()
    imports, locks = [], []

    def held_import(*args, **kwargs):
        imports.append(args)
        first_in.set()
        assert second_waits.wait(60), "the second opener never reached the lock"
        return import_gguf(*args, **kwargs)

    def flock(f, op):
        locks.append(op)
        if len(locks) == 2:
            second_waits.set()
        return fcntl.flock(f, op)

    monkeypatch.setattr(default_model, "import_gguf", held_import)
    monkeypatch.setattr(default_model, "fcntl", types.SimpleNamespace(flock=flock, LOCK_EX=fcntl.LOCK_EX))
    out = {}
    first = threading.Thread(target=lambda: out.setdefault("first", default_model.resolve_model(str(tmp_path / "m.gguf"))))
    second = threading.Thread(target=lambda: out.setdefault("second", default_model.resolve_model(str(tmp_path / "m.gguf"))))
    first.start()
    assert first_in.wait(60)
    second.start()
    first.join(120)
    second.join(120)
    assert len(imports) == 1 and out["first"] == out["second"]
    assert (logits(Engine.from_hf_dir(out["second"])) - logits(Engine.from_hf_dir(tiny_dirs["mha"]))).abs().max() <= 1e-5


# ---------------------------------------------------------------- malformed files

@pytest.fixture
def good_gguf(tiny_dirs, tmp_path):
    path = tmp_path / "good.gguf"
    write_gguf(tiny_dirs["mha"], path, "Q8_0")
    return path


def tensor_info_offsets(path, name):
    """Byte offsets of one tensor info's n_dims, dims, type and offset fields."""
    r = gguf.GGUFReader(str(path))
    field = next(t.field for t in r.tensors if t.name == name)
    base = field.offset + 8 + len(name)
    n_dims = int(field.parts[2][0])
    return {"n_dims": base, "type": base + 4 + 8 * n_dims, "offset": base + 4 + 8 * n_dims + 4}


def patch(path, at, fmt, value):
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, at, value)
    path.write_bytes(bytes(data))


def expect_error(path, tmp_path, pattern):
    with pytest.raises(ModelError, match=pattern):
        import_gguf(path, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_truncated_file(good_gguf, tmp_path):
    data = good_gguf.read_bytes()
    good_gguf.write_bytes(data[: len(data) * 2 // 3])
    expect_error(good_gguf, tmp_path, r"past the end of the file .* truncated")
    good_gguf.write_bytes(data[:50])  # cut inside the header
    expect_error(good_gguf, tmp_path, r"not a valid GGUF file|more than the file can hold")


def test_offset_past_the_end(good_gguf, tmp_path):
    patch(good_gguf, tensor_info_offsets(good_gguf, "blk.0.ffn_up.weight")["offset"], "<Q", 10**12)
    expect_error(good_gguf, tmp_path, r"blk\.0\.ffn_up\.weight data ends at byte .* past the end")


def test_unknown_type(good_gguf, tmp_path):
    patch(good_gguf, tensor_info_offsets(good_gguf, "blk.1.attn_v.weight")["type"], "<I", 99)
    expect_error(good_gguf, tmp_path, r"blk\.1\.attn_v\.weight has unknown type id 99")


def test_bad_magic(good_gguf, tmp_path):
    patch(good_gguf, 0, "<I", 0x12345678)
    expect_error(good_gguf, tmp_path, r"not a valid GGUF file .*magic")


def test_five_dims_and_zero_dims(tmp_path):
    for shape, pattern in [((1, 1, 1, 2, 32), "5 dims"), ((0, 32), "zero or negative dim")]:
        path = tmp_path / "dims.gguf"
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_tensor("token_embd.weight", np.zeros(shape, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        expect_error(path, tmp_path, pattern)


def test_wrong_shape(tiny_dirs, tmp_path):
    src = make_tiny_model(tmp_path, "mha", seed=1, dir_name="src")
    import json
    cfg = json.loads((src / "config.json").read_text())
    cfg["intermediate_size"] = 96  # the weights still have 160: the metadata now disagrees
    path = tmp_path / "shape.gguf"
    write_gguf(src, path, "F32")
    data = bytearray(path.read_bytes())
    r = gguf.GGUFReader(str(path))
    ff = r.fields["llama.feed_forward_length"]
    struct.pack_into("<I", data, int(ff.offset) + 8 + len("llama.feed_forward_length") + 4, 96)
    path.write_bytes(bytes(data))
    expect_error(path, tmp_path, r"blk\.0\.ffn_\w+\.weight has shape \[(160, 64|64, 160)\], the metadata implies \[(96, 64|64, 96)\]")


def test_tokenizer_arrays_of_the_wrong_type(tiny_dirs, tmp_path):
    path = tmp_path / "tok.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_array("tokenizer.ggml.tokens", [1, 2, 3])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    expect_error(path, tmp_path, r"tokenizer\.ggml\.tokens should be an array of str")
