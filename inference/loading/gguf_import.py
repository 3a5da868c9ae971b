"""GGUF import: check a GGUF file of a family we run (family_spec.py) and write beside it, in the
cache, what a Hugging Face directory holds but its weights: config.json, the tokenizer, the chat
template. The weights stay in the GGUF file, read where they lie at each load (gguf_weights.py):
no copy of them is written, in blocks or in float32.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from inference.errors import ModelError
from inference.loading.gguf_config import config_from_gguf
from inference.loading.gguf_index import read_tensors, split_parts
from inference.loading.gguf_reader import Meta, checked_reader
from inference.loading.gguf_weights import check_tensors
from inference.loading.gguf_tokenizer import write_bpe_tokenizer, write_sentencepiece_tokenizer


def import_gguf(gguf_path: str | Path, out_dir: str | Path, progress: bool = True) -> Path:
    """Check a GGUF file and write its config and tokenizer into out_dir (see the module); the
    weights are read from the file at each load. `progress` is kept for callers: nothing here
    takes long enough to show one."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise ModelError(f"{gguf_path}: no such file")
    parts = split_parts(gguf_path)
    if parts[0] != gguf_path:
        raise ModelError(f"{gguf_path.name}: open a split GGUF file by its first part, {parts[0].name}")
    tensors = read_tensors(gguf_path)  # every part's header, tables and data ranges, before gguf parses a byte
    reader = checked_reader(gguf_path)  # the metadata: a split file's first part holds it all
    meta = Meta(reader, gguf_path.name)
    tok_model = meta.require("tokenizer.ggml.model", str)
    tokens = meta.array("tokenizer.ggml.tokens", str)
    if not tokens:
        raise ModelError(f"{gguf_path.name}: tokenizer.ggml.tokens is missing or empty")
    cfg = config_from_gguf(meta, tensors, len(tokens))

    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if tok_model == "gpt2":
            write_bpe_tokenizer(meta, tmp)
        elif tok_model == "llama":
            write_sentencepiece_tokenizer(meta, tmp)
        else:
            raise ModelError(f"{gguf_path.name}: tokenizer model {tok_model!r} is not supported "
                             "(supported: gpt2, llama)")
        check_tensors(tensors, cfg, gguf_path.name)  # every name and shape, before a load
        (tmp / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2))
        tok_cfg = {"add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", tok_model == "llama", bool)),
                   "source": gguf_path.name}
        for key, tid in (("bos_token", cfg.bos_token_id), ("eos_token", cfg.eos_token_ids[0] if cfg.eos_token_ids else None)):
            if tid is not None and 0 <= tid < len(tokens):
                tok_cfg[key] = tokens[tid]
        types = meta.array("tokenizer.ggml.token_type", int, len(tokens)) or []
        # Control and user-defined tokens, but for sentencepiece's pieces of whitespace alone
        # (Gemma's runs of spaces, newlines, tabs): sentencepiece matches those inside the text.
        tok_cfg["added_tokens_decoder"] = {
            str(i): {"content": tokens[i], "special": ty == 3} for i, ty in enumerate(types)
            if ty == 3 or ty == 4 and (tok_model == "gpt2" or tokens[i].strip())}
        template = meta.get("tokenizer.chat_template", None, str)
        if template:
            tok_cfg["chat_template"] = template
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False))
        record_source(tmp, gguf_path)
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


# ---------------------------------------------------------------- the file the weights stay in

SOURCE_RECORD = "gguf_source.json"  # in an imported directory: the GGUF file it came from


def record_source(model_dir: Path, gguf_path: Path) -> None:
    """Note in model_dir the GGUF file it was imported from (a name: a file inside model_dir)."""
    path = gguf_path.name if gguf_path.parent.resolve() == model_dir.resolve() else str(gguf_path.resolve())
    (model_dir / SOURCE_RECORD).write_text(json.dumps({"path": path}))


def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF file model_dir was imported from, where it is still there: as recorded, else the
    one .gguf file inside model_dir (moved there after the import, or imported before the record
    was written); None where there is none."""
    try:
        path = model_dir / json.loads((model_dir / SOURCE_RECORD).read_text())["path"]
        if path.is_file():
            return path
    except (OSError, ValueError, KeyError, TypeError):
        pass
    inside = sorted(model_dir.glob("*.gguf"))
    return inside[0] if len(inside) == 1 else None




def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF file model_dir was imported from, where it is still there: as recorded, else the
    one .gguf file inside model_dir (moved there after the import, or imported before the record
    was written); None where there is none."""
    try:
        path = model_dir / json.loads((model_dir / SOURCE_RECORD).read_text())["path"]
        if path.is_file():
            return path
    except (OSError, ValueError, KeyError, TypeError):
        pass
    inside = sorted(p for p in model_dir.glob("*.gguf") if split_parts(p)[0] == p)
    return inside[0] if len(inside) == 1 else None
