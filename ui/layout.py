"""The page: components and their wiring. What each event does lives in handlers.py."""

from __future__ import annotations

import gradio as gr
from starlette.middleware import Middleware

from inference.engine import Engine
from inference.settings import BY_NAME, FILTER_SETTINGS, Setting
from ui import render as fmt
from ui import render_remote
from ui.controls import NAMES, Controls
from ui.handlers import Handlers, is_remote
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

# Reads the page's own address into the hidden `page_url` input before share_link runs.
PAGE_URL_JS = "(...a) => { a[a.length - 1] = window.location.origin + window.location.pathname; return a; }"


def setting_control(s: Setting, value, engine: Engine, label_prefix: str = "", elem_prefix: str = "",
                    limits: Limits | None = None):
    """The page's control for one sampling setting: a number box for top-k, a slider otherwise.
    A server cap on max new tokens is the slider's end, and its help says so."""
    elem_id = elem_prefix + s.name.replace("_", "-")
    label = label_prefix + s.label
    info = None if label_prefix else s.help
    if s.name == "top_k":  # a served model's vocabulary is known only from its config
        return gr.Number(value, label=f"{label} (0 = off)", precision=0, minimum=0,
                         maximum=engine.cfg.vocab_size if engine.cfg else None, info=info, elem_id=elem_id)
    lo = s.step if s.min_open else s.minimum
    context = engine.max_seq_len if is_remote(engine) else engine.cfg.max_seq_len
    hi = s.maximum if s.maximum is not None else min(2048, context - 1)
    cap = limits.max_new_tokens if limits is not None and s.name == "max_new_tokens" else None
    if cap is not None:
        hi, value = min(hi, cap), min(value, cap)
        info = f"{info}; {tokens_message(cap)[:-1].lower()}" if info else tokens_message(cap)
    return gr.Slider(lo, hi, value=value, step=s.step, label=label, info=info, elem_id=elem_id)


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
    remote = h.remote  # in front of a model server: what needs the model's insides says so
    # Gradio's temporary files (the page makes none; uploads are refused) are deleted hourly
    # and when the server stops.
    with gr.Blocks(title="Token Lab", delete_cache=(3600, 3600)) as demo:
        gr.Markdown("# Token Lab\nWatch a language model predict its answer one token at a time: "
                    "every step shows the candidates, the distribution it sampled from, and the "
                    "memory and compute it took.")
        gr.Markdown(h.view.model_card(h.info), elem_id="model-card")
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(d.prompt, label="Prompt", lines=3, elem_id="prompt")
                with gr.Row():
                    mode = gr.Radio(["completion", "chat"], value=d.mode, label="Mode",
                                    info="chat wraps the prompt in the model's chat template",
                                    elem_id="mode")
                    system = gr.Textbox(d.system, label="System prompt (chat mode)", lines=1,
                                        elem_id="system")
                with gr.Row():
                    generate = gr.Button("Generate", variant="primary", elem_id="generate")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop")
                if h.limits.any:
                    gr.Markdown(limits_markdown(h.limits), elem_id="limits")
                gr.Examples(EXAMPLES, inputs=[prompt, mode], label="Examples")
            with gr.Column(scale=2):
                sampling = {name: setting_control(BY_NAME[name], getattr(d, name), engine, limits=h.limits)
                            for name in BY_NAME}
                seed = gr.Textbox(d.seed, label="Seed (empty = random)", elem_id="seed")
                stop = gr.Textbox(d.stop, label="Stop strings (one per line; \\n = newline)", lines=2,
                                  elem_id="stop-strings")
                with gr.Row():
                    share_btn = gr.Button("Copy link to these settings", size="sm", elem_id="copy-link")
                    page_url = gr.Textbox(visible=False)
                share_link = gr.Textbox(label="Link (restores prompt, mode, settings and seed)",
                                        buttons=["copy"], elem_id="share-link")
        notice = gr.Markdown("", label="Notice", elem_id="notice")
        with gr.Row():
            with gr.Column(scale=3):
                prompt_view = gr.Textbox(label="Prompt as fed to the model", lines=2, interactive=False,
                                         elem_id="prompt-view")
                gr.Markdown(OUTPUT_CAPTION_RAW if remote and h.info.logprobs == "raw" else OUTPUT_CAPTION,
                            elem_id="output-caption")
                output = gr.HighlightedText(label="Generated text",
                                            color_map=fmt.COLOR_MAP, show_legend=True,
                                            show_inline_category=False, combine_adjacent=False,
                                            elem_id="output")
                tokens = gr.HTML(fmt.prompt_tokens_html(engine.tokenizer, []),
                                 label="Tokenization: the prompt's tokens and ids", elem_id="tokens")
            with gr.Column(scale=2):
                step = gr.Slider(0, 1, value=0, step=1, label="Step", interactive=False, elem_id="step")
                show_logp = gr.Checkbox(False, label="Show log p instead of p", elem_id="show-logp")
                topk = gr.HTML(fmt.bars_html(None), label="Candidates", elem_id="topk")
        with gr.Row():
            with gr.Column():
                kv_chart = gr.LinePlot(fmt.kv_frame(RunRecord()), x="step", y="MiB", color="series",
                                       title="KV-cache memory per step", elem_id="kv-chart")
                kv_text = gr.Markdown(h.view.kv_formula(h.info), label="KV-cache formula", elem_id="kv-formula")
                server_md = gr.Markdown("", elem_id="server-load", visible=remote)
            with gr.Column():
                latency = gr.LinePlot(fmt.latency_frame(RunRecord()), x="step", y="ms",
                                      title="Decode latency per token", elem_id="latency-chart")
                stats = gr.Markdown("No run yet.", label="Run statistics", elem_id="stats")
        with gr.Accordion("Sampling experiments: the pipeline of a step, replay, compare A/B, "
                          "how likely was X?", open=False):
            if remote:
                gr.Markdown(render_remote.CHARTS_NOTE, elem_id="charts-note")
            with gr.Row():
                run_chart = gr.LinePlot(fmt.run_chart_frames(RunRecord())[0], x="step", y="value",
                                        color="metric", title="Per step: chosen-token probability and raw entropy",
                                        elem_id="run-chart")
                rank_chart = gr.LinePlot(fmt.run_chart_frames(RunRecord())[1], x="step", y="rank",
                                         title="Rank of the chosen token in the raw distribution",
                                         elem_id="rank-chart")
            if remote:
                gr.Markdown(render_remote.REPLAY_NOTE, elem_id="replay-note")
            else:
                gr.Markdown("**Replay the selected step** under other settings: recomputed from the step's "
                            "stored logits, no model call.")
                with gr.Row():
                    replay_inputs = [setting_control(BY_NAME[n], getattr(d, n), engine, "Replay ", "replay-")
                                     for n in FILTER_SETTINGS]
                replay_btn = gr.Button("Replay the selected step", elem_id="replay")
                with gr.Row():
                    replay_md = gr.Markdown("", elem_id="replay-stages")
                    replay_bars = gr.HTML("", elem_id="replay-bars")
            gr.Markdown("**Compare A/B**: A uses the settings above, B these; same prompt, same seed.")
            with gr.Row():
                b_inputs = [setting_control(BY_NAME[n], B_DEFAULTS.get(n, getattr(d, n)), engine, "B ", "b-")
                            for n in FILTER_SETTINGS]
            compare_btn = gr.Button("Run A and B", elem_id="compare")
            compare_md = gr.Markdown("", label="Comparison", elem_id="compare-summary")
            with gr.Row():
                out_a = gr.HighlightedText(label="A", color_map=fmt.COLOR_MAP, show_legend=True,
                                           show_inline_category=False, elem_id="compare-a")
                out_b = gr.HighlightedText(label="B", color_map=fmt.COLOR_MAP, show_legend=True,
                                           show_inline_category=False, elem_id="compare-b")
            with gr.Row():
                bars_a = gr.HTML("", label="A's candidates at the divergence", elem_id="compare-bars-a")
                bars_b = gr.HTML("", label="B's candidates at the divergence", elem_id="compare-bars-b")
            gr.Markdown("**How likely was X?** Any continuation, scored token by token at the selected "
                        "step's position (teacher-forced).")
            with gr.Row():
                x_text = gr.Textbox(" Paris", label="Continuation", elem_id="likely-text")
                x_btn = gr.Button("Score it", elem_id="likely")
            x_md = gr.Markdown("", elem_id="likely-table")
        with gr.Accordion("Inside one token: the path through the model at the selected step", open=False):
            if remote:
                gr.Markdown(render_remote.INSIDE_NOTE, elem_id="inside-note")
            else:
                with gr.Row():
                    lens_layer = gr.Slider(0, engine.cfg.n_layers - 1, value=engine.cfg.n_layers - 1, step=1,
                                           label="Attention layer", elem_id="inspect-layer")
                    inspect_btn = gr.Button("Look inside the selected step", elem_id="inspect")
                stages_md = gr.Markdown("", elem_id="stages")
                with gr.Row():
                    attention = gr.HTML("", elem_id="attention")
                    lens = gr.HTML("", elem_id="lens")
            gr.Markdown(h.view.memory_markdown(h.info), elem_id="memory")
        record = gr.State(None)

        controls = [prompt, mode, system, *sampling.values(), seed, stop]
        assert len(controls) == len(NAMES)
        live = gr.Timer(CHART_INTERVAL_S, active=False)
        # At the click: the prompt's view, or, if this tab has a run going (or its visitor their
        # share), the refusal; only then is the run queued. Through the queue, unlimited: an
        # error of an unqueued event reaches the page as an HTTP 500.
        begun = generate.click(h.begin, inputs=controls, outputs=[prompt_view, tokens, kv_chart, latency, live],
                               api_visibility="private", concurrency_limit=None, show_progress="hidden")
        run = begun.success(
            h.generate, inputs=controls, outputs=[output, topk, stats, kv_text, notice, record],
            api_name="generate", show_progress="hidden", concurrency_id=ENGINE)
        live.tick(h.live_charts, inputs=record, outputs=[kv_chart, latency], api_visibility="private",
                  queue=False, show_progress="hidden")
        stop_btn.click(h.stop, inputs=None, outputs=None, queue=False, api_name="stop")
        step.release(h.select_step, inputs=[record, step], outputs=topk, api_visibility="private",
                     queue=False)
        output.select(h.select_token, inputs=record, outputs=[topk, step], api_visibility="private",
                      queue=False)
        run.then(h.after_run, inputs=record, outputs=[live, kv_chart, latency, step, run_chart, rank_chart], api_visibility="private",
                 queue=False)
        if not remote:
            replay_btn.click(h.replay_step, inputs=[record, step, *replay_inputs],
                             outputs=[replay_md, replay_bars], api_visibility="private", concurrency_id=ENGINE)
            inspect_btn.click(h.inspect_step, inputs=[record, step, lens_layer], outputs=[stages_md, attention, lens],
                              api_visibility="private", concurrency_id=ENGINE)
        else:  # the whole server's load: at load, while a run streams (the chart timer), after it
            for event in (demo.load, live.tick, run.then):
                event(h.server_load, inputs=None, outputs=server_md, api_visibility="private",
                      queue=False, show_progress="hidden")
        compare_btn.click(h.compare, inputs=controls + b_inputs,
                          outputs=[out_a, out_b, compare_md, bars_a, bars_b], api_name="compare",
                          concurrency_id=ENGINE)
        x_btn.click(h.likelihood, inputs=[record, step, x_text], outputs=x_md, api_visibility="private",
                    concurrency_id=ENGINE)
        share_btn.click(h.share_link, inputs=controls + [page_url], outputs=share_link, js=PAGE_URL_JS,
                        api_visibility="private", concurrency_limit=None)  # its refusals: as begin's
        demo.load(h.restore, inputs=None, outputs=controls + [notice], api_visibility="private",
                  queue=False)
        demo.unload(h.closed)
        # A display switch only: every number is rendered both ways and CSS shows one.
        show_logp.change(None, inputs=show_logp, outputs=None, js=SHOW_LOGP_JS)
    demo.tokenlab_handlers = h  # launch wires the queue's admission to them
    return demo


