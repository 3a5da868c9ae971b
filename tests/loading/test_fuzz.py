"""Fuzzing the model-file validation: any corruption gives a ModelError, never another exception."""

import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gguf_files import write_gguf
from inference.serving.engine import Engine
from inference.errors import ModelError
from inference.loading.gguf_import import import_gguf

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
edits = st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=8)


@pytest.fixture(scope="module")
def gguf_bytes(tiny_dirs, tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "m.gguf"
    write_gguf(tiny_dirs["mha"], path, "Q8_0")
    import gguf
    return path.read_bytes(), gguf.GGUFReader(str(path)).data_offset


def mutate(data: bytes, changes, header_bytes: int) -> bytes:
    out = bytearray(data)
    for where, value in changes:
        out[int(where * (header_bytes - 1))] = value
    return bytes(out)


@FUZZ
@given(changes=edits, cut=st.one_of(st.none(), st.floats(0, 1)))
def test_gguf_corruption_is_a_model_error(gguf_bytes, tmp_path_factory, changes, cut):
    data, header = gguf_bytes
    data = mutate(data, changes, header)  # the header: metadata, vocabulary, tensor infos
    if cut is not None:
        data = data[: int(cut * len(data))]
    d = tmp_path_factory.mktemp("g")
    (d / "m.gguf").write_bytes(data)
    try:
        import_gguf(d / "m.gguf", d / "out", progress=False)
    except ModelError:
        pass


@FUZZ
@given(changes=edits, cut=st.one_of(st.none(), st.floats(0, 1)))
def test_safetensors_corruption_is_a_model_error(tiny_dirs, tmp_path_factory, changes, cut):
    d = tmp_path_factory.mktemp("s") / "m"
    shutil.copytree(tiny_dirs["mha"], d)
    data = (d / "model.safetensors").read_bytes()
    n = int.from_bytes(data[:8], "little") + 8
    data = mutate(data, changes, n)
    if cut is not None:
        data = data[: int(cut * len(data))]
    (d / "model.safetensors").write_bytes(data)
    try:
        Engine.from_hf_dir(d)
    except ModelError:
        pass


@pytest.mark.parametrize("dims", [[], [32, 0], [32] * 5])
def test_a_tensor_of_no_dims_or_too_many_is_a_model_error(dims):
    # Found by the fuzzing above: a header byte set to 0 left a tensor with no dims (an IndexError).
    import gguf
    from inference.loading.gguf_reader import check_extent
    with pytest.raises(ModelError, match="m.gguf: tensor t has"):
        check_extent("m.gguf", "t", dims, gguf.GGMLQuantizationType.F32, 0, 1 << 20)
