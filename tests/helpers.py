"""Helpers shared by test modules that are not about the browser (those are in browser.py)."""

from __future__ import annotations

from pathlib import Path


def files_under(*dirs) -> list[str]:
    """Every file under the directories (those that exist), sorted: what a page left on disk."""
    return sorted(str(p) for d in dirs if Path(d).exists() for p in Path(d).rglob("*") if p.is_file())


def hf_weights(model_dir) -> dict:
    """from_pretrained's options for a model directory: none for a checkpoint; for a model read
    from its GGUF file (the shipped ones keep no float32 copy in the cache), that file, which
    transformers dequantizes itself."""
    from pathlib import Path
    from inference.loading.gguf_import import gguf_source
    d = Path(model_dir)
    if any((d / n).exists() for n in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")):
        return {}
    source = gguf_source(d)
    return {} if source is None else {"gguf_file": str(source)}


def hf_reference(model_dir, **options):
    """transformers' LlamaForCausalLM on a checkpoint (or its GGUF file: hf_weights), float32, in
    eval mode: the independent reference our model is checked against. options go to
    from_pretrained (attn_implementation, say); the test module is skipped where transformers is
    not installed."""
    import pytest
    import torch
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                         **hf_weights(model_dir), **options).eval()


def page_run(h, request, **kw):
    """A run through the page's handlers as /generate runs it (a short seeded run of "The quick
    brown fox", `kw` replacing some controls): its last record."""
    from ui.controls import Controls
    c = Controls(**{"prompt": "The quick brown fox", "max_new_tokens": 8, "seed": "3", **kw})
    return list(h.run.generate(*c.values(), request))[-1]["record"]


def hf_beams(hf, ids: list[int], width: int, penalty: float, max_new: int, eos) -> tuple[list, list]:
    """transformers' beam search (generate with num_beams, early_stopping=False) on the prompt
    ids: (each returned beam's generated tokens, their scores), best first. eos empty: no token
    ends a beam (the model's own end-of-sequence ids are set aside)."""
    import torch
    if not eos:
        hf.generation_config.eos_token_id = None
    out = hf.generate(torch.tensor([ids]), num_beams=width, do_sample=False, length_penalty=penalty,
                      num_return_sequences=width, max_new_tokens=max_new, eos_token_id=sorted(eos) or None,
                      pad_token_id=sorted(eos)[0] if eos else 0, early_stopping=False, output_scores=True,
                      return_dict_in_generate=True, top_k=None, top_p=None, temperature=None)
    lengths = (out.beam_indices >= 0).sum(dim=1).tolist()  # the tokens each beam generated
    seqs = [out.sequences[i, len(ids):len(ids) + n].tolist() for i, n in enumerate(lengths)]
    return seqs, out.sequences_scores.tolist()


def plain(text: str) -> str:
    """Page HTML or Markdown without the glossary's marks (ui/glossary: a term wrapped in a
    focusable span with its definition), so that a test reads the words as the page prints them."""
    import re
    return re.sub(r"<span class='tl-term'[^>]*>([^<]*)</span>", r"\1", text)
