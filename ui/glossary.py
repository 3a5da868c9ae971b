"""The page's glossary: every term it prints that is not everyday English (a label, a column
header, a unit, an abbreviation), with a short definition. One source: the model card, the bars,
the lesson, the statistics and the labels take their definitions from here (the sampling
settings' from their schema entry, inference/sampling/settings.py, whose help line the controls
show too); tests/page/test_glossary.py walks what the page prints and fails on a term without one.

On the page a term is <span class="tl-term">, focusable, described (aria-describedby) by its
definition in the page's hidden list (definitions_html), which a screen reader reads; the
definition shows on hover, tap and keyboard focus (assets/glossary.js). Pure functions, no Gradio."""

from __future__ import annotations

import html
import re
from functools import lru_cache

from inference.sampling.settings import SETTINGS

# term -> its short definition. A term matches its own spelling, its plural (+s), and the other
# spellings SPELLINGS gives it; an acronym (capitals past its first letter: KV, RoPE) as written, any
# other term in any case (Top-p, top-p).
TERMS: dict[str, str] = {
    # --- tokens and text
    "token": "A piece of text from the model's fixed vocabulary: a word, part of a word, a character or a byte. "
             "The model reads and writes numbers standing for tokens.",
    "tokenizer": "What cuts text into tokens and turns each into its id (and back).",
    "tokenization": "The text cut into tokens, each with its id.",
    "id": "A token's number in the vocabulary: what the model actually reads.",
    "vocab": "Vocabulary: every token the model knows; it gives one probability to each of them per step.",
    "vocabulary": "Every token the model knows; it gives one probability to each of them per step.",
    "byte token": "A token holding one byte of a character the vocabulary has no entry for; several make the character.",
    "control token": "A token that marks structure (start of text, a chat turn), never typed text.",
    "<bos>": "Beginning of sequence: the control token that marks the start of a text.",
    "BOS": "Beginning of sequence: the control token that marks the start of a text.",
    "EOS": "End of sequence: the token with which the model ends its answer.",
    "end-of-sequence": "The token with which the model ends its answer; the run stops there.",
    "UTF-8": "The usual way of writing characters as bytes: 1 byte for ASCII, up to 4 for others (3 for 好).",
    "prompt": "The text the model continues (or, in chat mode, the message it answers).",
    "context": "Every token the model reads to predict the next one: the prompt and what it wrote so far.",
    "context window": "The most tokens the model can read at once: prompt plus new tokens.",
    "chat template": "The model's own format for a conversation: markers around each message, which it was trained on.",
    "system prompt": "Instructions put before the conversation in the chat template.",
    "completion": "Completion mode: the prompt is a text the model continues as it is.",
    "chat mode": "The prompt is a message, wrapped in the model's chat template; the model answers it.",
    "completion mode": "The prompt is a text the model continues as it is.",
    "stop strings": "Texts that end the run as soon as the output contains one.",
    "max new tokens": "The most tokens a run generates.",
    # --- probabilities
    "logit": "The model's raw score for a token before softmax; higher means more likely.",
    "softmax": "Turns logits into probabilities: e^logit divided by the sum of e^logit over all tokens.",
    "p": "Probability: from 0 to 1, how likely the token is.",
    "log p": "The natural logarithm of a probability: 0 for p = 1, more negative for rarer tokens.",
    "raw": "Raw probability: the model's own distribution, before any sampling setting changed it.",
    "final": "Final probability: the distribution actually sampled from, after every sampling setting.",
    "distribution": "The probabilities the model gives every token of the vocabulary; they sum to 1.",
    "candidates": "The most likely next tokens at a step, with their probabilities.",
    "rank": "A token's place among the candidates by the model's raw probability: 1 is the most likely.",
    "entropy": "How spread out a distribution is, in nats: 0 when one token is certain, higher when many are likely.",
    "nats": "The unit of entropy and surprise with the natural logarithm (1 nat = 1.44 bits).",
    "bits": "A unit of surprise with the base-2 logarithm (1 bit = 0.69 nats).",
    "surprisal": "How surprising a token is: −log p; rare tokens are surprising.",
    "perplexity": "e to the mean surprisal of a text's tokens: as if the model chose among this many equally likely "
                  "tokens each step; lower means the text was more expected.",
    "KL": "Kullback-Leibler divergence, KL(A‖B): how far B's distribution is from A's, in nats (0: the same).",
    "fork step": "The first step where a precision's own greedy text writes another token than float32's.",
    "top-1 agreement": "Whether a precision's most likely next token is float32's at a step (and at how many steps).",
    "quantization lens": "The model at several precisions on one prompt: how far each one's next-token "
                         "distribution is from float32's, step by step.",
    "bytes per token": "The bytes of weights one decode step reads: every matrix as stored, an embedding row, "
                       "the norms.",
    "dequantized": "Quantized blocks turned back into float32 numbers (each weight its block's scale times its "
                   "stored integer): what the quantized model computes with.",
    "masked mass": "The raw probability the constraint removed at a step: the share of the model's choice it forbade.",
    "free distribution": "What a constrained run would have sampled from at a step without its constraint: the "
                         "same stages, the same step, the constraint left out.",
    "free p": "A token's probability in the free distribution: the same stages at the same step without the constraint.",
    "renormalisation": "Dividing what is left of a distribution by its sum, so it sums to 1 again: a constraint's "
                       "allowed tokens share the probability it removed.",
    "chi-square": "A test of whether observed counts fit expected ones; a small p-value says they do not.",
    "p-value": "The chance of counts at least this far from the expected ones if the model's probabilities were right.",
    "degrees of freedom": "The number of groups compared in the chi-square test, minus one.",
    # --- sampling
    "sampling": "Choosing the next token at random according to the final distribution.",
    "greedy": "Always taking the most likely token (temperature 0).",
    "seed": "The number that starts the random choices: the same seed, model and settings give the same text.",
    "sampler order": "The order in which the sampling stages change the distribution.",
    "stage": "One step of sampling that changes the distribution (a penalty, a cutoff, the constraint...).",
    "constraint": "A JSON schema, regular expression or grammar: only text it allows can be sampled.",
    "JSON schema": "A description of the JSON allowed: its fields and their types.",
    "JSON": "A text format for data: {\"name\": \"Ada\", \"age\": 36}.",
    "regular expression": "A pattern text must match, e.g. [0-9]{4} for four digits.",
    "EBNF": "A way of writing a grammar: rules of what text may follow what.",
    "grammar": "Rules of what text may follow what (here in xgrammar's EBNF).",
    "forbidden": "The constraint does not allow this token at this step.",
    "logit bias": "A number added to a token's logit; -100 or less bans it.",
    "beam search": "Keeps the few most likely whole sequences at each step instead of one sampled token.",
    "beams": "The sequences beam search keeps at each step.",
    "length penalty": "In beam search, how a finished beam's score depends on its length.",
    "speculative decoding": "A cheap drafter proposes tokens and the model checks them all in one pass; the "
                            "text has the model's own distribution, made in fewer passes.",
    "drafter": "What proposes tokens for speculative decoding: n-grams of the context, the model's first layers, "
               "or a smaller model.",
    "prompt lookup": "A drafter that proposes the tokens that followed the same last tokens earlier in the context.",
    "early exit": "A drafter that runs only the model's first layers.",
    "acceptance rate": "The share of proposed tokens the model kept.",
    "branch": "A run continued from a token you clicked, with the tokens before it given.",
    "given": "Tokens a run reads after the prompt as if it had made them (a branch's, an edit's).",
    "loom": "A tree of continuations: from one point of a text, every likely next token as a branch, and so on, "
            "each with the model's probability.",
    "node": "One token of the loom's tree: its place is its path of tokens from the point the tree grows from.",
    "leaf": "A node of the loom's tree that was not grown further (its depth reached, an end of sequence, or "
            "the budget spent); a click continues it as a run, unless it ends the text.",
    "node budget": "The most nodes the loom's tree may hold; past it the most probable paths are kept.",
    "threshold p": "In the loom, a token becomes a node only if the model gives it at least this probability "
                   "(and, with a top k too, it is among the top k).",
    "path p": "The probability of a node's whole path from the point the tree grows from: the product of "
              "its tokens' probabilities.",
    "greedy path": "The path of each step's most likely token: what greedy decoding writes.",
    "not grown": "The probability of the tokens the loom left out at a node (the other tokens): the picture "
                 "never shows more than was explored.",
    "replay": "The step's distribution recomputed under other settings, without sampling.",
    "A/B": "Two runs of the same prompt and seed, A with the page's settings and B with others.",
    # --- the model
    "model card": "The model's shape and size, and where and how it runs.",
    "parameters": "The model's learned numbers (its weights).",
    "weights": "The model's learned numbers, its parameters.",
    "layers": "The model's blocks of the same shape, each with its own weights; the vectors pass through them in turn.",
    "hidden": "Hidden size: the length of the vector the model keeps for each token.",
    "heads": "Attention heads: parallel attentions, each looking at the context in its own way.",
    "KV heads": "Key/value heads: the heads whose keys and values are computed and cached; several query heads "
                "can share one (grouped-query attention), which makes the KV cache smaller.",
    "key/value heads": "The heads whose keys and values are computed and cached; several query heads can share one.",
    "query heads": "The attention heads that each ask, for their position, which earlier positions matter.",
    "head dim": "The length of each head's query, key and value vectors.",
    "FFN": "Feed-forward network: the part of each layer that transforms each position on its own (the MLP).",
    "MLP": "Multi-layer perceptron: the feed-forward part of each layer.",
    "KV": "Key/value: the keys and values attention computes for each position (see KV cache).",
    "LM": "Language model.",
    "DRY": "\"Don't repeat yourself\": a penalty on the tokens that would extend a repetition of the context.",
    "XTC": "\"Exclude top choices\": now and then removes the most likely tokens but one, for variety.",
    "μ": "Mirostat's running threshold of surprise: tokens more surprising than μ are cut; it moves each step.",
    "τ": "Mirostat's target surprise per token, in bits.",
    "η": "Mirostat's learning rate: how fast μ follows the surprise.",
    "σ": "Standard deviation: how spread out the logits are (top-nσ keeps those within n of them of the top).",
    "GPT-2": "OpenAI's 2019 language model, the one most tutorials count with.",
    "LayerNorm": "Layer normalisation: recentres and rescales a vector (GPT-2's norm; RMSNorm only rescales).",
    "SXM": "The H100's server-module form, its fastest version.",
    "GQA": "Grouped-query attention: several query heads share one key/value head.",
    "grouped-query attention": "Several query heads share one key/value head, which makes the KV cache smaller.",
    "attention": "How each position gathers information from the positions before it, weighted by relevance.",
    "keys and values": "In attention, each position's key (matched against the queries of later positions) and "
                       "value (what it passes on, weighted by that match).",
    "causal mask": "Hides the future: a position attends only to itself and the positions before it.",
    "sliding window": "A layer that sees only the last W positions instead of all of them.",
    "full attention": "A layer that sees every earlier position.",
    "RoPE": "Rotary position embedding: turns queries and keys by angles that grow with the position, so "
            "attention depends on the distance between tokens.",
    "YaRN": "A way of stretching RoPE's frequencies so a model reads past the context it was trained on.",
    "LongRoPE": "Phi-3.5's and Phi-4-mini's RoPE scaling: each frequency divided by a factor of its own, one set "
                "within the context the model was trained on (computed here) and one past it (not computed).",
    "RoPE θ": "RoPE's base: the larger θ, the slower the rotations, the longer the distances it tells apart.",
    "θ": "RoPE's base: the larger θ, the slower the rotations, the longer the distances it tells apart.",
    "embedding": "The matrix that turns each token id into a vector of numbers (one row per token).",
    "LM head": "The last matrix: turns the final vector into one logit per vocabulary token.",
    "tied": "Tied LM head: the same matrix as the embedding, read again, so no extra memory.",
    "untied": "Untied LM head: a matrix of its own, not the embedding's.",
    "RMSNorm": "Root-mean-square norm: rescales a vector to a steady size before a sub-layer.",
    "pre-norm": "The norm comes before each sub-layer (attention, MLP), not after it.",
    "residual": "The residual stream: each sub-layer's result is added to its input, which flows on.",
    "SwiGLU": "The gated MLP of LLaMA-style models: silu(gate) × up, then down.",
    "GeGLU": "The gated MLP of Gemma: gelu(gate) × up, then down.",
    "logit lens": "Each layer's vector put through the LM head: what the model would predict if it stopped there.",
    "LLaMA-7B": "Meta's 7-billion-parameter model of 2023, a common yardstick.",
    "H100": "NVIDIA's data-centre GPU of 2022.",
    "GPU": "Graphics processor: many small cores, fast at the matrix products a model is made of.",
    "CPU": "The computer's main processor.",
    "cuda": "Running on an NVIDIA GPU.",
    "float32": "32-bit floating-point numbers: 4 bytes a value, exact enough for every probability shown.",
    "bfloat16": "16-bit floating-point numbers with float32's range: 2 bytes a value, less precise.",
    "float16": "16-bit floating-point numbers: 2 bytes a value.",
    "dtype": "The number format values are stored in (float32, bfloat16...).",
    "GGUF": "llama.cpp's model file format, which can store weights in quantized blocks.",
    "quantized": "Stored with fewer bits per weight (4 to 8) in small blocks that share a scale.",
    "blocks": "Small groups of values stored together (quantized weights share a scale per block; the KV cache "
              "is allocated a block of positions at a time).",
    "Q4_K": "A GGUF block format: about 4.5 bits per weight.",
    "Q6_K": "A GGUF block format: about 6.6 bits per weight.",
    "Q8_0": "A GGUF block format: about 8.5 bits per weight.",
    "F32": "A GGUF tensor stored as plain 32-bit floats (norm weights, small tensors): not quantized.",
    "F16": "A GGUF tensor stored as 16-bit floats: not quantized.",
    "BF16": "A GGUF tensor stored as bfloat16: not quantized.",
    "Q4_0": "A GGUF block format: about 4.5 bits per weight (one scale per 32 weights).",
    "Q4_1": "A GGUF block format: about 5 bits per weight (a scale and a minimum per 32 weights).",
    "Q5_0": "A GGUF block format: about 5.5 bits per weight.",
    "Q5_1": "A GGUF block format: about 6 bits per weight.",
    "Q5_K": "A GGUF block format: about 5.5 bits per weight.",
    "Q2_K": "A GGUF block format: about 2.6 bits per weight (2-bit weights, a 4-bit scale and minimum per 16).",
    "Q3_K": "A GGUF block format: about 3.4 bits per weight.",
    "IQ4_NL": "A GGUF block format: 4-bit indices into a fixed table of 16 non-uniform values, about 4.5 bits per weight.",
    "IQ4_XS": "A GGUF block format: IQ4_NL's non-uniform values with 6-bit scales per 32 weights, about 4.25 bits per weight.",
    "activations": "The vectors computed while the model runs (as opposed to its stored weights).",
    # --- cost
    "prefill": "Reading the whole prompt in one pass; it ends with the first new token.",
    "decode": "Making one new token per pass, after the prefill.",
    "TTFT": "Time to first token: from the start of the run to the first new token (mostly the prefill).",
    "time to first token": "From the start of the run to the first new token (mostly the prefill).",
    "tok/s": "Tokens per second: how many new tokens the decoding makes a second.",
    "tokens/s": "Tokens per second: how many new tokens the decoding makes a second.",
    "latency": "How long one step takes.",
    "ms": "Milliseconds: thousandths of a second.",
    "FLOPs": "Floating-point operations (a multiply-add counts 2): the arithmetic a step takes. k, M, G: "
             "thousand, million, billion.",
    "FLOP/s": "Floating-point operations per second: how fast a machine computes.",
    "B/s": "Bytes per second: how fast memory is read.",
    "bytes": "The unit of memory: 8 bits.",
    "KiB": "Kibibyte: 1,024 bytes.",
    "MiB": "Mebibyte: 1,048,576 bytes (1,024 KiB).",
    "GiB": "Gibibyte: 1,024 MiB.",
    "KV cache": "The keys and values of every earlier position, kept so each new token does not recompute them.",
    "paged": "The KV cache is allocated in fixed blocks of positions, shared out among the runs like pages.",
    "pool": "All the KV-cache blocks the server has, shared by every run.",
    "roofline": "A machine's limits: compute-bound by its peak FLOP/s, or memory-bound by its bandwidth.",
    "arithmetic intensity": "FLOPs per byte read: low means the pass waits on memory, high on arithmetic.",
    "bandwidth": "How many bytes a second the memory delivers.",
    "ridge": "The arithmetic intensity where the roofline's memory slope meets its compute roof.",
    "compute-bound": "Limited by how fast the machine computes.",
    "bandwidth-bound": "Limited by how fast memory delivers the weights.",
    # --- units and words of this page
    "step": "One pass of the model that makes one token.",
    "positions": "Places in the sequence, one per token.",
    "batch": "Several runs computed together in one pass.",
}

