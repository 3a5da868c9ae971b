"""The quantization lens on the page (ui/lens): the numbers it shows are those computed
independently (transformers' float32 logits on the original weights and on gguf's dequantized
blocks, in float64 here; transformers' own greedy runs; the bytes counted from the safetensors
file), a shared page's bound on precisions per visitor and a model too large are refused in one
line, the lens is an engine job of the page's admission, and a GGUF source says it is quantized
already."""

import html
import math
import re
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from inference.lenses.precisions import fork_step
from quant_reference import greedy, hf_model, log_probs_along
from server.limits import ENGINE, Limits
from ui.handlers import Handlers

PROMPT = "The quick brown"
STEPS = 6
REQ = SimpleNamespace(session_hash="lens")


def last(h, *args, request=REQ) -> dict:
    """Every output the lens yields, merged: the last value of each."""
    out = {}
    for o in h.lens.lens(*args, request=request):
        out.update(o)
    return out


def table(view: str) -> dict[str, list[str]]:
    """The summary table's cells by precision."""
    rows = re.findall(r"<tr data-precision='([^']+)'>(.*?)</tr>", view)
    return {p: [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for p, row in rows}


def per_step(view: str) -> dict[tuple[str, str], list[str]]:
    """(precision, metric) -> its value at each step, from the table of every step's numbers."""
    out: dict[tuple[str, str], list[str]] = {}
    for p, metric, value in re.findall(r"data-precision='([^']+)' data-metric='(\w+)'>([^<]*)<", view):
        out.setdefault((p, metric), []).append(value)
    return out


@pytest.fixture(scope="module")
def shared(tiny_engine):
    """The page's handlers on the tiny engine with a shared page's limits (2 precisions a visitor)."""
    return Handlers(tiny_engine, limits=Limits.shared())


def test_the_pages_numbers_are_transformers_on_the_dequantized_weights(shared, tiny_engine, tiny_dirs):
    out = last(shared, "", PROMPT, ["q8_0", "q4_0"], STEPS, False)
    view = out["lens_view"]
    rows, steps = table(view), per_step(view)
    assert list(rows) == ["float32", "q8_0", "q4_0"], out["lens_md"]
    model_dir = tiny_dirs["gqa_tied"]
    ids = tiny_engine.prompt_ids(PROMPT)
    f32 = hf_model(model_dir, None)
    ref_tokens = greedy(f32, ids, STEPS)
    n = int(re.search(r"greedy text of (\d+) tokens?", re.sub(r"<[^>]+>", "", out["lens_md"])).group(1))
    assert 1 <= n <= STEPS
    text = ref_tokens[:n]
    lp = log_probs_along(f32, ids, text)  # (steps, vocab), float64
    hf = load_file(str(model_dir / "model.safetensors"))
    cfg = tiny_engine.cfg
    values = sum(t.numel() for k, t in hf.items()  # every matrix; a tied head is the embedding's, once
                 if t.dim() == 2 and not (cfg.tie_word_embeddings and k == "lm_head.weight"))
    norms = (2 * cfg.n_layers + 1) * cfg.hidden_size * 4
    forks = 0
    for name, per_block in (("float32", None), ("q8_0", 34), ("q4_0", 18)):
        ref = f32 if name == "float32" else hf_model(model_dir, name)
        lq = log_probs_along(ref, ids, text)
        kl = (lp.exp() * (lp - lq)).sum(-1)  # KL(float32 ‖ precision) at each step
        top = lp.argmax(-1)
        ranks = (lq > lq.gather(-1, top[:, None])).sum(-1) + 1
        ppl = math.exp(-float(lq.gather(-1, torch.tensor(text)[:, None]).mean()))
        theirs = greedy(ref, ids, STEPS)
        bytes_per_token = (values + cfg.hidden_size) * 4 + norms if per_block is None else \
            values // 32 * per_block + cfg.hidden_size // 32 * per_block + norms
        cells = rows[name]  # bytes per token, tok/s, perplexity, mean KL, max KL, top-1 agreement, fork step
        assert cells[0] == f"{bytes_per_token:,}"
        assert float(cells[2]) == pytest.approx(ppl, rel=1e-3, abs=1e-3)
        assert float(cells[3]) == pytest.approx(float(kl.clamp(min=0).mean()), rel=1e-2, abs=2e-5)
        assert float(cells[4]) == pytest.approx(float(kl.clamp(min=0).max()), rel=1e-2, abs=2e-5)
        agree = lq.argmax(-1) == top
        assert cells[5] == f"{int(agree.sum())} of {n}"
        want_fork = fork_step(ref_tokens, theirs)
        assert cells[6] == ("never" if want_fork is None else str(want_fork))
        forks += want_fork is not None
        if name == "float32":
            continue
        shown_kl = [float(v) for v in steps[(name, "kl")]]
        assert len(shown_kl) == n
        for s in range(n):
            assert abs(shown_kl[s] - float(kl[s])) <= 1e-5 + 2e-3 * abs(float(kl[s])), (name, s)
        assert steps[(name, "rank")] == [str(int(r)) for r in ranks]
        assert steps[(name, "top1")] == ["✓" if a else "✗" for a in agree.tolist()]
        if want_fork is not None:  # the fork marked on the charts, and both texts from there
            assert f"class='tl-fork' data-precision='{name}'" in view
            assert f"forks at step {want_fork}" in re.sub(r"<[^>]+>", "", view)
    assert forks >= 1  # 4 bits fork these random weights' texts: the fork's checks check something
    # Each step of the table with float32's token there (transformers' greedy text), so a rank reads against a word.
    shown = [html.unescape(t) for t in re.findall(r"data-metric='token'><code class='tl-piece'>([^<]*)<", view)]
    from ui.format import token_label
    assert shown == [token_label(shared.page.engine.tokenizer.piece(t)) for t in ref_tokens[:len(shown)]]
    assert len(shown) == len(ref_tokens) == STEPS
    assert "Quantization lens" in out["lens_md"] and "⚠" not in out["lens_md"]  # a safetensors source: no note


def test_a_shared_page_bounds_the_precisions_per_visitor_and_says_so(shared):
    out = last(shared, "", PROMPT, ["q8_0", "q5_0", "q4_0"], STEPS, False)
    assert out["lens_view"] == "" and "\n" not in out["lens_md"]
    assert "at most 2 precisions besides float32 per visitor" in out["lens_md"] and "3 were picked" in out["lens_md"]
    assert len(shared.page.registry) == 0  # refused before any job
    out = last(Handlers(shared.page.engine, limits=Limits(max_new_tokens=8)), "", PROMPT, ["q8_0"], 9, False)
    assert out["lens_md"] == "The server allows at most 8 new tokens; got 9."  # a server's cap on a run's
    for bad in (0, 2.5, True, "many"):
        out = last(shared, "", PROMPT, ["q8_0"], bad, False)
        assert out["lens_md"].startswith("max new tokens must be a whole number from 1 to "), (bad, out["lens_md"])
    from ui.run.render import limits_markdown
    assert "at most 2 precisions besides float32 in a quantization lens" in limits_markdown(shared.page.limits)
    # A local page has no bound: four precisions are taken (their refusal here is the empty prompt's).
    out = last(Handlers(shared.page.engine), "", " ", ["q8_0", "q5_0", "q4_1", "q4_0"], 2, False)
    assert out["lens_md"] == "the prompt is empty"


def test_a_model_too_large_to_hold_twice_is_refused_in_one_line(shared):
    h = Handlers(shared.page.engine)
    h.lens.available = lambda: 1 << 20
    out = last(h, "", PROMPT, ["q8_0"], STEPS, False)
    assert re.fullmatch(r"the quantization lens holds this model in float32 and one other precision at once: "
                        r"\d+\.\d\d GiB with the reserve, and 0\.00 GiB are available; this model is too large "
                        r"to compare here", out["lens_md"]), out["lens_md"]
    assert out["lens_view"] == "" and len(h.page.registry) == 0


def test_the_lens_is_an_engine_job_one_at_a_time_and_refuses_what_it_cannot_read(shared, tiny_dirs):
    from ui.layout import build_ui
    demo = build_ui(shared.page.engine, Handlers(shared.page.engine))
    fns = [f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "lens"]
    assert len(fns) == 1 and fns[0].concurrency_id == ENGINE  # the queue's admission checks it
    # The session's job going: the lens is refused as every other engine job.
    h = Handlers(shared.page.engine)
    h.page.registry.start("lens", "local")
    import gradio as gr
    with pytest.raises(gr.Error, match="already have a run going"):
        last(h, "", PROMPT, ["q8_0"], STEPS, False)
    # Another visitor's lens going: one at a time, said in one line.
    h = Handlers(shared.page.engine)
    with h.lens._one_at_a_time:
        out = last(h, "", PROMPT, ["q8_0"], STEPS, False)
    assert out["lens_md"].startswith("Another quantization lens is running") and len(h.page.registry) == 0
    out = last(h, "", PROMPT, [], STEPS, False)
    assert out["lens_md"] == "pick at least one precision to compare with float32"
    out = last(h, "", PROMPT, ["file"], STEPS, False)
    assert "not read from a GGUF file" in out["lens_md"] and "\n" not in out["lens_md"]
    # A model whose files are not here (made in memory; a server's): refused, said why.
    from inference.loading.load import load_hf_dir
    from inference.serving.engine import Engine
    loaded = load_hf_dir(tiny_dirs["mha"], "cpu", "float32")
    with Engine(loaded.model, loaded.tokenizer, "in memory") as engine:
        out = last(Handlers(engine), "", PROMPT, ["q8_0"], STEPS, False)
        note = re.sub(r"<[^>]+>", "", Handlers(engine).lens.model_note(""))
    assert out["lens_md"].startswith("The quantization lens reads the model's own weights again in float32")
    assert "reads the model's own weights again" in note and Handlers(shared.page.engine).lens.model_note("") == ""


def test_a_gguf_source_says_its_float32_is_its_blocks_and_its_own_blocks_never_fork(tiny_dirs, tmp_path):
    from gguf_files import write_gguf
    from inference.loading.default_model import resolve_model
    from inference.serving.engine import Engine
    write_gguf(tiny_dirs["gqa_tied"], tmp_path / "m.gguf", "Q4_1")
    with Engine.from_hf_dir(resolve_model(str(tmp_path / "m.gguf")), device="cpu") as engine:
        h = Handlers(engine, limits=Limits.shared())
        above = re.sub(r"<[^>]+>", "", h.lens.model_note(""))  # the section's line for the model picked
        out = last(h, "", PROMPT, ["file"], 4, False)
    assert above == "⚠ The model picked: the source is a 4-bit GGUF file (Q4_1): its float32 is its blocks " \
                    "dequantized, so each precision here quantizes a quantized model again.", above
    md = re.sub(r"<[^>]+>", "", out["lens_md"])
    assert md.startswith("⚠ The source is a 4-bit GGUF file (Q4_1): its float32 is its blocks dequantized, so each "
                         "precision here quantizes a quantized model again."), md
    cells = table(out["lens_view"])["file"]
    assert cells[6] == "never" and float(cells[4]) < 1e-8  # the same numbers, within the integer bound


def test_stop_ends_the_lens_after_the_precision_being_measured(shared):
    # The lens's Stop (ui/lens/section.py wires it to the run section's stop: the session's one job)
    # during float32's measurement: float32 is shown, no quantized precision is made.
    h = Handlers(shared.page.engine)
    lens = h.lens.lens("", PROMPT, ["q8_0", "q4_0"], STEPS, False, REQ)
    assert "float32" in next(lens)["lens_md"]  # the progress line, before any precision is measured
    h.run.stop_job(REQ)
    out = list(lens)[-1]
    assert out["lens_md"].startswith("**Stopped**: the precisions measured before the stop are shown."), out["lens_md"]
    assert set(table(out["lens_view"])) == {"float32"}
    assert len(h.page.registry) == 0
