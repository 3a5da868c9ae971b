"""The model picker on a page offering several models, at the handlers: the KV-cache formula, the
status line and the chat mode follow the model picked, and the model list counts the weights'
second copies (the browser's checks are in test_model_picker_browser.py)."""

import ui.run.render as picker_render
import json
from types import SimpleNamespace

import pytest

from ui.controls import Controls
from tiny_models import offered, without_chat_template
from ui.handlers import Handlers
import ui.shared.kv as kv_panel
import ui.shared.view as run_render

REQ = SimpleNamespace(session_hash="model-picker")


def controls(**kw) -> Controls:
    return Controls(**{"prompt": "The quick brown fox", "max_new_tokens": 6, "seed": "3", **kw})


@pytest.fixture(scope="module")
def picker(tiny_dirs, tmp_path_factory):
    """A page offering "mha" (the default), "gqa_tied" and "plain" (gqa_tied without a chat template)."""
    plain = without_chat_template(tiny_dirs["gqa_tied"], tmp_path_factory.mktemp("plain") / "plain")
    models = offered({"mha": tiny_dirs["mha"], "gqa_tied": tiny_dirs["gqa_tied"], "plain": plain})
    yield Handlers(models.engine(), models=models)
    models.close()


def test_the_kv_formula_follows_the_model_picked_before_any_run(picker, tiny_dirs):
    """The formula's numbers are the picked model's, as its config.json gives them: 2 × layers ×
    KV heads × head dim × 4 bytes (float32). "mha" has 4 KV heads, gqa_tied 2."""
    def dims(label):
        cfg = json.loads((tiny_dirs[label] / "config.json").read_text())
        head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
        return f"2 × {cfg['num_hidden_layers']} × {cfg['num_key_value_heads']} × {head_dim} × 4 "

    assert dims("mha") in kv_panel.kv_formula(picker.page.info) and dims("mha") != dims("gqa_tied")
    for label in ("gqa_tied", "mha"):
        out = picker.picker.choose_model(label, "The quick", "completion", "", 5)
        assert dims(label) in out["kv_text"], out["kv_text"]


def test_a_not_started_status_goes_when_another_model_is_picked(picker):
    """Chat mode on the model without a template is refused in the status line; picking a
    model clears that message (Generate checks again); a run's own status stays."""
    c = controls(model="plain", mode="chat")
    refused = picker.run.begin(*c.values(), REQ)["status"]
    assert refused == "⚠ Not started: this model has no chat template; use completion mode"
    assert picker.picker.choose_model("mha", "The quick", "chat", "", 5, [], refused)["status"] == ""
    ended = "Run ended: 6 tokens · stopped at max new tokens"
    assert "status" not in picker.picker.choose_model("gqa_tied", "The quick", "chat", "", 5, [], ended)


def test_chat_mode_is_offered_only_for_a_model_with_a_chat_template(picker):
    """Picking the model without a template sets the mode to completion and keeps chat from being
    picked (the radio is not interactive, its note says why); a model with one offers it again."""
    plain = picker.picker.choose_model("plain", "The quick", "chat", "", 5)["mode"]
    assert plain["value"] == "completion" and plain["interactive"] is False and "no chat template" in plain["info"]
    with_template = picker.picker.choose_model("gqa_tied", "The quick", "completion", "", 5)["mode"]
    assert with_template["interactive"] is True and "value" not in with_template
    assert [picker.page.view(m).info.chat for m in ("plain", "gqa_tied", "mha")] == [False, True, True]


def test_the_model_list_says_its_weights_count_the_second_copies(picker):
    """The list's weights are the parameters as loaded plus the linear layers' second copies
    (counted here from the model's own modules); where there are copies it says so, so that
    it does not seem to disagree with the card's parameters × bytes."""
    from inference.serving.models import Footprint
    engine = picker.page.view("mha").engine
    copies = {id(c): c for m in engine.model.modules()
              for c in (getattr(m, "decode_weight", None), getattr(m, "rows_weight", None)) if c is not None}
    f = picker.page.models.footprint("mha")
    assert f.copies_bytes == sum(c.numel() * c.element_size() for c in copies.values())
    mib = 2**20
    listed = picker.picker.models_markdown()
    assert f"**mha** (default): {f.weights_bytes / mib:,.0f} MiB of weights" in listed
    assert ("second copies" in listed) == (f.copies_bytes > 0)
    # SmolLM2-135M at float32 with oneDNN's copies: 513 MiB as loaded, 517 MiB of copies.
    said = picker_render.weights_text(Footprint(1030 * mib, 4 * mib, 517 * mib))
    assert said.startswith("1,030 MiB of weights in memory: 513 MiB as loaded and 517 MiB of their second copies")
    assert picker_render.weights_text(Footprint(513 * mib, 4 * mib)) == "513 MiB of weights"


