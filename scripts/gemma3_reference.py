"""Writes tests/data/gemma3_270m_reference.json: Gemma 3 270M (the Q4_K_M GGUF of its PyPI
packages) read by transformers' own GGUF loader, none of Token Lab's model code involved: each
prompt's token ids, step-0 top-10 (softmax of the logits) and greedy path. The test compares Token
Lab against this file, so that CI does not read the 270M model through transformers every run.

    python scripts/gemma3_reference.py      # a few minutes; needs transformers, accelerate, gguf
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "tests" / "data" / "gemma3_270m_reference.json"
PROMPTS = ["Water boils at a temperature of", "Once upon a time, a small robot",
           "import numpy as np\n\ndef mean(xs):\n   ", "Les montagnes   les plus hautes\n\nsont",
           "1, 1, 2, 3, 5, 8,", "東京は日本の", "今天天气真"]
GREEDY_TOKENS = 16


def main() -> int:
    import gguf
    import torch
    import transformers
    from inference.loading.default_model import GEMMA_GGUF, gemma_model_dir

    d = gemma_model_dir()
    # transformers parses the file's metadata (262k token strings) for the tokenizer, the config
    # and the weights alike: one read-only reader serves all three.
    gguf.GGUFReader = functools.lru_cache(maxsize=1)(gguf.GGUFReader)
    tok = transformers.AutoTokenizer.from_pretrained(str(d), gguf_file=GEMMA_GGUF)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(d), gguf_file=GEMMA_GGUF,
                                                            dtype=torch.float32).eval()
    cases = []
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        with torch.inference_mode():
            out = ref.generate(torch.tensor([ids]), max_new_tokens=GREEDY_TOKENS, do_sample=False,
                               output_scores=True, return_dict_in_generate=True)
        probs, top = out.scores[0][0].float().softmax(-1).topk(10)
        cases.append({"prompt": prompt, "prompt_ids": ids,
                      "top10": [{"id": i, "prob": p} for i, p in zip(top.tolist(), probs.tolist())],
                      "greedy_ids": out.sequences[0, len(ids):].tolist()})  # may end early, at <eos>
    OUT.write_text(json.dumps({"model": f"Gemma 3 270M ({GEMMA_GGUF})", "transformers": transformers.__version__,
                               "torch": torch.__version__, "greedy_tokens": GREEDY_TOKENS, "cases": cases},
                              ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
