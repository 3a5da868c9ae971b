"""The page audit's defects, checked at the handlers (the browser's checks are in
test_audit_browser.py). One test per defect, named after it."""

import json
from types import SimpleNamespace

import gradio as gr
import pytest

from engine_hold import fail_mid_run
from inference.errors import InputError
from inference.events import DoneEvent
from ui.controls import Controls
from tiny_models import offered, without_chat_template
from ui.handlers import Handlers
import ui.run.kv as kv_panel
import ui.run.render as run_render

REQ = SimpleNamespace(session_hash="audit")


@pytest.fixture
def h(tiny_engine):
    return Handlers(tiny_engine, top_n=5)


def controls(**kw) -> Controls:
    return Controls(**{"prompt": "The quick brown fox", "max_new_tokens": 6, "seed": "3", **kw})


@pytest.mark.parametrize("beyond", [0, 1, None])
def test_a_logit_bias_beyond_the_vocabulary_is_refused_before_the_run(h, tiny_engine, beyond):
    """begin says it in the status line, by its label, as the CLI words it; no run is queued."""
    vocab = tiny_engine.cfg.vocab_size
    tid = 999_999 if beyond is None else vocab + beyond  # the audit's ids: the size, one past, far past
    c = controls(logit_bias=f"{tid}:5")
    out = h.begin(*c.values(), REQ)
    assert out == {"status": f"⚠ Not started: Logit bias names token {tid} but the vocabulary has {vocab} tokens"}
    assert "audit" not in h._waiting
    assert list(h.generate_on_page(*c.values(), REQ)) == [{}]
    # The last id of the vocabulary is a token: it runs.
    ok = controls(logit_bias=f"{vocab - 1}:5")
    assert "record" in h.begin(*ok.values(), REQ)


@pytest.mark.parametrize("error", [InputError("the engine failed (a test's error)", field="logit_bias"),
                                   RuntimeError("out of memory\nsomewhere")])
def test_an_engine_error_mid_run_ends_the_run(h, tiny_engine, monkeypatch, caplog, error):
    """The page's run ends: its last update says the error in one line (a field by its label),
    and after_run enables Generate, disables Stop and stops the chart timer. A fault that is not
    a user's is kept in the server's log with its traceback."""
    fail_mid_run(monkeypatch, tiny_engine, error)
    c = controls()
    h.begin(*c.values(), REQ)
    with caplog.at_level("ERROR", logger="tokenlab.page"):
        updates = list(h.generate_on_page(*c.values(), REQ))
    logged = [r for r in caplog.records if r.name == "tokenlab.page"]
    assert (len(logged) == 1 and logged[0].exc_info[1] is error) if isinstance(error, RuntimeError) else not logged
    line = ("Logit bias: the engine failed (a test's error)" if isinstance(error, InputError)
            else "RuntimeError: out of memory somewhere")
    rec = updates[-1]["record"]
    assert updates[-1]["status"] == f"⚠ The run failed: {line}" and len(rec.steps) == 1 and rec.done is None
    after = h.after_run(rec, [], REQ)
    assert after["status"] == f"⚠ The run failed: {line}"
    assert after["generate"]["interactive"] is True and after["stop_button"]["interactive"] is False
    assert after["live"].active is False
    assert not h.registry.running("audit")  # the job is let go: the next run may start


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

    assert dims("mha") in kv_panel.kv_formula(picker.info) and dims("mha") != dims("gqa_tied")
    for label in ("gqa_tied", "mha"):
        out = picker.choose_model(label, "The quick", "completion", "", 5)
        assert dims(label) in out["kv_text"], out["kv_text"]


def test_a_not_started_status_goes_when_another_model_is_picked(picker):
    """Chat mode on the model without a template is refused in the status line; picking a
    model clears that message (Generate checks again); a run's own status stays."""
    c = controls(model="plain", mode="chat")
    refused = picker.begin(*c.values(), REQ)["status"]
    assert refused == "⚠ Not started: this model has no chat template; use completion mode"
    assert picker.choose_model("mha", "The quick", "chat", "", 5, [], refused)["status"] == ""
    ended = "Run ended: 6 tokens · stopped at max new tokens"
    assert "status" not in picker.choose_model("gqa_tied", "The quick", "chat", "", 5, [], ended)


def test_chat_mode_is_offered_only_for_a_model_with_a_chat_template(picker):
    """Picking the model without a template sets the mode to completion and keeps chat from being
    picked (the radio is not interactive, its note says why); a model with one offers it again."""
    plain = picker.choose_model("plain", "The quick", "chat", "", 5)["mode"]
    assert plain["value"] == "completion" and plain["interactive"] is False and "no chat template" in plain["info"]
    with_template = picker.choose_model("gqa_tied", "The quick", "completion", "", 5)["mode"]
    assert with_template["interactive"] is True and "value" not in with_template
    assert [picker.view(m).info.chat for m in ("plain", "gqa_tied", "mha")] == [False, True, True]