def test_a_model_with_a_chat_template_starts_in_chat_mode_with_a_chat_example(picker, tiny_dirs):
    """An instruction given as a completion prompt rambles. A model with a chat
    template starts in chat mode with an instruction; one without stays a completion; choosing
    the other mode swaps in its example (in the browser: test_ui_page's chat test)."""
    from ui.controls import CHAT_PROMPT, DEFAULT_PROMPT
    chat, plain = picker.page.view("gqa_tied").defaults, picker.page.view("plain").defaults
    assert (chat.mode, chat.prompt) == ("chat", CHAT_PROMPT)
    assert (plain.mode, plain.prompt) == ("completion", DEFAULT_PROMPT)
    assert picker.page.defaults.mode == "chat"  # the page's first model ("mha") has one
    # The chat example runs as a chat turn: its ids are the template's, not the bare text's.
    engine = picker.page.view("gqa_tied").engine
    assert len(engine.prompt_ids(CHAT_PROMPT, True, "", [])) > len(engine.prompt_ids(CHAT_PROMPT, False, "", []))


def test_a_link_names_its_mode_and_one_without_it_is_a_completion(picker):
    """Links always write the mode (the default is now a model's own); an older link, which
    named only chat, still opens as the completion it was."""
    from urllib.parse import parse_qs, urlsplit
    from ui.share import share_js
    for mode in ("chat", "completion"):  # the default's too
        link = picker.share.share_link(*controls(mode=mode).values(), "http://x/", REQ)
        assert parse_qs(urlsplit(link).query)["mode"] == [mode]
    assert "always.includes(name)" in share_js(picker.page.defaults)  # the browser's copy builds the same
    old = picker.share.restore(SimpleNamespace(query_params={"prompt": "Once upon a time"}))
    assert old["mode"] == "completion" and old["prompt"] == "Once upon a time"
    assert picker.share.restore(SimpleNamespace(query_params={"prompt": "Hi", "mode": "chat"}))["mode"] == "chat"


def test_a_model_loading_on_its_first_use_is_said_and_generate_waits(tiny_dirs):
    """Picking a model not loaded yet says it loads, with Generate off, before the
    load; once loaded, Generate is back, and the status line under the run on view names the
    model that made it and both contexts (the card, the context line and the next run are the
    picked model's)."""
    from helpers import page_run
    models = offered({"mha": tiny_dirs["mha"], "gqa_tied": tiny_dirs["gqa_tied"]})
    try:
        h = Handlers(models.engine(), models=models)
        rec = page_run(h, REQ, max_new_tokens=2)
        assert rec.model == "mha"
        steps = h.picker.pick_model("gqa_tied", "The quick", "completion", "", 5, [], "Run ended", rec, REQ)
        first = next(steps)
        assert not models.loaded("gqa_tied")  # said before the load
        assert first["status"].startswith("Loading **gqa_tied**") and first["generate"]["interactive"] is False
        last = next(steps)
        assert models.loaded("gqa_tied") and last["generate"]["interactive"] is True
        ctx = {n: json.loads((tiny_dirs[n] / "config.json").read_text())["max_position_embeddings"]
               for n in ("mha", "gqa_tied")}
        assert f"made by **mha** (a {ctx['mha']:,}-token context)" in last["status"]
        assert f"The next run uses **gqa_tied** (a {ctx['gqa_tied']:,}-token context)" in last["status"]
        assert f"of {ctx['gqa_tied']:,}" in last["context_count"]
        # Loaded now: no loading line; back on the run's own model, its status is its own.
        again = list(h.picker.pick_model("mha", "The quick", "completion", "", 5, [], last["status"], rec, REQ))
        assert len(again) == 1 and again[0]["status"].startswith("Run ended") and "made by" not in again[0]["status"]
    finally:
        models.close()


def test_a_first_load_says_each_stage_and_its_time_until_it_ends(tiny_dirs):
    """While a model loads, the status line says what the load does now, as the loaders say it
    (inference.loading.progress), and how long it has taken; a load refused says why, once."""
    import threading
    from inference.errors import InputError
    from inference.loading.progress import say
    from inference.serving.engine import Engine
    from inference.serving.models import Models
    release, reached = threading.Event(), threading.Event()

    def open_held(spec, pool_mib):
        if spec == "refused":
            raise InputError("model refused needs 9,999 MiB for its weights")
        say("fetching the held model with pip")
        reached.set()
        assert release.wait(60)
        return Engine.from_hf_dir(tiny_dirs[spec], device="cpu", dtype="float32", kv_pool_mib=pool_mib or 8)

    models = Models(["mha", "gqa_tied", "refused"], open_held, needs=lambda spec: 1)
    try:
        release.set()
        h = Handlers(models.engine("mha"), models=models)
        release.clear()
        steps = h.picker.pick_model("gqa_tied", "The quick", "completion", "", 5, [], "", None, REQ)
        assert next(steps)["status"].startswith("Loading **gqa_tied**")
        assert reached.wait(60)
        said = next(steps)["status"]
        while "fetching the held model" not in said:  # a tick may come before the stage is said
            said = next(steps)["status"]
        assert "Now: fetching the held model with pip (" in said and " s so far)" in said
        release.set()
        last = list(steps)[-1]
        assert models.loaded("gqa_tied") and last["generate"]["interactive"] is True and "model_card" in last
        refused = list(h.picker.pick_model("refused", "The quick", "completion", "", 5, [], "", None, REQ))
        assert "9,999 MiB" in refused[-1]["model_md"] and "model_card" not in refused[-1]
        assert refused[-1]["generate"]["interactive"] is True and not models.loaded("refused")
    finally:
        release.set()
        models.close()