# Other spellings of a term (a regular expression each), besides its own and its plural.
SPELLINGS: dict[str, tuple[str, ...]] = {
    "FLOPs": (r"[kMGTP]?FLOPs?\b(?!/s)",),
    "FLOP/s": (r"[kMGTP]?FLOP/s",),
    "B/s": (r"[kMGTP]?B/s",),
    "KV cache": (r"KV[- ]cache",),
    "KV heads": (r"KV heads?",),
    "id": (r"(?<![\w-])ids?(?![\w-])",),
    "p": (r"(?<![\w.-])p(?=\s*(?:=|\(|$|[,;:)]|\s(?:sampled|of|entering|penalised)))",),
    "log p": (r"log p(?!\w)",),
    "leaf": (r"lea(?:f|ves)\b",),
    "path p": (r"path p(?!\w)",),
    "raw": (r"raw(?= (?:p|probability|model|logits?|distribution|entropy|rank|mass))",),
    "final": (r"final(?= (?:p|probability|distribution|\(sampled))",),
    "θ": (r"θ(?!\w)",),
    "RoPE θ": (r"RoPE θ",),
    "<bos>": (r"<bos>",),
    "hidden": (r"hidden(?= \d| size)",),
    "heads": (r"(?<!KV )(?<!query )heads?(?= [/·(]| share)",),
    "tied": (r"(?<!un)tied(?= LM)",),
    "untied": (r"untied(?= LM)",),
    "step": (r"(?<![\w-])steps?(?![\w-])",),
    "ms": (r"(?<=\d )ms\b",),
    "bytes": (r"(?<=\d )bytes?\b",),
    "stage": (r"stages?\b",),
    "decode": (r"decod(?:e|ing)(?![\w-])",),
    "prefill": (r"prefill(?:s|ed)?\b",),
    "quantized": (r"quantiz(?:ed|ation)\b",),
    "renormalisation": (r"renormali[sz](?:es?|ed|ing|ation)\b",),
    "layers": (r"layers?(?![\w-])",),
    "cuda": (r"cuda(?::\d+)?\b",),
    "CPU": (r"cpu\b",),
    "GPU": (r"gpu\b",),
}


