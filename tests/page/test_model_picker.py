"""The model picker (app.py --model A --model B): each model loads on its first use, one that
cannot fit is refused, a run, its link and its JSONL name the model that made it, and compare
A/B across two models gives the per-step KL and the first greedy split (checked against
transformers)."""

import ui.shared.card as card_render
from helpers import plain
import json
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from inference.errors import InputError
from inference.sampling.params import SamplingParams
from inference.serving.engine import Engine
from inference.serving.models import Models
from tiny_models import make_tiny_model, train_sentencepiece
from ui.controls import Controls, shaping_values
from ui.handlers import Handlers
from ui.run_state import run_jsonl
from ui.work.saved import VERSION

REQ = SimpleNamespace(session_hash="picker")


def opener(dirs, opened):
    def open_one(spec, pool_mib):
        opened.append(spec)
        return Engine.from_hf_dir(dirs[spec], device="cpu", dtype="float32", kv_pool_mib=pool_mib or 8)
    return open_one


@pytest.fixture(scope="module")
def two(tiny_dirs):
    """Models "mha" (default) and "gqa_tied": two tiny LLaMAs with the same tokenizer."""
    opened = []
    models = Models(["mha", "gqa_tied"], opener(tiny_dirs, opened), needs=lambda spec: 1)
    models.engine()
    yield SimpleNamespace(models=models, opened=opened, h=Handlers(models.engine(), models=models))
    models.close()


def tiny_dirs_cfg(name):
    from tiny_models import BASE, CONFIGS
    return {**BASE, **CONFIGS[name]}


def test_each_model_loads_on_first_use_only(two, tiny_dirs):
    assert two.opened == ["mha"] and not two.models.loaded("gqa_tied")
    assert "not loaded yet" in two.h.picker.models_markdown()
    out = two.h.picker.choose_model("gqa_tied", "The quick", "completion", "", 5)
    assert two.opened == ["mha", "gqa_tied"]  # once, however often it is used after
    two.h.picker.choose_model("gqa_tied", "The quick", "completion", "", 5)
    assert two.opened == ["mha", "gqa_tied"]
    # The card and memory follow the chosen model: gqa_tied has 2 KV heads, a tied LM head.
    card = plain(out["model_card"])
    assert "gqa_tied" in card and "2 KV heads" in card and "tied" in card
    f, cfg = two.models.footprint("gqa_tied"), tiny_dirs_cfg("gqa_tied")
    # Every parameter at 4 bytes (the tied head is the embedding, counted once), and the RoPE
    # tables: cos and sin, (positions, head dim / 2) each.
    params = (384 * 64 + 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64) + 2 * 3 * 64 * 160 + 2 * 2 * 64 + 64)
    engine = two.models.engine("gqa_tied")
    copies = sum(m.rows_weight.numel() * 4 for m in engine.model.modules() if getattr(m, "rows_weight", None) is not None)
    assert copies in (0, 4 * (params - 384 * 64 - 2 * 2 * 64 - 64 + 384 * 64))  # every matmul's, or none
    assert f.weights_bytes == 4 * params + 2 * 4 * cfg["max_position_embeddings"] * 16 + copies
    # What a load is checked against beforehand, from the config: the weights and their copies.
    from inference.loading.load import weights_bytes
    assert weights_bytes(tiny_dirs["gqa_tied"], "cpu", "float32") == 4 * params + copies > 0
    assert f"{f.pool_bytes / 2**20:,.0f} MiB KV pool" in two.h.picker.models_markdown()


def test_a_model_that_does_not_fit_is_refused_in_one_line(tiny_dirs):
    opened = []
    models = Models(["mha", "gqa_tied"], opener(tiny_dirs, opened), needs=lambda spec: 10 * 2**30,
                    available=lambda: 4 * 2**30)
    with pytest.raises(InputError, match=r"^model gqa_tied needs 10,240 MiB .* only \d[\d,]* MiB are free"):
        models.engine("gqa_tied")
    assert opened == []  # refused before anything was read
    with pytest.raises(InputError, match="not offered here"):
        models.engine("elsewhere")


def test_a_run_of_the_second_model_is_that_models_run(two, tiny_dirs):
    c = Controls(prompt="The quick brown", model="gqa_tied", temperature=1.0, max_new_tokens=8, seed="3")
    final = list(two.h.run.generate(*c.values(), REQ))[-1]
    rec = final["record"]
    assert rec.model == "gqa_tied"
    with Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32") as alone:
        ids = alone.tokenizer.encode("The quick brown")
        expected = [e.token_id for e in alone.generate_ids(ids, SamplingParams(temperature=1.0, max_new_tokens=8, seed=3))
                    if hasattr(e, "token_id")]
    assert [s.token_id for s in rec.steps] == expected
    done = json.loads(run_jsonl(rec).splitlines()[-1])
    assert done["model"] == "gqa_tied"
    link = two.h.share.share_link(*c.values(), "http://x/", REQ)
    assert "model=gqa_tied" in link
    default_link = two.h.share.share_link(*replace(c, model="mha").values(), "http://x/", REQ)
    assert "model=" not in default_link  # the default model is not written


