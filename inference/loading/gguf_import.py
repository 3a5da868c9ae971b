"""GGUF import: validate a GGUF file of a family we run (llama, qwen2, qwen3, gemma3), dequantize
it and write a Hugging Face directory transformers reads as the same family.

The file is read with the gguf package, but nothing in it is trusted before it is checked:
counts, dims, types and every tensor's byte range are validated first, so a malformed file
gives a clear ModelError instead of a crash deep inside numpy.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from safetensors.torch import save_file

from inference.model.config import ModelConfig
from inference.errors import ModelError
from inference.loading.gguf_layout import check_layout
from inference.loading.progress import say

if TYPE_CHECKING:
    from inference.model.quant import QuantWeight

MAX_DIMS = 4
# What we dequantize (all through gguf's own `dequantize`).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K")

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
GGUF_BLOCK_TO_HF = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}
# Gemma 3 norms both sides of each branch; its MLP's input norm is llama.cpp's ffn_norm.
GEMMA_BLOCK_TO_HF = {**GGUF_BLOCK_TO_HF, "post_attention_norm": "post_attention_layernorm",
                     "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}


def _checked_reader(path: Path):
    """A GGUFReader that validates tensor infos before the gguf package maps any data."""
    import gguf

    file_size = path.stat().st_size

    class CheckedReader(gguf.GGUFReader):
        def _build_fields(self, offs, count):
            if int(count) > file_size // 16:  # each key/value needs well over 16 bytes
                raise ModelError(f"{path.name}: header claims {int(count)} metadata keys, "
                                 "more than the file can hold")
            return super()._build_fields(offs, count)

        def _get_field_parts(self, orig_offs, raw_type):
            # An array needs at least one byte per item: a larger count would loop for ever.
            if raw_type == gguf.GGUFValueType.ARRAY:
                count = self._get(orig_offs + 4, np.uint64)
                if len(count) != 1 or int(count[0]) > file_size - orig_offs:
                    raise ModelError(f"{path.name}: a metadata array at byte {orig_offs} claims more "
                                     "items than the file can hold")
            return super()._get_field_parts(orig_offs, raw_type)

        def _build_tensor_info(self, offs, count):
            if int(count) > file_size // 24:  # each tensor info needs at least 24 bytes
                raise ModelError(f"{path.name}: header claims {int(count)} tensors, "
                                 "more than the file can hold")
            return super()._build_tensor_info(offs, count)

        def _build_tensors(self, start_offs, fields):
            for field in fields:
                _check_tensor_info(path.name, field, start_offs, file_size)
            return super()._build_tensors(start_offs, fields)

    try:
        return CheckedReader(str(path))
    except ModelError:
        raise
    except Exception as e:  # the reader raises ValueError, IndexError, KeyError... on bad bytes
        raise ModelError(f"{path.name}: not a valid GGUF file ({type(e).__name__}: {e})") from None


def _check_tensor_info(file_name: str, field, start_offs: int, file_size: int) -> None:
    import gguf

    _, name_data, n_dims, dims, raw_type, offset = field.parts
    name = bytes(name_data).decode("utf-8", errors="replace")
    if int(n_dims[0]) > MAX_DIMS:
        raise ModelError(f"{file_name}: tensor {name} has {int(n_dims[0])} dims (at most {MAX_DIMS})")
    dims = [int(d) for d in dims]
    if any(d <= 0 for d in dims):
        raise ModelError(f"{file_name}: tensor {name} has a zero or negative dim {dims}")
    try:
        qtype = gguf.GGMLQuantizationType(int(raw_type[0]))
    except ValueError:
        raise ModelError(f"{file_name}: tensor {name} has unknown type id {int(raw_type[0])}") from None
    if qtype.name not in SUPPORTED_TYPES:
        raise ModelError(f"{file_name}: tensor {name} has type {qtype.name}, which is not supported "
                         f"(supported: {', '.join(SUPPORTED_TYPES)})")
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n_elems = math.prod(dims)
    if dims[0] % block:
        raise ModelError(f"{file_name}: tensor {name} row length {dims[0]} is not a multiple of "
                         f"the {qtype.name} block size {block}")
    end = start_offs + int(offset[0]) + n_elems * type_size // block
    if end > file_size:
        raise ModelError(f"{file_name}: tensor {name} data ends at byte {end}, past the end of "
                         f"the file ({file_size} bytes): the file is truncated or corrupt")


# ---------------------------------------------------------------- metadata

class _Meta:
    def __init__(self, reader, file_name: str):
        self.reader, self.file_name = reader, file_name

    def get(self, key: str, default=None, kind: type | None = None):
        field = self.reader.get_field(key)
        if field is None:
            return default
        try:
            value = field.contents()
        except Exception as e:
            raise ModelError(f"{self.file_name}: metadata {key} is unreadable ({e})") from None
        if kind is not None and not isinstance(value, kind):
            raise ModelError(f"{self.file_name}: metadata {key} should be {kind.__name__}, "
                             f"got {type(value).__name__}")
        return value

    def require(self, key: str, kind: type):
        value = self.get(key, kind=kind)
        if value is None:
            raise ModelError(f"{self.file_name}: required metadata {key} is missing")
        return value

    def array(self, key: str, item: type, n: int | None = None) -> list | None:
        value = self.get(key, kind=list)
        if value is None:
            return None
        if not all(isinstance(v, item) and (item is bool or not isinstance(v, bool)) for v in value):
            raise ModelError(f"{self.file_name}: metadata {key} should be an array of "
                             f"{item.__name__}")
        if n is not None and len(value) != n:
            raise ModelError(f"{self.file_name}: metadata {key} has {len(value)} entries, "
                             f"expected {n}")
        return value


def config_from_gguf(meta: _Meta, has_output: bool, vocab_size: int) -> ModelConfig:
    arch = meta.require("general.architecture", str)
    if arch not in ARCHITECTURES:
        raise ModelError(f"{meta.file_name}: architecture {arch!r} is not supported "
                         f"(supported: {', '.join(ARCHITECTURES)})")
    n_heads = meta.require(f"{arch}.attention.head_count", int)
    hidden = meta.require(f"{arch}.embedding_length", int)
    n_layers = meta.require(f"{arch}.block_count", int)
    head_dim = meta.get(f"{arch}.attention.key_length", None, int) or meta.get(
        f"{arch}.rope.dimension_count", None, int)
    rope_scaling = None
    scaling_type = meta.get(f"{arch}.rope.scaling.type", None, str)
    if scaling_type not in (None, "none"):
        if scaling_type != "linear":
            raise ModelError(f"{meta.file_name}: rope scaling {scaling_type!r} is not supported")
        rope_scaling = {"rope_type": "linear", "factor": float(meta.require(f"{arch}.rope.scaling.factor", float))}
    bos, eos = meta.get("tokenizer.ggml.bos_token_id", None, int), meta.get("tokenizer.ggml.eos_token_id", None, int)
    cfg = {
        "model_type": arch,
        "vocab_size": meta.get(f"{arch}.vocab_size", vocab_size, int),
        "hidden_size": hidden,
        "intermediate_size": meta.require(f"{arch}.feed_forward_length", int),
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": meta.get(f"{arch}.attention.head_count_kv", n_heads, int),
        "head_dim": head_dim if head_dim and head_dim != hidden // n_heads else None,
        "max_position_embeddings": meta.get(f"{arch}.context_length", 2048, int),
        "rms_norm_eps": float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5, float)),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0, float)),
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": not has_output,
        "bos_token_id": bos,
        "eos_token_id": eos,
    }
    if arch == "gemma3":  # what llama.cpp assumes of every Gemma 3 file
        cfg.update(
            model_type="gemma3_text", head_dim=head_dim or hidden // n_heads,
            # 1/sqrt(head_dim), but the 27B's (62 layers) is 1/sqrt(hidden / heads)
            query_pre_attn_scalar=hidden // n_heads if n_layers == 62 else (head_dim or hidden // n_heads),
            sliding_window=meta.require("gemma3.attention.sliding_window", int),
            sliding_window_pattern=6, rope_local_base_freq=10000.0,
            final_logit_softcapping=meta.get("gemma3.final_logit_softcapping", None, float))
    return ModelConfig.from_hf_dict(cfg)


# ---------------------------------------------------------------- tensors

def unpermute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE pairs -> rotate-half halves)."""
    rows = w.shape[0]
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])  # (heads, head_dim/2, 2, cols)
            .swapaxes(1, 2)  # (heads, 2, head_dim/2, cols)
            .reshape(w.shape))


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    if gguf_name in GGUF_TO_HF:
        return GGUF_TO_HF[gguf_name]
    blocks = GEMMA_BLOCK_TO_HF if arch == "gemma3" else GGUF_BLOCK_TO_HF
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[3] in ("weight", "bias") \
            and parts[2] in blocks:
        return f"model.layers.{parts[1]}.{blocks[parts[2]]}.{parts[3]}"
    return None