def _surface(term: str) -> str:
    """The pattern a term is found by in text: its spellings, longest first."""
    forms = [re.escape(term) + ("s?" if term[-1:].isalpha() and not term.endswith("s") else "")]
    forms += SPELLINGS.get(term, ())
    body = "|".join(f"(?:{f})" for f in forms)
    edge_l = r"(?<![\w/-])" if term[:1].isalnum() else ""
    edge_r = r"(?![\w-])" if term[-1:].isalnum() or term.endswith("s") else ""
    return f"{edge_l}(?:{body}){edge_r}"


def setting_terms() -> dict[str, str]:
    """Each sampling setting's label with its help line: their one source is the settings schema."""
    return {s.label: f"{s.help[:1].upper()}{s.help[1:]}." for s in SETTINGS}


@lru_cache(maxsize=1)
def entries() -> dict[str, str]:
    """Every term the page defines: the settings' and TERMS (a term in both keeps TERMS')."""
    return {**setting_terms(), **TERMS}


# What every spelling of a term contains, lowercase: a text without it cannot hold the term (the
# term itself where SPELLINGS adds none; a spelling is a regular expression).
HINTS = {"FLOPs": "flop", "FLOP/s": "flop/s", "B/s": "b/s", "KV cache": "kv", "KV heads": "kv head", "θ": "θ",
         "RoPE θ": "rope θ", "heads": "head", "tied": "tied", "untied": "untied", "step": "step", "bytes": "byte",
         "stage": "stage", "decode": "decod", "prefill": "prefill", "quantized": "quantiz", "layers": "layer",
         "renormalisation": "renormali"}


