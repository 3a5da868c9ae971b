"""A GGUF file's vocabulary as a tokenizer file: byte-level BPE (tokenizer.json, with the
pre-tokenizer tokenizer.ggml.pre names) or sentencepiece (tokenizer.model).

Each pre-tokenizer name llama.cpp writes for the families we run is the regex that family's own
tokenizer splits text with (its tokenizer.json's), then GPT-2's byte-level alphabet; any other
name is refused in one line: a wrong split gives other tokens, so other numbers."""

from __future__ import annotations

from pathlib import Path

from inference.errors import ModelError
from inference.loading.gguf_reader import Meta

# GPT-2's own split (tokenizers' ByteLevel regex), as llama.cpp's "gpt2"/"olmo" group splits.
GPT2_NAMES = ("default", "gpt2", "gpt-2", "olmo")
# llama.cpp's "smollm" group (SmolLM, Granite 3's "refact"): each digit alone, then GPT-2's split.
DIGITS_NAMES = ("smollm", "refact")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
REGEXES = {  # tokenizer.ggml.pre -> the split regex (the file's family)
    "llama-bpe": LLAMA3, "llama3": LLAMA3, "llama-v3": LLAMA3,  # Llama 3.x
    "dbrx": LLAMA3, "smaug-bpe": LLAMA3,  # cl100k's split: OLMo 2's files name it dbrx
    "qwen2": QWEN2, "deepseek-r1-qwen": QWEN2,  # Qwen2.5, Qwen3, DeepSeek-R1-Distill-Qwen
    "tekken": TEKKEN,  # Mistral Nemo
    "gpt-4o": GPT4O,  # Phi-4-mini
}
# llama.cpp's vocabularies whose whole pre-token, when in the vocabulary, is one token before any
# merge (as Llama 3's and Tekken's tokenizer.json say: "ignore_merges": true).
IGNORE_MERGES = ("llama-bpe", "llama3", "llama-v3", "tekken")
SUPPORTED_PRE = GPT2_NAMES + DIGITS_NAMES + tuple(REGEXES)


def bpe_pre_tokenizer(pre: str, file_name: str):
    """The tokenizers pre-tokenizer a GGUF file's tokenizer.ggml.pre names."""
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in DIGITS_NAMES:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in GPT2_NAMES:
        return byte_level
    if pre in REGEXES:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(REGEXES[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raise ModelError(f"{file_name}: BPE pre-tokenizer {pre!r} is not supported "
                     f"(supported: {', '.join(SUPPORTED_PRE)})")


def write_bpe_tokenizer(meta: Meta, out_dir: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models

    tokens = meta.array("tokenizer.ggml.tokens", str)
    types = meta.array("tokenizer.ggml.token_type", int, len(tokens)) or [1] * len(tokens)
    merges = meta.array("tokenizer.ggml.merges", str) or []
    name = meta.get("tokenizer.ggml.pre", "default", str)
    pre = bpe_pre_tokenizer(name, meta.file_name)
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise ModelError(f"{meta.file_name}: malformed BPE merge {m!r}")
        pairs.append((a, b))
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs, fuse_unk=False,
                               byte_fallback=False, ignore_merges=name in IGNORE_MERGES))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, ty in enumerate(types) if ty == 3])  # CONTROL
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                    for i, ty in enumerate(types) if ty == 4])  # USER_DEFINED
    tok.save(str(out_dir / "tokenizer.json"))


def write_sentencepiece_tokenizer(meta: Meta, out_dir: Path) -> None:
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
