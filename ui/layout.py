"""The page: components and their wiring. What each event does lives in handlers.py."""

from __future__ import annotations

import importlib.util
import json
import sys

import gradio as gr
from fastapi.responses import FileResponse, PlainTextResponse
from starlette.middleware import Middleware

from inference.serving.engine import Engine
from inference.sampling.settings import BY_NAME, FILTER_SETTINGS, Setting
from ui import render as fmt
from ui.controls import NAMES, Controls
from ui import render_remote
from ui.handlers import AFTER_OUTPUTS, DOWNLOAD_ROUTE, RESET_AT_BEGIN, STALE_PANELS, Handlers, is_remote
from ui.public import ENGINE, Limits, RouteGuard, tokens_message
from ui.run_state import RunRecord
from ui.streaming import CHART_INTERVAL_S

EXAMPLES = [
    ["The capital of France is", "completion"],
    ["今天天气真", "completion"],
    ["def fibonacci(n):\n    ", "completion"],
    ["Once upon a time, a tiny language model", "completion"],
    ["Explain in one sentence why the sky is blue.", "chat"],
]

B_DEFAULTS = {"temperature": 1.5}  # compare A/B starts from a visible difference

SHOW_LOGP_JS = "(on) => { document.body.classList.toggle('tl-show-logp', on); return []; }"

# The generated text (our own HTML): a click, or Enter on a focused token, selects its step
# (a gr.SelectData whose index is the chip's). Hover and focus show its popover (CSS).
OUTPUT_JS = """
const pick = (e) => {
  const t = e.target.closest('[data-i]');
  if (!t || !element.contains(t)) return;
  trigger('select', {index: Number(t.dataset.i), value: t.dataset.i, selected: true});
};
element.addEventListener('click', pick);
element.addEventListener('keydown', (e) => {
  if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); pick(e); }
});
// The popover is placed in the window (position: fixed), so that the output's scroll box
// does not clip it: below the token, or above it near the window's bottom; hidden while its
// token is scrolled out of the output's box.
const place = (t) => {
  const pop = t && t.querySelector(':scope > .tl-pop');
  if (!pop) return;
  const r = t.getBoundingClientRect(), box = t.closest('.tl-out').getBoundingClientRect();
  pop.style.position = 'fixed';
  pop.style.visibility = r.bottom < box.top || r.top > box.bottom ? 'hidden' : '';
  const w = pop.offsetWidth, h = pop.offsetHeight;
  pop.style.left = Math.max(4, Math.min(r.left, window.innerWidth - w - 4)) + 'px';
  pop.style.top = (r.bottom + h + 8 > window.innerHeight ? Math.max(4, r.top - h - 4) : r.bottom + 4) + 'px';
};
const placeTarget = (e) => place(e.target.closest('.tl-t'));
element.addEventListener('mouseover', placeTarget);
element.addEventListener('focusin', placeTarget);
// A popover left open (a tapped token keeps focus) follows its token as the page or the output scrolls.
const follow = () => element.querySelectorAll('.tl-t:focus, .tl-t:hover').forEach(place);
window.addEventListener('scroll', follow, {capture: true, passive: true});
window.addEventListener('resize', follow, {passive: true});
"""

# The full attention pattern: hovering a cell highlights its query row's and key column's tokens
# and says which looks at which, with the weight.
PATTERN_JS = """
element.addEventListener('mouseover', (e) => {
  element.querySelectorAll('.tl-hl').forEach((x) => x.classList.remove('tl-hl'));
  const td = e.target.closest('td[data-q]');
  const info = element.querySelector('.tl-pat-info');
  if (!td || !info) return;
  const q = td.dataset.q, k = td.dataset.k;
  const qh = element.querySelector('th.tl-q[data-q="' + q + '"]');
  const kh = element.querySelector('th.tl-k[data-k="' + k + '"]');
  [td, qh, kh].forEach((x) => x && x.classList.add('tl-hl'));
  const qt = qh ? qh.textContent.replace(/^\\d+ /, '') : '', kt = kh ? kh.textContent : '';
  info.textContent = 'query ' + q + ' ' + qt + ' \u2192 key ' + k + ' ' + kt + ': weight ' + td.dataset.w;
});
"""

# Marks the page as ready once the link's settings are restored (tests wait for it).
READY_JS = "() => { document.body.dataset.tlReady = '1'; return []; }"