def _hint(term: str) -> str:
    return HINTS.get(term, term.lower().removesuffix("s") if len(term) > 3 else term.lower())


@lru_cache(maxsize=512)
def _pattern(terms: tuple[str, ...]) -> re.Pattern:
    """One pattern over these terms, longest first (KV cache before KV), each in a group of its own."""
    parts = []
    for t in terms:  # an acronym (capitals past its first letter) as written; other terms in any case
        flags = "" if any(c.isupper() for c in t[1:]) else "(?i:"
        parts.append(f"({flags}{_surface(t)}{')' if flags else ''})")
    return re.compile("|".join(parts))


@lru_cache(maxsize=1)
def _terms() -> tuple[tuple[str, str], ...]:
    """(term, its hint), the longest terms first."""
    return tuple((t, _hint(t)) for t in sorted(entries(), key=len, reverse=True))


def _matcher(text: str | None = None) -> tuple[re.Pattern, tuple[str, ...]]:
    """The pattern of the terms `text` may hold (all of them for None), and those terms in its
    groups' order: one pass over a short list of hints first, as the bars are marked at every
    step of a run."""
    low = None if text is None else text.lower()
    terms = tuple(t for t, hint in _terms() if low is None or hint in low)
    return _pattern(terms), terms


def lookup(text: str) -> str | None:
    """The term a printed word or phrase is (as the page finds it in text), or None."""
    pattern, terms = _matcher(text)
    if not terms:
        return None
    m = pattern.fullmatch(text.strip())
    if m is None:
        return None
    return terms[m.lastindex - 1]