def dequantized_tensors(reader, cfg: ModelConfig, file_name: str, progress=None,
                        keep_blocks: bool = False) -> dict[str, "torch.Tensor | QuantWeight"]:
    """The file's tensors under Hugging Face names, dequantized to float32; with keep_blocks,
    each matrix whose type the kernels read in blocks (quant.BLOCK_TYPES) as a QuantWeight of
    its own bytes instead (rows permuted as the float32 copy's)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from inference.loading.checkpoint import expected_hf_shapes
    from inference.model.quant import BLOCK_TYPES, Part, QuantWeight

    expected = expected_hf_shapes(cfg)
    arch = "gemma3" if cfg.family == "gemma3_text" else cfg.family
    out = {}
    for i, t in enumerate(reader.tensors):
        say(f"importing the GGUF file: tensor {i + 1:,} of {len(reader.tensors):,}")
        name = hf_name(t.name, arch)
        if name is None or name not in expected and name != "lm_head.weight":
            raise ModelError(f"{file_name}: unexpected tensor {t.name!r} for a {arch} model")
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF lists ne0 (columns) first
        if shape != expected.get(name):
            raise ModelError(f"{file_name}: tensor {t.name} has shape {list(shape)}, the metadata "
                             f"implies {list(expected.get(name, ()))}")
        blocks = keep_blocks and len(shape) == 2 and int(t.tensor_type) in BLOCK_TYPES
        if blocks:  # (rows, bytes per row): a row's blocks stay together, so rows permute alike
            w = np.array(t.data).view(np.uint8).reshape(shape[0], -1)  # a copy of the bytes (F16's too)
        elif t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            w = np.array(t.data, dtype=np.float32).reshape(shape)  # a copy: the memmap is read-only
        else:
            w = dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32, copy=False)
        if arch == "llama" and name.endswith("q_proj.weight"):  # llama.cpp permutes llama's only
            w = unpermute_rope(w, cfg.n_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            w = unpermute_rope(w, cfg.n_kv_heads)
        elif cfg.norm_unit_offset and name.endswith("norm.weight"):
            w = w - 1  # llama.cpp stores Gemma's norms as 1 + w; Hugging Face's hold w
        out[name] = torch.from_numpy(np.ascontiguousarray(w))
        if blocks:
            out[name] = QuantWeight([Part(int(t.tensor_type), out[name])], shape[1])
        if progress is not None:
            progress.update(1)
    missing = [n for n in expected if n not in out]
    if missing:
        raise ModelError(f"{file_name}: tensor for {missing[0]} is missing"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    return out


# ---------------------------------------------------------------- tokenizer

# Pre-tokenizer regexes llama.cpp names in tokenizer.ggml.pre, as tokenizers pre-tokenizers.
GPT2_PRE = ("default", "gpt2", "smollm", "gpt-2")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _bpe_pre_tokenizer(pre: str, file_name: str):
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":  # digits one by one, then the GPT-2 regex
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("default", "gpt2", "gpt-2"):
        return byte_level
    if pre in ("llama-bpe", "llama3", "llama-v3"):
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raise ModelError(f"{file_name}: BPE pre-tokenizer {pre!r} is not supported "
                     "(supported: default, gpt2, smollm, llama-bpe)")


def write_bpe_tokenizer(meta: _Meta, out_dir: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models

    tokens = meta.array("tokenizer.ggml.tokens", str)
    types = meta.array("tokenizer.ggml.token_type", int, len(tokens)) or [1] * len(tokens)
    merges = meta.array("tokenizer.ggml.merges", str) or []
    pre = _bpe_pre_tokenizer(meta.get("tokenizer.ggml.pre", "default", str), meta.file_name)
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise ModelError(f"{meta.file_name}: malformed BPE merge {m!r}")
        pairs.append((a, b))
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs,
                               fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, ty in enumerate(types) if ty == 3])  # CONTROL
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                    for i, ty in enumerate(types) if ty == 4])  # USER_DEFINED
    tok.save(str(out_dir / "tokenizer.json"))


def write_sentencepiece_tokenizer(meta: _Meta, out_dir: Path) -> None:
    from sentencepiece import sentencepiece_model_pb2 as pb

    tokens = meta.array("tokenizer.ggml.tokens", str)
    n = len(tokens)
    scores = meta.array("tokenizer.ggml.scores", float, n) or [0.0] * n
    types = meta.array("tokenizer.ggml.token_type", int, n) or [1] * n
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.vocab_size = n
    m.trainer_spec.byte_fallback = 6 in types
    for key, attr in (("unknown", "unk_id"), ("bos", "bos_id"), ("eos", "eos_id"), ("padding", "pad_id")):
        value = meta.get(f"tokenizer.ggml.{key}_token_id", None, int)
        setattr(m.trainer_spec, attr, value if value is not None and value < n else -1)
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True, bool))
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    for piece, score, ty in zip(tokens, scores, types):
        if " " in piece and not piece.strip():
            # Gemma's pieces of spaces are stored as real spaces; sentencepiece matches pieces
            # against text whose spaces are already escaped to U+2581, so they are respelled.
            piece = "\u2581" * len(piece)
        p = m.pieces.add()
        p.piece, p.score = piece, float(score)
        p.type = ty if ty in (1, 2, 3, 4, 5, 6) else 1
    (out_dir / "tokenizer.model").write_bytes(m.SerializeToString())


# ---------------------------------------------------------------- the whole import

def import_gguf(gguf_path: str | Path, out_dir: str | Path, progress: bool = True) -> Path:
    """Validate and convert a GGUF file into a Hugging Face-style directory at out_dir."""
    from tqdm import tqdm

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise ModelError(f"{gguf_path}: no such file")
    check_layout(gguf_path)  # the header, tables and data ranges, before gguf parses a byte
    reader = _checked_reader(gguf_path)
    meta = _Meta(reader, gguf_path.name)
    tok_model = meta.require("tokenizer.ggml.model", str)
    tokens = meta.array("tokenizer.ggml.tokens", str)
    if not tokens:
        raise ModelError(f"{gguf_path.name}: tokenizer.ggml.tokens is missing or empty")
    names = {t.name for t in reader.tensors}
    cfg = config_from_gguf(meta, "output.weight" in names, len(tokens))

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
        with tqdm(total=len(reader.tensors), desc="dequantize", unit="tensor",
                  disable=not progress) as bar:
            weights = dequantized_tensors(reader, cfg, gguf_path.name, bar)
        say("importing the GGUF file: writing its float32 weights into the cache")
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        del weights
        say("importing the GGUF file: keeping its quantized blocks in the cache")
        write_blocks(reader, cfg, gguf_path.name, tmp)
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


# ---------------------------------------------------------------- the file's own blocks

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


BLOCKS_FILE = "blocks.safetensors"  # in an imported directory: the file's tensors, blocks kept


def write_blocks(reader, cfg: ModelConfig, file_name: str, out_dir: Path) -> None:
    """Write BLOCKS_FILE: the file's tensors under Hugging Face names, each matrix whose type the
    kernels read in blocks as its bytes (rows, bytes per row) uint8, its type in the metadata;
    the rest (norms, other types) float32 as the import writes them. Read back fast by
    read_blocks (parsing a GGUF file's metadata, a 262,144-token vocabulary, takes ~40 s)."""
    from inference.model.quant import QuantWeight

    tensors = dequantized_tensors(reader, cfg, file_name, keep_blocks=True)
    types = {k: v.parts[0].type for k, v in tensors.items() if isinstance(v, QuantWeight)}
    plain = {k: v.parts[0].data if isinstance(v, QuantWeight) else v for k, v in tensors.items()}
    fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=out_dir)
    os.close(fd)
    try:
        save_file(plain, tmp, metadata={"format": "pt", "gguf_types": json.dumps(types)})
        os.replace(tmp, out_dir / BLOCKS_FILE)  # whole or not at all: processes may race
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def ensure_blocks(model_dir: Path) -> Path | None:
    """model_dir's BLOCKS_FILE, written from its GGUF source where it is missing (a directory
    imported before blocks were kept); None where it has neither."""
    blocks = model_dir / BLOCKS_FILE
    if blocks.exists():
        return blocks
    source = gguf_source(model_dir)
    if source is None:
        return None
    cfg = ModelConfig.from_json(model_dir / "config.json")
    say("keeping the GGUF file's quantized blocks in the cache")
    write_blocks(_checked_reader(source), cfg, source.name, model_dir)
    return blocks


def read_blocks(blocks: Path, cfg: ModelConfig) -> dict[str, "torch.Tensor | QuantWeight"]:
    """BLOCKS_FILE's tensors: QuantWeights for the blocks, float32 tensors for the rest; every
    shape checked against the config."""
    import gguf
    from safetensors import safe_open

    from inference.loading.checkpoint import expected_hf_shapes
    from inference.model.quant import Part, QuantWeight

    expected = expected_hf_shapes(cfg)
    out = {}
    with safe_open(str(blocks), framework="pt") as f:
        types = json.loads((f.metadata() or {}).get("gguf_types", "{}"))
        for name in f.keys():
            t, shape = f.get_tensor(name), expected.get(name)
            if name in types:
                block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(types[name])]
                ok = shape is not None and len(shape) == 2 and t.shape == (shape[0], shape[1] // block * size)
                out[name] = QuantWeight([Part(types[name], t)], shape[1]) if ok else None
            else:
                ok = shape is not None and tuple(t.shape) == shape
                out[name] = t
            if not ok:
                raise ModelError(f"{blocks}: tensor {name} does not match the config")
    missing = [n for n in expected if n not in out]
    if missing:
        raise ModelError(f"{blocks}: tensor {missing[0]} is missing")
    return out
