"""Helpers shared by test modules that are not about the browser (those are in browser.py)."""

from __future__ import annotations

from pathlib import Path


def files_under(*dirs) -> list[str]:
    """Every file under the directories (those that exist), sorted: what a page left on disk."""
    return sorted(str(p) for d in dirs if Path(d).exists() for p in Path(d).rglob("*") if p.is_file())


def hf_reference(model_dir, **options):
    """transformers' LlamaForCausalLM on a checkpoint, float32, in eval mode: the independent
    reference our model is checked against. options go to from_pretrained (attn_implementation,
    say); the test module is skipped where transformers is not installed."""
    import pytest
    import torch
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **options).eval()


def page_run(h, request, **kw):
    """A run through the page's handlers as /generate runs it (a short seeded run of "The quick
    brown fox", `kw` replacing some controls): its last record."""
    from ui.controls import Controls
    c = Controls(**{"prompt": "The quick brown fox", "max_new_tokens": 8, "seed": "3", **kw})
    return list(h.run.generate(*c.values(), request))[-1]["record"]