def define(term: str) -> str:
    """A term's definition (KeyError for a term without one)."""
    return entries()[term]


def slug(term: str) -> str:
    """The id of a term's definition in the page's hidden list."""
    return "tl-def-" + re.sub(r"[^a-z0-9]+", "-", term.lower().replace("θ", "theta").replace("/", "-per-")
                              .replace("<", "").replace(">", "")).strip("-") + f"-{sum(map(ord, term)) % 997}"


def term_html(shown: str, term: str | None = None) -> str:
    """`shown` (HTML) marked as the term (its own text's term when None): focusable, described by
    its definition."""
    term = term or lookup(re.sub(r"<[^>]+>", "", html.unescape(shown)))
    if term is None:
        raise KeyError(f"no glossary entry for {shown!r}")
    define(term)
    return (f"<span class='tl-term' tabindex='0' data-term='{html.escape(term, quote=True)}' "
            f"aria-describedby='{slug(term)}'>{shown}</span>")


# Elements whose text is not the page's own words (token pieces, quoted text, code, numbers in
# sub, scripts), is a link (its panel's label is marked there), or is marked already; and the
# lesson's list of chapters (the chapter's own text marks its terms): text inside is never marked.
SKIP = ("code", "q", "sub", "script", "style", "svg", "textarea", "a")
SKIP_CLASSES = ("tl-term", "tl-tk", "tl-tok", "tl-pop", "tl-chip", "tl-c", "lesson-piece", "lesson-steps")
_TAG = re.compile(r"<(/?)([a-zA-Z0-9]+)([^>]*)>")
_CLASS = re.compile(r"""class=['"]([^'"]*)['"]""")