def test_a_link_restores_the_model_and_ignores_one_not_offered(two):
    out = two.h.share.restore(SimpleNamespace(query_params={"model": "gqa_tied"}))
    assert out["model"] == "gqa_tied" and not out["notice"]
    # Generate waits for the picker's event: a click before it would run on the linked model in
    # the mode of the page's first one (a chat turn for a model with no chat template: refused).
    assert out["generate"]["interactive"] is False
    out = two.h.share.restore(SimpleNamespace(query_params={"model": "nope"}))
    assert out["model"] == "" and "Ignored link parameter `model`" in out["notice"] and "generate" not in out
    default = two.h.share.restore(SimpleNamespace(query_params={"model": "mha"}))
    assert default["model"] == "" and "generate" not in default  # the default: nothing to wait for
    saved = two.h.work.restore_work({"v": VERSION, "controls": {"model": "gqa_tied", "prompt": "Hi"}}, None, REQ)
    assert saved["model"] == "gqa_tied" and saved["generate"]["interactive"] is False


def test_two_models_compared_along_as_text_as_transformers_says(two, tiny_dirs):
    transformers = pytest.importorskip("transformers")
    c = Controls(prompt="The quick brown", temperature=0.0, max_new_tokens=10, seed="1")
    out = two.h.experiments.compare(*c.values(), *shaping_values(temperature=0.0), "gqa_tied", REQ)
    summary, chart = out["compare_md"], out["compare_chart"]["value"]
    assert out["compare_chart"]["visible"] is True
    engine = two.models.engine("mha")
    prompt = engine.tokenizer.encode("The quick brown")
    a = [e.token_id for e in engine.generate_ids(prompt, SamplingParams(temperature=0.0, max_new_tokens=10))
         if hasattr(e, "token_id")]
    path = torch.tensor([prompt + a])
    logp = {}
    for name in ("mha", "gqa_tied"):
        ref = transformers.LlamaForCausalLM.from_pretrained(tiny_dirs[name], dtype=torch.float32).eval()
        with torch.no_grad():
            logits = ref(path).logits[0, len(prompt) - 1:-1].double()  # (steps, vocab)
        logp[name] = logits.log_softmax(-1)
    kl = (logp["mha"].exp() * (logp["mha"] - logp["gqa_tied"])).sum(-1)
    shown = chart[chart.series == "KL(A‖B), nats"]["value"].tolist()
    assert len(shown) == len(a) and max(abs(x - y) for x, y in zip(shown, kl.tolist())) < 1e-4
    under_b = chart[chart.series == "p of A's token under B"]["value"].tolist()
    expected_b = logp["gqa_tied"].exp().gather(-1, torch.tensor(a)[:, None])[:, 0].tolist()
    assert max(abs(x - y) for x, y in zip(under_b, expected_b)) < 1e-4
    parts = (logp["mha"].argmax(-1) != logp["gqa_tied"].argmax(-1)).nonzero()
    if len(parts):
        assert f"greedy choices part first at step {int(parts[0, 0])}" in summary
    else:
        assert "agree at all" in summary
    assert f"mean **{kl.mean().item():.4f} nats**" in summary


def test_models_whose_tokenizers_differ_are_not_compared_token_by_token(tmp_path, tiny_dirs):
    other = make_tiny_model(tmp_path, "mha", seed=5, sp_model=train_sentencepiece(400), vocab_size=400,
                            dir_name="other")
    dirs = {**tiny_dirs, "other": other}
    models = Models(["mha", "other"], opener(dirs, []), needs=lambda spec: 1)
    with models:
        h = Handlers(models.engine(), models=models)
        c = Controls(prompt="The quick", temperature=0.0, max_new_tokens=4, seed="1")
        out = h.experiments.compare(*c.values(), *shaping_values(temperature=0.0), "other", REQ)
        assert "their tokenizers differ" in out["compare_md"] and out["compare_chart"]["visible"] is False
        assert out["out_b"]  # B's own text is there


def test_a_single_model_page_has_no_picker_but_takes_no_model_field(tiny_engine):
    h = Handlers(tiny_engine)
    assert h.page.models.labels == [tiny_engine.describe().name] and h.picker.models_markdown() == ""
    c = Controls(prompt="The quick", temperature=0.0, max_new_tokens=3, seed="1")
    rec = list(h.run.generate(*c.values(), REQ))[-1]["record"]
    assert rec.model == tiny_engine.describe().name
    with pytest.raises(Exception, match="not offered here"):
        list(h.run.generate(*replace(c, model="other").values(), REQ))