def test_the_model_list_says_its_weights_count_the_second_copies(picker):
    """The list's weights are the parameters as loaded plus the linear layers' second copies
    (counted here from the model's own modules); where there are copies it says so, so that
    it does not seem to disagree with the card's parameters × bytes."""
    from inference.serving.models import Footprint
    engine = picker.view("mha").engine
    copies = {id(c): c for m in engine.model.modules()
              for c in (getattr(m, "decode_weight", None), getattr(m, "rows_weight", None)) if c is not None}
    f = picker.models.footprint("mha")
    assert f.copies_bytes == sum(c.numel() * c.element_size() for c in copies.values())
    mib = 2**20
    listed = picker.models_markdown()
    assert f"**mha** (default): {f.weights_bytes / mib:,.0f} MiB of weights" in listed
    assert ("second copies" in listed) == (f.copies_bytes > 0)
    # SmolLM2-135M at float32 with oneDNN's copies: 513 MiB as loaded, 517 MiB of copies.
    said = run_render.weights_text(Footprint(1030 * mib, 4 * mib, 517 * mib))
    assert said.startswith("1,030 MiB of weights in memory: 513 MiB as loaded and 517 MiB of their second copies")
    assert run_render.weights_text(Footprint(513 * mib, 4 * mib)) == "513 MiB of weights"


def test_a_number_box_label_says_what_its_zero_does_as_its_help_does():
    """Each number box's label says what its off value does, in the words its help uses (DRY
    range: 0 searches the whole context, so "0 = all", not "0 = default")."""
    import re
    from inference.sampling.settings import SETTINGS
    from ui.widgets import setting_control
    boxes = {s.name: (s, setting_control(s, s.default, 256)) for s in SETTINGS if s.control == "number"}
    assert boxes["dry_penalty_last_n"][1].label == "DRY range (0 = all)"
    assert boxes["top_k"][1].label == "Top-k (0 = off)"
    for s, box in boxes.values():
        said = re.fullmatch(re.escape(s.label) + r" \((.+)\)", box.label).group(1)
        assert said in s.help, (box.label, s.help)


def test_an_engine_that_refuses_the_run_at_once_ends_it_on_the_page(h, tiny_engine, monkeypatch):
    """A server's engine raises from run itself (it is no generator): the page's run
    ends as for an error mid-run, not with an error that leaves the page running."""
    def refusing(*args, **kwargs):
        raise InputError("a branch in front of a server cannot use presence or frequency penalties")
    monkeypatch.setattr(tiny_engine, "run", refusing)
    c = controls()
    h.begin(*c.values(), REQ)
    updates = list(h.generate_on_page(*c.values(), REQ))
    rec = updates[-1]["record"]
    line = "⚠ The run failed: a branch in front of a server cannot use presence or frequency penalties"
    assert updates[-1]["status"] == line and h.after_run(rec, [], REQ)["status"] == line


def test_an_empty_chat_message_is_refused_on_the_page_and_answered_by_the_engine(h, tiny_engine):
    """The API answers an empty user message (OpenAI and vLLM do: the template's turn around it
    is the prompt); on the page an empty box is a slip, refused before the run."""
    out = h.begin(*controls(prompt="  ", mode="chat").values(), REQ)
    assert out == {"status": "⚠ Not started: the message is empty: type what you say to the model"}
    assert tiny_engine.prompt_ids("", chat=True) == [i for i in tiny_engine.prompt_ids("Hi", chat=True)
                                                     if i not in tiny_engine.tokenizer.encode_continuation("Hi")]
    with pytest.raises(InputError, match="the prompt is empty"):
        tiny_engine.prompt_ids(" ")


def test_an_engine_error_mid_way_through_many_samples_ends_them_in_the_panel(h, tiny_engine, monkeypatch, caplog):
    """The samples' engine fails after a few samples have ended: the panel's last update says how
    far they got and the error in one line, the caller gets it as a one-line error (the page's
    toast), the fault goes to the server's log, and the visitor's job is let go."""
    real = tiny_engine.generate_many

    def failing(*args, **kwargs):
        ended = 0
        for k, ev in real(*args, **kwargs):
            yield k, ev
            ended += isinstance(ev, DoneEvent)
            if ended == 2:
                raise RuntimeError("out of memory\nsomewhere")
    monkeypatch.setattr(tiny_engine, "generate_many", failing)
    updates = []
    with caplog.at_level("ERROR", logger="tokenlab.page"), pytest.raises(gr.Error) as raised:
        for out in h.samples(*controls(max_new_tokens=3).values(), 6, REQ):
            updates.append(out)
    assert raised.value.message == "The samples failed: RuntimeError: out of memory somewhere"
    assert updates[-1]["samples_md"].startswith("⚠ The samples failed after 2 of 6 had ended (")
    assert updates[-1]["samples_md"].endswith("tokens): RuntimeError: out of memory somewhere")
    assert [r.exc_info[1].args for r in caplog.records if r.name == "tokenlab.page"] == [("out of memory\nsomewhere",)]
    assert not h.registry.running("audit")
