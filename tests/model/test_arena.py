"""The weights' arena (inference/model/arena.py): one block of memory, 2 MiB-aligned and advised
into huge pages, holding a loaded model's weights in the order a step reads them."""

import sys
from pathlib import Path

import pytest
import torch

from inference.model.arena import ALIGN, HUGE_PAGE, Arena, stored_size
from inference.model.layers import Linear, RMSNorm
from inference.serving.engine import Engine


def test_put_copies_each_tensor_in_turn_on_cache_lines_from_a_huge_page_boundary():
    a, b, c = torch.randn(3, 5), torch.arange(7, dtype=torch.int64), torch.randn(4, 6).t()  # c: not contiguous
    arena = Arena(stored_size(a) + stored_size(b) + stored_size(c))
    assert arena.address % HUGE_PAGE == 0
    pa, pb, pc = arena.put(a), arena.put(b), arena.put(c)
    for src, copy in ((a, pa), (b, pb), (c, pc)):
        assert copy.dtype == src.dtype and copy.shape == src.shape and copy.is_contiguous()
        assert torch.equal(copy, src) and copy.data_ptr() != src.data_ptr() and copy.data_ptr() % ALIGN == 0
    assert pa.data_ptr() == arena.address
    assert pb.data_ptr() == arena.address + stored_size(a) and pc.data_ptr() == pb.data_ptr() + stored_size(b)
    a.zero_()
    assert pa.abs().sum() > 0  # a copy, not a view of the source
    with pytest.raises(ValueError, match="bytes left"):
        arena.put(torch.zeros(1))


def _mapping_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds address (Linux's smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError("no mapping holds the address")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge pages are asked of Linux")
def test_the_arena_is_advised_into_huge_pages():
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[never]" in thp.read_text():
        pytest.skip("this kernel has no transparent huge pages")
    arena = Arena(3 * HUGE_PAGE)
    assert arena.huge_pages and "hg" in _mapping_flags(arena.address)  # MADV_HUGEPAGE on its range
    arena.put(torch.ones(HUGE_PAGE // 4))
    assert "hg" in _mapping_flags(arena.address + HUGE_PAGE)


def _step_order(model) -> list[torch.Tensor]:
    """The tensors a decode step reads, in its order: each layer's, then the final norm and head."""
    out = []
    for layer in model.layers:
        for m in (layer.attention_norm, layer.attention.wqkv, layer.attention.wo, layer.ffn_norm,
                  layer.feed_forward.w13, layer.feed_forward.w2):
            out += [p.data for p in m.qweight.parts] if getattr(m, "qweight", None) is not None else [m.weight]
    head = model.output
    return out + [model.norm.weight] + ([p.data for p in head.qweight.parts] if head.qweight is not None else [head.weight])


@pytest.mark.parametrize("blocks", [False, True])
def test_a_loaded_models_weights_lie_in_one_arena_in_the_steps_order(tiny_dirs, tmp_path, blocks):
    """Float32 weights and a GGUF file's Q8_0 blocks alike: every tensor the step reads in one
    storage, at rising addresses in the order the step reads them; the tied embedding shares the
    LM head's copy; the model's numbers are unchanged (the float32 safetensors checkpoint and
    its loaded copy give the same logits)."""
    from inference.loading.gguf_import import import_gguf
    from gguf_files import write_gguf

    src = tiny_dirs["gqa_tied"]
    if blocks:
        write_gguf(src, tmp_path / "m.gguf", "Q8_0")
        src = import_gguf(tmp_path / "m.gguf", tmp_path / "imported", progress=False)
    with Engine.from_hf_dir(src, "cpu", "auto" if blocks else "float32") as engine:
        model = engine.model
        assert model.quantized == blocks
        tensors = _step_order(model)
        storage = tensors[0].untyped_storage().data_ptr()
        assert all(t.untyped_storage().data_ptr() == storage for t in tensors)
        addresses = [t.data_ptr() for t in tensors]
        assert addresses == sorted(addresses) and len(set(addresses)) == len(addresses)
        assert all(m.weight.untyped_storage().data_ptr() == storage
                   for m in model.modules() if isinstance(m, (Linear, RMSNorm)) and m.weight is not None)
        if blocks:
            assert model.tok_embeddings.qweight is model.output.qweight
        else:
            assert model.tok_embeddings.weight.data_ptr() == model.output.weight.data_ptr()
            from transformers import AutoModelForCausalLM
            ref = AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float32).eval()
            ids = torch.tensor([[3, 17, 5, 42, 9]])
            with torch.no_grad():
                want = ref(ids).logits[0, -1]
                cache = model.new_cache(16)
                got = model(ids, cache, 0)[0]
            assert torch.allclose(got, want, atol=1e-4, rtol=0)


def test_a_load_frees_each_tensor_it_was_given(tiny_dirs):
    """from_state_dict empties the dict it is given and keeps none of its tensors: each is freed
    once copied into the arena (a load holds the weights once, and one tensor more)."""
    import gc
    import weakref

    from inference.loading.checkpoint import read_hf_weights, to_model_names
    from inference.model.config import ModelConfig
    from inference.model.transformer import Transformer

    cfg = ModelConfig.from_json(tiny_dirs["mha"] / "config.json")
    state = to_model_names(cfg, read_hf_weights(tiny_dirs["mha"], cfg), torch.float32)
    given = [weakref.ref(t) for t in state.values()]
    model = Transformer.from_state_dict(cfg, state, torch.device("cpu"), torch.float32)
    gc.collect()
    assert state == {} and all(ref() is None for ref in given)
    assert model.layers[0].attention.wqkv.weight.untyped_storage().data_ptr() == \
        model.output.weight.untyped_storage().data_ptr()  # in the arena