UNCOPY_JS = "() => { if (navigator.clipboard) navigator.clipboard.writeText('').catch(() => {}); return []; }"

COPY_TEXT_JS = """() => {
  const el = document.querySelector('#output .tl-out');
  const text = el ? (el.dataset.text || '') : '';
  if (navigator.clipboard) navigator.clipboard.writeText(text).catch(() => {});
  return [];
}"""


def share_js(defaults: Controls) -> str:
    """The copy-link click: builds the same link as controls.share_url (same keys, same encoding
    as Python's urlencode, numbers as String() writes them, the last run's seed for an empty
    seed box), copies it to the clipboard within the click, and passes the page's address on to
    the server's share_link, which shows the link."""
    names = json.dumps(NAMES)
    default = json.dumps(dict(zip(NAMES, defaults.values())))
    return """(...a) => {
  const names = %s, defaults = %s, n = names.length;
  const base = window.location.origin + window.location.pathname;
  a[n] = base;
  const enc = (s) => encodeURIComponent(s)
    .replace(/[!'()*]/g, (c) => '%%' + c.charCodeAt(0).toString(16).toUpperCase()).replace(/%%20/g, '+');
  const parts = [];
  names.forEach((name, i) => {
    let v = a[i];
    if (name === 'seed' && String(v ?? '').trim() === '' && a[n + 1]) v = a[n + 1];
    if (v === defaults[name] && name !== 'prompt' && name !== 'seed') return;
    parts.push(enc(name) + '=' + enc(String(v ?? '')));
  });
  const link = base + '?' + parts.join('&');
  if (navigator.clipboard) navigator.clipboard.writeText(link).catch(() => {});
  return a;
}""" % (names, default)


# Sliders of sampling settings send their value unchecked: the settings schema checks it, with
# the setting's name in its message. Gradio's own check ("Value 7 is greater than maximum value
# 1.") names no field and, for an event outside the queue, answers with an HTTP 500. The marker
# is a CSS class because gradio rebuilds a component from its constructor arguments for each
# session that updates it; a subclass would make gradio write a .pyi file next to this module.
UNCHECKED = "tl-setting"
_gradio_slider_preprocess = gr.Slider.preprocess


def _slider_preprocess(self, payload):
    if UNCHECKED in (self.elem_classes or []):
        return payload
    return _gradio_slider_preprocess(self, payload)


gr.Slider.preprocess = _slider_preprocess


def setting_control(s: Setting, value, engine: Engine, label_prefix: str = "", elem_prefix: str = "",
                    limits: Limits | None = None, visible: bool = True):
    """The page's control for one sampling setting: a number box for top-k, a slider otherwise.
    Neither checks its range itself: the settings schema does (a message naming the field). A
    server cap on max new tokens is the slider's end, and its help says so; max new tokens
    otherwise reaches the context."""
    elem_id = elem_prefix + s.name.replace("_", "-")
    label = label_prefix + s.label
    info = None if label_prefix else s.help
    if s.name == "top_k":
        return gr.Number(value, label=f"{label} (0 = off)", precision=None, info=info, elem_id=elem_id,
                         visible=visible)
    lo = s.step if s.min_open else s.minimum
    context = engine.max_seq_len if is_remote(engine) else engine.cfg.max_seq_len
    hi = s.maximum if s.maximum is not None else context - 1
    cap = limits.max_new_tokens if limits is not None and s.name == "max_new_tokens" else None
    if cap is not None:
        hi, value = min(hi, cap), min(value, cap)
        info = f"{info}; {tokens_message(cap)[:-1].lower()}" if info else tokens_message(cap)
    return gr.Slider(lo, hi, value=value, step=s.step, label=label, info=info, elem_id=elem_id,
                     elem_classes=[UNCHECKED], visible=visible)


def limits_markdown(limits: Limits) -> str:
    """The shared page's limits, said once above the controls."""
    parts = []
    if limits.runs_per_client is not None:
        parts.append(f"{limits.runs_per_client} run{'s' if limits.runs_per_client != 1 else ''} "
                     "at a time per visitor (one per tab)")
    if limits.max_new_tokens is not None:
        parts.append(f"at most {limits.max_new_tokens} new tokens a run")
    if limits.sessions_per_client is not None:
        parts.append(f"{limits.sessions_per_client} open tabs per visitor")
    return ("**Shared page:** " + "; ".join(parts) + ".") if parts else ""


