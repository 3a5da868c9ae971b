"""Which products a quantized model runs, as every door says it: the engine's description, the
model card, the CLI's summary line (and --products choosing them); the API's /v1/models reads the
same description (api/routes.py)."""

import json

import pytest

from gguf_files import write_gguf
from inference.cli import main
from inference.loading.gguf_import import import_gguf
from inference.model import kernels
from inference.model.products import BOUND
from inference.serving.engine import Engine
from ui.shared.card import blocks_text

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C compiler here: no blocks, no products")


@pytest.fixture(scope="module")
def q4_dir(tiny_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("q4")
    write_gguf(tiny_dirs["mha"], root / "m.gguf", "Q4_0")
    return import_gguf(root / "m.gguf", root / "imported", progress=False)


@pytest.mark.parametrize("products", ["integer", "float32"])
def test_the_engine_the_card_and_the_cli_name_the_products(q4_dir, capsys, products):
    with Engine.from_hf_dir(q4_dir, products=products) as engine:
        info = engine.describe()
        assert engine.model.products == products
        assert info.products["path"] == products
        assert (info.products["bound"] == BOUND) == (products == "integer")
        card = blocks_text(info)
        assert ("products in integers" in card) == (products == "integer")
        assert ("activations and sums float32" in card) == (products == "float32")
    assert main(["generate", "--model", str(q4_dir), "--prompt", "The quick", "--max-new-tokens", "2",
                 "--temperature", "0", "--jsonl", "--products", products]) == 0
    done = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert done["products"]["path"] == products
    assert (done["products"]["bound"] == BOUND) == (products == "integer")


def test_a_float_model_names_no_products(tiny_dirs, capsys):
    with Engine.from_hf_dir(tiny_dirs["mha"]) as engine:
        assert engine.describe().products is None
    assert main(["generate", "--model", str(tiny_dirs["mha"]), "--prompt", "The quick", "--max-new-tokens", "1",
                 "--jsonl"]) == 0
    assert "products" not in json.loads(capsys.readouterr().out.splitlines()[-1])


def test_auto_is_integer_where_the_cpu_has_avx512_vnni():
    import torch
    from inference.model.products import resolve_products
    cpu = torch.device("cpu")
    assert resolve_products("auto", cpu) == ("integer" if kernels.int_products() == "avx512-vnni" else "float32")
    assert resolve_products("float32", cpu) == "float32" and resolve_products("integer", cpu) == "integer"
    from inference.errors import InputError
    with pytest.raises(InputError, match="unknown products 'fast'"):
        resolve_products("fast", cpu)
