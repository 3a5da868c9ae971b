"""The quantized types people's GGUF files hold beyond the first seven (Q5_1, IQ4_NL, Q2_K, Q3_K,
IQ4_XS), each a whole tiny model computed on the file's own blocks (no float32 copy of a matrix)
against the same file expanded to float32; and the types we do not compute refused in one line
naming the tensor and its type, by the importer, the engine and the CLI (the page's picker and
--model, and the API, open models through the same loader)."""

import gguf
import pytest
import torch

from inference.model import kernels

NEW_TYPES = ["Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "IQ4_XS"]
# Types no kernel computes: IQ1-IQ3's grids, the ternary TQ types, MXFP4, and Q8_K (llama.cpp's
# activations' type, which gguf cannot dequantize either).
REFUSED = ["IQ1_S", "IQ2_XXS", "IQ3_S", "TQ1_0", "MXFP4", "Q8_K"]


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory, sp_model_bytes):
    """A tiny llama whose every matrix has 256 inputs (whole blocks of the K types), tied head."""
    from tiny_models import make_tiny_model
    return make_tiny_model(tmp_path_factory.mktemp("wide"), "gqa_tied", seed=3, sp_model=sp_model_bytes,
                           hidden_size=256, intermediate_size=256)


def greedy(engine, ids, n=6):
    from inference.events import StepEvent
    from inference.sampling.params import SamplingParams
    events = engine.generate_ids(ids, SamplingParams(temperature=0.0, max_new_tokens=n), top_n=5)
    return [e for e in events if isinstance(e, StepEvent)]


def assert_same_run(a, b, tol):
    assert [e.token_id for e in a] == [e.token_id for e in b] and len(a) == 6
    for x, y in zip(a, b):
        assert [c.id for c in x.top] == [c.id for c in y.top]
        assert max(abs(c.raw_prob - d.raw_prob) for c, d in zip(x.top, y.top)) <= tol


@pytest.mark.skipif(not kernels.available(), reason="no C compiler here: a GGUF model loads float32")
@pytest.mark.parametrize("name", NEW_TYPES)
def test_a_model_of_each_type_computes_on_its_blocks_as_on_float32(wide_dir, tmp_path, name):
    """Every matrix of the file in the type (the tied embedding and head too): the model holds
    the blocks alone (no float32 copy of any matrix), and its probabilities with the default
    products and with --products float32 are the expanded float32 model's within 1e-5 (float32
    products on the blocks: the same sums, so tighter still)."""
    from gguf_files import write_gguf
    from inference.loading.gguf_import import import_gguf
    from inference.model.layers import Linear
    from inference.serving.engine import Engine

    write_gguf(wide_dir, tmp_path / "m.gguf", name)
    assert {t.tensor_type.name for t in gguf.GGUFReader(tmp_path / "m.gguf").tensors if len(t.shape) == 2} == {name}
    model_dir = import_gguf(tmp_path / "m.gguf", tmp_path / "imported", progress=False)
    with Engine.from_hf_dir(model_dir) as blocks, Engine.from_hf_dir(model_dir, products="float32") as f32_products, \
            Engine.from_hf_dir(model_dir, dtype="float32") as expanded:
        for engine in (blocks, f32_products):
            model = engine.model
            linears = [m for m in model.modules() if isinstance(m, Linear)]
            assert model.quantized and all(m.weight is None and m.qweight.types() == [name] for m in linears)
            assert model.tok_embeddings.qweight.types() == [name]
            assert not [n for n, t in model.named_parameters() if t.dim() == 2]  # no float32 matrix at all
            assert all(not isinstance(getattr(m, "decode_weight", None), torch.Tensor) for m in linears)
        assert blocks.model.products == ("integer" if kernels.int_products() == "avx512-vnni" else "float32")
        assert f32_products.model.products == "float32" and not expanded.model.quantized
        ids = blocks.tokenizer.encode("the history of computing")
        reference = greedy(expanded, ids)
        assert_same_run(greedy(blocks, ids), reference, 1e-5)
        assert_same_run(greedy(f32_products, ids), reference, 1e-6)


def file_with_type(tiny_dir, path, name):
    """A float32 GGUF file of tiny_dir whose blk.0.attn_q.weight says it is of type `name` (its
    bytes are then too few or too many for that type: the type is refused before they are read)."""
    from gguf_files import write_gguf
    write_gguf(tiny_dir, path, "F32")
    data = bytearray(path.read_bytes())
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.0.attn_q.weight")
    type_at = t.field.offset + sum(part.nbytes for part in t.field.parts[:4])  # name, dims, then the type
    data[type_at:type_at + 4] = int(gguf.GGMLQuantizationType[name]).to_bytes(4, "little")
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", REFUSED)
def test_a_type_not_computed_is_refused_in_one_line_naming_the_tensor(tiny_dirs, tmp_path, monkeypatch, capsys, name):
    from inference.cli import main
    from inference.errors import ModelError
    from inference.loading import default_model
    from inference.loading.gguf_import import import_gguf
    from inference.serving.engine import Engine

    path = file_with_type(tiny_dirs["mha"], tmp_path / "m.gguf", name)
    said = rf"m\.gguf: tensor blk\.0\.attn_q\.weight has type {name}, which Token Lab does not compute"
    with pytest.raises(ModelError, match=said):
        import_gguf(path, tmp_path / "imported", progress=False)
    assert not (tmp_path / "imported").exists()
    monkeypatch.setattr(default_model, "gguf_cache_dir", lambda p: tmp_path / "cache" / p.stem)
    with pytest.raises(ModelError, match=said) as refused:  # what the page's --model and picker open
        Engine.load(str(path), device="cpu")
    assert "\n" not in str(refused.value)
    code = main(["generate", "--model", str(path), "--device", "cpu", "--prompt", "hi", "--max-new-tokens", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1, err  # 1: a model that cannot be loaded (cli.py)
    assert err.startswith("error: ") and f"tensor blk.0.attn_q.weight has type {name}," in err