def build_ui(engine: Engine, handlers: Handlers | None = None) -> gr.Blocks:
    h = handlers or Handlers(engine)
    d = h.defaults
    tok = engine.tokenizer
    remote = h.remote  # in front of a model server: what needs the model's insides says so
    # Gradio's temporary files (the page makes none; uploads are refused) are deleted hourly
    # and when the server stops.
    with gr.Blocks(title="Token Lab", delete_cache=(3600, 3600)) as demo:
        gr.Markdown("# Token Lab\nWatch a language model predict its answer one token at a time: "
                    "every step shows the candidates, the distribution it sampled from, and the "
                    "memory and compute it took.")
        gr.Markdown(h.view.model_card(h.info), elem_id="model-card")
        sampling = {}
        # Wide: prompt | settings over output | bars. Narrow (LAYOUT_CSS): prompt, output, bars,
        # then the settings.
        with gr.Row(elem_id="main-grid"):
            with gr.Column(elem_id="input-col"):
                prompt = gr.Textbox(d.prompt, label="Prompt", lines=3, elem_id="prompt")
                context_count = gr.Markdown(h.count_context(d.prompt, d.mode, d.system, d.max_new_tokens), label="Context",
                                            elem_id="context-count")
                with gr.Row():
                    mode = gr.Radio(["completion", "chat"], value=d.mode, label="Mode",
                                    info="chat wraps the prompt in the model's chat template; "
                                         "follow-ups continue the conversation", elem_id="mode")
                    # min_width: on a narrow screen it goes under the mode, the whole column
                    # wide, so that the model's default (its placeholder) can be read.
                    system = gr.Textbox(
                        d.system, label="System prompt (chat mode)", lines=2, elem_id="system", min_width=300,
                        placeholder=h.default_system or "none",
                        info=("empty = the model's default, shown here: its chat template adds it"
                              if h.default_system else "empty = no system message"))
                conversation = gr.HTML("", elem_id="conversation")
                with gr.Row():
                    generate = gr.Button("Generate", variant="primary", elem_id="generate")
                    stop_btn = gr.Button("Stop", variant="secondary", interactive=False, elem_id="stop")
                with gr.Row(visible=d.mode == "chat", elem_id="chat-buttons") as chat_buttons:
                    regen_btn = gr.Button("Regenerate last answer", size="sm", interactive=False,
                                          elem_id="regenerate")
                    new_chat = gr.Button("New conversation", size="sm", elem_id="new-conversation")
                status = gr.Markdown("", label="Status", elem_id="status")
                notice = gr.Markdown("", label="Notice", elem_id="notice")
                if h.limits.any:
                    gr.Markdown(limits_markdown(h.limits), elem_id="limits")
                with gr.Accordion("Example prompts", open=False, elem_id="examples"):
                    gr.Examples(EXAMPLES, inputs=[prompt, mode], label=None)
            with gr.Column(elem_id="output-col"):
                prompt_view = gr.Textbox(label="Prompt as fed to the model", lines=2, max_lines=8,
                                         interactive=False, elem_id="prompt-view")
                gr.Markdown(OUTPUT_CAPTION_RAW if remote and h.info.logprobs == "raw" else OUTPUT_CAPTION,
                            elem_id="output-caption")
                output = gr.HTML(fmt.output_html(None, tok), label="Generated text", elem_id="output",
                                 js_on_load=OUTPUT_JS)
                with gr.Row():
                    copy_text = gr.Button("Copy text", size="sm", elem_id="copy-text")
                    downloads = gr.HTML(fmt.downloads_html(None, None), elem_id="downloads")
                tokens = gr.HTML(fmt.run_tokens_html(tok, []), label="Tokenization", elem_id="tokens")
            with gr.Column(elem_id="settings-col"):
                with gr.Accordion("Sampling settings", open=True, elem_id="settings"):
                    for name in ("temperature", "top_k", "top_p", "max_new_tokens"):
                        sampling[name] = setting_control(BY_NAME[name], getattr(d, name), engine, limits=h.limits)
                    seed = gr.Textbox(d.seed, label="Seed (empty = random)", elem_id="seed")
                    with gr.Accordion("More settings: min-p, repetition penalty, stop strings", open=False,
                                      elem_id="more-settings") as more:
                        for name in ("min_p", "repetition_penalty"):
                            sampling[name] = setting_control(BY_NAME[name], getattr(d, name), engine,
                                                             limits=h.limits)
                        stop = gr.Textbox(d.stop, label="Stop strings (one per line; \\n = newline)", lines=2,
                                          elem_id="stop-strings")
                    share_btn = gr.Button("Copy link to these settings", size="sm", elem_id="copy-link")
                    page_url = gr.Textbox(visible=False)
                    run_seed = gr.Textbox("", visible=False)  # the seed of the last run, for the link
                    share_link = gr.Textbox(label="Link (restores prompt, mode, settings and seed; copied "
                                                  "to the clipboard)", buttons=["copy"], elem_id="share-link")
            with gr.Column(elem_id="bars-col"):
                step = gr.Slider(0, 1, value=0, step=1, label="Step", interactive=False, elem_id="step")
                show_logp = gr.Checkbox(False, label="Show log p instead of p", elem_id="show-logp")
                topk = gr.HTML(fmt.bars_html(None), label="Candidates", elem_id="topk")
        with gr.Row():
            with gr.Column(min_width=320):
                kv_chart = gr.LinePlot(fmt.kv_frame(RunRecord()), **fmt.step_axis(-1), y="MiB", color="series",
                                       title="KV-cache memory per step", elem_id="kv-chart")
                kv_text = gr.Markdown(h.view.kv_formula(h.info), label="KV-cache formula", elem_id="kv-formula")
                server_md = gr.Markdown("", elem_id="server-load", visible=remote)
            with gr.Column(min_width=320):
                latency = gr.LinePlot(fmt.latency_frame(RunRecord()), **fmt.step_axis(), y="ms",
                                      title="Decode latency per token", elem_id="latency-chart")
                stats = gr.Markdown("No run yet.", label="Run statistics", elem_id="stats")
        with gr.Accordion("Sampling experiments: the pipeline of a step, replay, compare A/B, "
                          "how likely was X?", open=False):
            if remote:
                gr.Markdown(render_remote.CHARTS_NOTE, elem_id="charts-note")
            with gr.Row():
                run_chart = gr.LinePlot(fmt.run_chart_frames(RunRecord())[0], **fmt.step_axis(), y="value",
                                        color="metric", title="Per step: chosen-token probability and raw entropy",
                                        elem_id="run-chart", min_width=320)
                rank_chart = gr.LinePlot(fmt.run_chart_frames(RunRecord())[1], **fmt.step_axis(), y="rank",
                                         title="Rank of the chosen token in the raw distribution",
                                         elem_id="rank-chart", min_width=320)
            # In front of a server the replay needs what it cannot give (the whole logit vector):
            # its parts exist, hidden, so that a run's end still has them to set.
            if remote:
                gr.Markdown(render_remote.REPLAY_NOTE, elem_id="replay-note")
            gr.Markdown("**Replay the selected step** under other settings: recomputed from the step's "
                        "logits, no sampling. The controls start at the run's settings and the replay "
                        "follows them as they move.", visible=not remote)
            with gr.Row(visible=not remote):
                replay_inputs = [setting_control(BY_NAME[n], getattr(d, n), engine, "Replay ", "replay-")
                                 for n in FILTER_SETTINGS]
            replay_btn = gr.Button("Replay the selected step", elem_id=None if remote else "replay", visible=not remote)
            replay_md = gr.Markdown("", elem_id="replay-stages", visible=not remote)
            replay_bars = gr.HTML("", elem_id="replay-bars", visible=not remote)
            gr.Markdown("**Compare A/B**: A uses the settings above, B these; same prompt, same seed.")
            with gr.Row():
                b_inputs = [setting_control(BY_NAME[n], B_DEFAULTS.get(n, getattr(d, n)), engine, "B ", "b-")
                            for n in FILTER_SETTINGS]
            compare_btn = gr.Button("Run A and B", elem_id="compare")
            compare_md = gr.Markdown("", label="Comparison", elem_id="compare-summary")
            with gr.Row():
                out_a = gr.HighlightedText(label="A", color_map=fmt.COMPARE_COLOR_MAP, show_legend=True,
                                           show_inline_category=False, elem_id="compare-a", min_width=300)
                out_b = gr.HighlightedText(label="B", color_map=fmt.COMPARE_COLOR_MAP, show_legend=True,
                                           show_inline_category=False, elem_id="compare-b", min_width=300)
            with gr.Row():
                bars_a = gr.HTML("", label="A's candidates at the divergence", elem_id="compare-bars-a",
                                 min_width=320)
                bars_b = gr.HTML("", label="B's candidates at the divergence", elem_id="compare-bars-b",
                                 min_width=320)
            gr.Markdown("**How likely was X?** Any continuation, scored token by token at the selected "
                        "step's position (teacher-forced).")
            with gr.Row():
                x_text = gr.Textbox(" Paris", label="Continuation", elem_id="likely-text")
                x_btn = gr.Button("Score it", elem_id="likely")
            x_md = gr.Markdown("", elem_id="likely-table")
        with gr.Accordion("Inside one token: the path through the model at the selected step", open=False):
            if remote:
                gr.Markdown(render_remote.INSIDE_NOTE, elem_id="inside-note")
            n_layers, n_heads = (engine.cfg.n_layers, engine.cfg.n_heads) if engine.cfg else (1, 1)
            with gr.Row(visible=not remote):
                lens_layer = gr.Slider(0, n_layers - 1, value=n_layers - 1, step=1, label="Attention layer",
                                       elem_id=None if remote else "inspect-layer", min_width=200)
                head = gr.Slider(0, n_heads - 1, value=0, step=1, label="Head (full pattern)",
                                 elem_id="inspect-head", min_width=200)
                inspect_btn = gr.Button("Look inside the selected step", elem_id=None if remote else "inspect",
                                        min_width=200)
            stages_md = gr.Markdown("", elem_id="stages", visible=not remote)
            with gr.Tabs(visible=not remote):
                with gr.Tab("Attention", elem_id="tab-attention"):
                    attention = gr.HTML("", elem_id=None if remote else "attention")
                with gr.Tab("Full pattern", elem_id="tab-pattern"):
                    pattern = gr.HTML("", elem_id="pattern", js_on_load=PATTERN_JS)
                with gr.Tab("Logit lens", elem_id="tab-lens"):
                    lens = gr.HTML("", elem_id=None if remote else "lens")
            gr.Markdown(h.view.memory_markdown(h.info), elem_id="memory")
        record = gr.State(None)
        history = gr.State([])

        controls = [prompt, mode, system, *(sampling[name] for name in BY_NAME), seed, stop]
        assert len(controls) == len(NAMES)
        live = gr.Timer(CHART_INTERVAL_S, active=False)
        stale = {"replay_md": replay_md, "replay_bars": replay_bars, "x_md": x_md, "stages_md": stages_md,
                 "attention": attention, "lens": lens, "pattern": pattern}
        run_outputs = [output, topk, stats, kv_text, notice, status, step, gr.JSON(visible=False, label="Tokens"),
                       record]
        after = {"live": live, "generate": generate, "regenerate": regen_btn, "stop": stop_btn,
                 "kv_chart": kv_chart, "latency": latency, "step": step, "run_chart": run_chart,
                 "rank_chart": rank_chart, **{f"replay_{n}": c for n, c in zip(FILTER_SETTINGS, replay_inputs)},
                 "tokens": tokens, "downloads": downloads,
                 "run_seed": run_seed, "history": history, "conversation": conversation, "prompt": prompt,
                 "status": status}
        after_outputs = [after[n] for n in AFTER_OUTPUTS]
        begin_outputs = [prompt_view, tokens, kv_chart, latency, live, generate, regen_btn, stop_btn, step,
                         status, output, topk, stats, notice, *(stale[n] for n in STALE_PANELS),
                         *(after[n] for n in RESET_AT_BEGIN), record]

        def chain_run(started):
            """begin -> generate -> after_run, from an event or a trigger. begin runs in the queue,
            unlimited: its refusal (this tab has a run going, or its visitor their share) is a
            page error, and an unqueued event's error would reach the page as an HTTP 500; only
            if it succeeds is the run queued."""
            b = started(h.begin, inputs=controls + [history], outputs=begin_outputs, concurrency_limit=None,
                        show_progress="hidden", api_visibility="private")
            r = b.success(h.generate_on_page, inputs=controls + [history], outputs=run_outputs,
                          show_progress="hidden", concurrency_id=ENGINE, api_visibility="private",
                          postprocess=False)
            r.then(h.after_run, inputs=[record, history], outputs=after_outputs, queue=False,
                   show_progress="hidden", api_visibility="private")
            return r

        run = chain_run(generate.click)
        regen_run = chain_run(regen_btn.click(h.pop_last_turn, inputs=history,
                                              outputs=[history, prompt, mode, conversation],
                                              api_visibility="private", show_progress="hidden").success)
        # /generate for scripts: the same run, refusing bad input with an error (gradio_client
        # raises it). No button of the page triggers it.
        api_generate = gr.Button(visible=False)
        api_generate.click(h.generate, inputs=controls, outputs=run_outputs, api_name="generate",
                           show_progress="hidden", concurrency_id=ENGINE, postprocess=False)
        mode.change(lambda m: gr.update(visible=m == "chat"), inputs=mode, outputs=chat_buttons, queue=False,
                    api_visibility="private", show_progress="hidden")
        new_chat.click(h.new_conversation, inputs=None, outputs=[history, conversation, regen_btn], queue=False,
                       api_visibility="private")
        live.tick(h.live_tick, inputs=record, outputs=[kv_chart, latency, status], api_visibility="private",
                  queue=False, show_progress="hidden")
        stop_btn.click(h.stop, inputs=None, outputs=None, queue=False, api_name="stop")
        gr.on([prompt.change, mode.change, system.change, sampling["max_new_tokens"].change, history.change],
              h.count_context, inputs=[prompt, mode, system, sampling["max_new_tokens"], history],
              outputs=context_count, queue=False, show_progress="hidden", trigger_mode="always_last",
              api_visibility="private")
        # Arrow keys and a typed number (input), a drag's end (release): the bars follow.
        gr.on([step.input, step.release], h.select_step, inputs=[record, step], outputs=topk,
              api_visibility="private", queue=False, show_progress="hidden", trigger_mode="always_last")
        output.select(h.select_token, inputs=record, outputs=[topk, step], api_visibility="private",
                      queue=False)
        if not remote:
            # The replay follows its controls (a typed value, a drag, arrow keys); one forward
            # pass per step, kept, so that moving them is cheap.
            replay_args = dict(inputs=[record, step, *replay_inputs], outputs=[replay_md, replay_bars],
                               api_visibility="private", concurrency_id=ENGINE, show_progress="hidden")
            replay_btn.click(h.replay_step, **replay_args)
            gr.on([e for c in replay_inputs for e in ((c.input, c.release) if isinstance(c, gr.Slider) else (c.input,))],
                  h.replay_step, trigger_mode="always_last", **replay_args)
            inspect_args = dict(inputs=[record, step, lens_layer, head], outputs=[stages_md, attention, lens, pattern],
                                api_visibility="private", concurrency_id=ENGINE)
            inspect_btn.click(h.inspect_step, **inspect_args)
            gr.on([lens_layer.input, lens_layer.release], h.inspect_step, trigger_mode="always_last", **inspect_args)
            gr.on([head.input, head.release], h.select_head, inputs=[record, step, lens_layer, head], outputs=pattern,
                  api_visibility="private", queue=False, trigger_mode="always_last")
        else:  # the whole server's load: at load, while a run streams (the chart timer), after it
            for event in (demo.load, live.tick, run.then, regen_run.then):
                event(h.server_load, inputs=None, outputs=server_md, api_visibility="private",
                      queue=False, show_progress="hidden")
        compare_btn.click(h.compare, inputs=controls + b_inputs,
                          outputs=[out_a, out_b, compare_md, bars_a, bars_b], api_name="compare",
                          concurrency_id=ENGINE)
        x_btn.click(h.likelihood, inputs=[record, step, x_text], outputs=x_md, api_visibility="private",
                    concurrency_id=ENGINE)
        copy_text.click(None, inputs=None, outputs=None, js=COPY_TEXT_JS)
        # Its refusals (text no run could use) as begin's: in the queue, unlimited. The click
        # copies the link at once (share_js); a refused link is taken back off the clipboard.
        share_btn.click(h.share_link, inputs=controls + [page_url, run_seed], outputs=share_link,
                        js=share_js(d), api_visibility="private", concurrency_limit=None
                        ).failure(None, js=UNCOPY_JS)
        demo.load(h.restore, inputs=None, outputs=controls + [more, notice], api_visibility="private",
                  queue=False).then(None, js=READY_JS)
        demo.unload(h.closed)
        # A display switch only: every number is rendered both ways and CSS shows one.
        show_logp.change(None, inputs=show_logp, outputs=None, js=SHOW_LOGP_JS)
    demo.tokenlab_handlers = h  # launch wires the queue's admission and the downloads to them
    return demo