def test_the_api_serves_every_offered_model_by_its_name(two, tiny_dirs):
    """/v1/models lists both; a completion naming the second is that model's run."""
    openai = pytest.importorskip("openai")
    from app import serve
    from ui.layout import build_ui
    demo = build_ui(two.models.engine(), two.h)
    _, url, _ = serve(demo, two.models.engine(), block=False)
    try:
        client = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["mha", "gqa_tied"]
        answer = client.completions.create(model="gqa_tied", prompt="The quick brown", max_tokens=6, seed=4, top_p=1.0,
                                           temperature=1.0, logprobs=1)
        with Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32") as alone:
            ids = alone.tokenizer.encode("The quick brown")
            steps = [e for e in alone.generate_ids(ids, SamplingParams(temperature=1.0, max_new_tokens=6, seed=4))
                     if hasattr(e, "token_id")]
        assert answer.choices[0].logprobs.tokens == [s.piece for s in steps]
        assert max(abs(lp - math.log(s.raw_prob)) for lp, s in
                   zip(answer.choices[0].logprobs.token_logprobs, steps)) < 1e-9
        with pytest.raises(openai.NotFoundError, match="serves 'mha', 'gqa_tied'"):
            client.completions.create(model="elsewhere", prompt="x", max_tokens=1)
    finally:
        demo.close()


def test_the_card_of_a_model_with_sliding_layers_says_its_window(tmp_path, sp_model_bytes):
    """Gemma 3's layers see only the last W positions but every sixth: the card says so, from
    the checkpoint's own config (transformers' layer_types), as the inside-one-token panel does."""
    import json

    from tiny_families import make_family_model
    from inference.serving.engine import Engine
    import ui.shared.view as run_render
    d, _ = make_family_model(tmp_path, "gemma3_text", sp_model_bytes)
    hf = json.loads((d / "config.json").read_text())
    full = [i for i, kind in enumerate(hf["layer_types"]) if kind == "full_attention"]
    with Engine.from_hf_dir(d, device="cpu", dtype="float32") as engine:
        card = plain(card_render.model_card(engine.describe()))
    assert (f"sliding window {hf['sliding_window']} on {len(hf['layer_types']) - len(full)} of "
            f"{len(hf['layer_types'])} layers (full attention: layer {full[0]})") in card
    assert len(full) == 1
    # Each RoPE base with its layers (issue 62: the card gave the full layers the sliding ones' θ),
    # as the checkpoint's config has them.
    rope = hf["rope_parameters"]
    full_theta, local_theta = rope["full_attention"]["rope_theta"], rope["sliding_attention"]["rope_theta"]
    assert full_theta != local_theta
    assert (f"RoPE θ {full_theta:,.0f} on the full-attention layer (linear scaling), {local_theta:,.0f} "
            "on the sliding ones") in card
    assert "their RoPE θ" not in card


def test_a_page_with_two_models_offers_each_as_a_draft_model(two):
    """Speculative decoding with another model the page offers as the drafter (the same
    tokenizer): the drafter is named, and with the run's own model as its drafter every greedy
    proposal is accepted (p = q: the coin always passes). A model not offered is refused."""
    from ui.decoding.render import drafters
    two.models.engine("gqa_tied")  # loaded: its tokenizer is known
    assert ("draft model: gqa_tied", "model:gqa_tied") in drafters(two.models, "mha")[0]
    c = Controls(prompt="The quick brown fox", max_new_tokens=8, temperature=0.0, seed="1")
    out = two.h.decoding.speculative(*c.values(), "model:gqa_tied", 1, 3)
    assert "with model:gqa_tied, 3 proposals a round: 8 tokens" in out["decoding_md"], out["decoding_md"]
    assert two.models.loaded("gqa_tied") and out["decoding_view"].count("<tr class=") == 8
    same = two.h.decoding.speculative(*c.values(), "model:mha", 1, 3)["decoding_md"]
    assert "(100%)" in same, same
    refused = two.h.decoding.speculative(*c.values(), "model:nope", 1, 3)
    assert "offers no model 'nope'" in refused["decoding_md"] and refused["decoding_view"] == ""


def test_the_drafter_list_offers_only_models_with_the_targets_tokenizer_and_says_why_not_others(tmp_path, tiny_dirs):
    """Issue 62: the list offered the target itself and a model of another tokenizer (refused once
    run). Offered: the other loaded models with the target's tokenizer; said: why each other is not."""
    from ui.decoding.render import drafters
    other = make_tiny_model(tmp_path, "mha", seed=5, sp_model=train_sentencepiece(400), vocab_size=400,
                            dir_name="other")
    models = Models(["mha", "gqa_tied", "other"], opener({**tiny_dirs, "other": other}, []), needs=lambda spec: 1)
    with models:
        models.engine()
        choices, info = drafters(models, "")  # the target: the default model, mha
        assert [v for _, v in choices] == ["prompt-lookup", "early-exit"]  # the others are not loaded yet
        assert "gqa_tied, other: not loaded yet" in info
        models.engine("gqa_tied"), models.engine("other")
        choices, info = drafters(models, "mha")
        assert [v for _, v in choices] == ["prompt-lookup", "early-exit", "model:gqa_tied"]
        assert "other: another tokenizer" in info and "mha" not in [v for _, v in choices]
        choices, _ = drafters(models, "other")  # no model shares its tokenizer
        assert [v for _, v in choices] == ["prompt-lookup", "early-exit"]
        h = Handlers(models.engine(), models=models)
        out = h.decoding.drafter_choices("gqa_tied")
        assert [v for _, v in out["choices"]] == ["prompt-lookup", "early-exit", "model:mha"]
        assert h.decoding.drafter_choices("other")["value"] == "prompt-lookup"