QUEUE_POLL_S = 0.02
OUTPUT_CAPTION = "Colour = the probability each token was sampled with; click a token to inspect its step."
OUTPUT_CAPTION_RAW = ("Colour = the probability each token was sampled with where the server's numbers "
                      "give it (greedy, or temperature 1 with no filter), else the model's own "
                      "probability; click a token to inspect its step.")


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


def launch(demo: gr.Blocks, engine: Engine, *, host: str = "127.0.0.1", port: int | None = None,
           share: bool = False, auth: tuple[str, str] | None = None, block: bool = True,
           queue_size: int = 16):
    """Serve the page; with block, print where and wait until interrupted. Returns gradio's
    (app, local URL, share URL)."""
    configure_queue(demo, engine, queue_size)
    h = getattr(demo, "tokenlab_handlers", None)
    limits = h.limits if h is not None else Limits()
    sessions = h.admission.sessions if h is not None else None
    served = demo.launch(server_name=host, server_port=port, share=share, auth=auth,
                         prevent_thread_lock=True, enable_monitoring=False, show_error=False,
                         css=fmt.BARS_CSS + fmt.INSPECT_CSS + fmt.PROB_CSS, footer_links=["api"], quiet=True,
                         # The page's own routes only, small bodies, each visitor's sessions
                         # counted (ui/public.py); no uploads, no run history kept.
                         app_kwargs={"middleware": [Middleware(RouteGuard, sessions=sessions)]},
                         max_file_size=1, run_history=False,
                         state_session_capacity=limits.session_capacity or 10000)
    if block:
        _, local_url, share_url = served
        print(f"Token Lab is running on {local_url}"
              + (f" and publicly on {share_url}" if share_url else " (python app.py --share makes a public link)"),
              flush=True)
        demo.block_thread()
    return served