QUEUE_POLL_S = 0.02
OUTPUT_CAPTION = ("Generated text, coloured by the probability each token was sampled with: hover or tap a "
                  "token for its alternatives; click it to inspect its step.")
OUTPUT_CAPTION_RAW = ("Generated text, coloured by the probability each token was sampled with where the "
                      "server's numbers give it (greedy, or temperature 1 with no filter), else the model's own "
                      "probability: hover or tap a token for its alternatives; click it to inspect its step.")


# Page events handled at once. A run's event mostly waits for its tokens: the engine's scheduler
# batches every run into one forward pass per step and queues what the KV pool cannot hold, so
# Gradio's queue must not serialize them. What one visitor may hold is ui/public.py's Admission.
CONCURRENCY = 64


def configure_queue(demo: gr.Blocks, engine: Engine, queue_size: int = 16,
                    concurrency: int = CONCURRENCY) -> None:
    # api_open=False: the queued events are reached only through the queue (where the
    # admission checks them), never through the direct REST routes that would skip it.
    demo.queue(default_concurrency_limit=concurrency, max_size=queue_size, api_open=False)
    h = getattr(demo, "tokenlab_handlers", None)
    if h is not None:
        h.admission.attach(demo)
    # Gradio's queue loop wakes every 1 ms while it waits; each wake takes the GIL from the
    # engine's thread, costing decode speed on a small CPU. 20 ms is still instant to a person.
    if hasattr(demo._queue, "sleep_when_free"):
        demo._queue.sleep_when_free = QUEUE_POLL_S
    record_absent_matplotlib()


