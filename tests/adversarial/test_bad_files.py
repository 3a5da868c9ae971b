"""Issue 59, finding 9: bad files and names. A truncated GGUF file took 52 s to be refused (the
gguf package parsed its whole metadata first); its header, tables and data ranges are now checked
against the file's size (gguf_index.py) before gguf parses any of it. An empty --model
loaded the default model, /dev/zero was "no such model", and a JSON-schema file that is not JSON
was quoted back line and all."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from inference.errors import ModelError

SECRET = "api_key = hunter2-very-secret-value"


def big_gguf(path, vocab: int = 50_000, rows: int = 16_384):
    """A GGUF file shaped like a real one: a vocabulary of `vocab` strings in its metadata and a
    4 MiB tensor after it; returns where the tensor data starts."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list([f"tok{i}" for i in range(vocab)])
    w.add_tensor("token_embd.weight", np.zeros((rows, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return gguf.GGUFReader(str(path)).data_offset


def test_a_truncated_gguf_is_refused_from_its_header_before_gguf_parses_it(tmp_path, monkeypatch):
    from inference.loading import gguf_import

    path = tmp_path / "cut.gguf"
    start = big_gguf(path)
    data = path.read_bytes()
    path.write_bytes(data[: start + (len(data) - start) // 2])  # half the tensor data is gone
    parsed = []
    monkeypatch.setattr(gguf_import, "checked_reader", lambda p: parsed.append(p))  # gguf's parse: never
    with pytest.raises(ModelError, match=r"token_embd\.weight data ends at byte .* past the end of"):
        gguf_import.import_gguf(path, tmp_path / "out", progress=False)
    assert not parsed and not (tmp_path / "out").exists()


def test_a_header_that_claims_more_than_the_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from inference.loading import gguf_import

    path = tmp_path / "lying.gguf"
    big_gguf(path)
    data = bytearray(path.read_bytes())
    data[8:16] = (10 ** 9).to_bytes(8, "little")  # a billion tensors
    path.write_bytes(bytes(data))
    parsed = []
    monkeypatch.setattr(gguf_import, "checked_reader", lambda p: parsed.append(p))
    with pytest.raises(ModelError, match="1000000000 tensors, more than the file.s .* bytes can hold"):
        gguf_import.import_gguf(path, tmp_path / "out", progress=False)
    assert not parsed


def test_an_empty_model_name_is_refused_at_every_command(capsys):
    import app
    from inference.cli import main
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", "", "--prompt", "Hi"])
    assert e.value.code == 2 and "--model: is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        app.parse_args(["--model", ""], environ={})
    assert e.value.code == 2 and "--model: is empty" in capsys.readouterr().err


def test_a_device_is_not_a_model_file(capsys):
    from inference.cli import main
    assert main(["generate", "--model", "/dev/zero", "--prompt", "Hi"]) == 1
    assert capsys.readouterr().err.strip() == ("error: /dev/zero: not a model file (expected a model directory "
                                               "or a .gguf file)")


@pytest.mark.parametrize("flag, text, kept", [
    ("--json-schema", SECRET + "\n{}", None),
    ("--grammar", "root ::= secret_rule_name_that_is_long", "secret_rule_"),
])
def test_a_constraint_file_that_is_wrong_is_quoted_back_at_most_a_few_characters(tmp_path, capsys, flag, text, kept):
    from inference.cli import main
    (tmp_path / "c").write_text(text)
    assert main(["generate", "--prompt", "Hi", flag, str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "hunter2" not in err and "secret_rule_name" not in err, err
    if kept:
        assert f'"{kept}…"' in err  # a name cut to 12 characters, to find it by


def test_the_page_quotes_none_of_a_constraint(h):
    from ui.run.constrain import check_text
    said = check_text("grammar", "root ::= secret_rule_name_that_is_long")
    assert said.startswith("⚠ Constraint is not a valid grammar") and "secret" not in said
    c_said = check_text("json_schema", SECRET)
    assert "hunter2" not in c_said and "line 1, column 1" in c_said