def gloss(text: str, seen: set | None = None) -> str:
    """HTML (or Markdown with inline HTML) with the first occurrence of each term in its own words
    marked (term_html); `seen` carries the terms already marked across several calls (one block
    of the page). Text inside SKIP elements, token chips and existing terms is left as it is."""
    seen = set() if seen is None else seen
    out, depth_skip, at = [], [], 0
    stack: list[str] = []

    def mark(chunk: str) -> str:
        if not chunk.strip():
            return chunk
        pattern, terms = _matcher(chunk)
        if not terms:
            return chunk

        def one(m: re.Match) -> str:
            term = terms[m.lastindex - 1]
            if term in seen:
                return m.group(0)
            seen.add(term)
            return term_html(m.group(0), term)
        return pattern.sub(one, chunk)

    for m in _TAG.finditer(text):
        chunk = text[at:m.start()]
        out.append(chunk if depth_skip else mark(chunk))
        closing, name, attrs = m.group(1) == "/", m.group(2).lower(), m.group(3)
        classes = _CLASS.search(attrs)
        skipping = name in SKIP or bool(classes and set(classes.group(1).split()) & set(SKIP_CLASSES))
        if closing:
            if stack and stack[-1] == name:
                stack.pop()
                if depth_skip and depth_skip[-1] == len(stack):
                    depth_skip.pop()
        elif not attrs.rstrip().endswith("/") and name not in ("br", "img", "input", "hr", "wbr", "meta", "path",
                                                                  "circle", "rect", "polyline", "line"):
            if skipping and not depth_skip:
                depth_skip.append(len(stack))
            stack.append(name)
        out.append(m.group(0))
        at = m.end()
    rest = text[at:]
    out.append(rest if depth_skip else mark(rest))
    return "".join(out)


def definitions_html() -> str:
    """The page's hidden list of definitions: what each term's aria-describedby names, and what
    the tooltip shows (assets/glossary.js)."""
    return "<div class='tl-glossary' hidden>" + "".join(
        f"<span id='{slug(t)}' data-term='{html.escape(t, quote=True)}'>{html.escape(d)}</span>"
        for t, d in entries().items()) + "</div>"