def record_absent_matplotlib() -> None:
    """Gradio imports matplotlib when it enters and leaves every event (to set and restore its
    backend); where matplotlib is not installed, each of those imports fails anew after
    searching every path again, as Python keeps no record of a failed import: about a fifth of
    the page's own CPU while 8 runs streamed (py-spy), on the cores the engine decodes on.
    Recording it as absent makes each of those imports fail at once. Nothing is changed where
    matplotlib is installed."""
    if "matplotlib" not in sys.modules and importlib.util.find_spec("matplotlib") is None:
        sys.modules["matplotlib"] = None


def serve_downloads(app, handlers: Handlers) -> None:
    """The page's downloads (a run's steps, its settings) at /DOWNLOAD_ROUTE/<token>/<name>:
    files the page wrote itself, by a random token, outside gradio's file routes (which the
    page does not serve: ui/public.py)."""
    async def download(token: str, name: str):
        path = handlers.download_path(token, name)
        if path is None:
            return PlainTextResponse("No such download (the page keeps the latest ones).", status_code=404)
        return FileResponse(path, filename=name, media_type="application/octet-stream")

    app.add_api_route(f"/{DOWNLOAD_ROUTE}/{{token}}/{{name}}", download, methods=["GET"])


def launch(demo: gr.Blocks, engine: Engine, *, host: str = "127.0.0.1", port: int | None = None,
           share: bool = False, auth: tuple[str, str] | None = None, block: bool = True,
           queue_size: int = 16, concurrency: int = CONCURRENCY):
    """Serve the page; with block, print where and wait until interrupted. Returns gradio's
    (app, local URL, share URL). concurrency: runs Gradio hands the scheduler at once."""
    configure_queue(demo, engine, queue_size, concurrency)
    h = getattr(demo, "tokenlab_handlers", None)
    limits = h.limits if h is not None else Limits()
    sessions = h.admission.sessions if h is not None else None
    served = demo.launch(server_name=host, server_port=port, share=share, auth=auth,
                         prevent_thread_lock=True, enable_monitoring=False, show_error=False,
                         css=fmt.PAGE_CSS, footer_links=["api"], quiet=True,
                         # The page's own routes only, small bodies, each visitor's sessions
                         # counted (ui/public.py); no uploads, no run history kept.
                         app_kwargs={"middleware": [Middleware(RouteGuard, sessions=sessions)]},
                         max_file_size=1, run_history=False,
                         state_session_capacity=limits.session_capacity or 10000)
    if h is not None and served:  # (a test's stand-in launch returns nothing)
        serve_downloads(served[0], h)
    if block:
        _, local_url, share_url = served
        print(f"Token Lab is running on {local_url}"
              + (f" and publicly on {share_url}" if share_url else " (python app.py --share makes a public link)"),
              flush=True)
        demo.block_thread()
    return served
