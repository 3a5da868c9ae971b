"""The lesson's chapters as HTML: each chapter's real numbers (from inference.lesson, the CLI's
too), a short explanation for a newcomer, and where on the page to explore further."""

from __future__ import annotations

import math
from html import escape

from inference.lesson.summary import mib, si
from inference.loading.byte_pieces import short_hint
from ui.format import token_label
from ui.lesson.charts import lines_svg, roofline_svg
from ui.glossary import gloss

# Each chapter: the panel of the page to explore further (its element id) and its name.
EXPLORE = {
    "tokenize": (("prompt-view", "the prompt as fed, under the output"), ("score-panel", "Probability of a text")),
    "embed": (("memory", "the memory table in Inside one token"),),
    "rope": (("tab-pattern", "Inside one token → Full pattern: attention by position"),),
    "layers": (("stages", "Inside one token: every stage of a step"), ("tab-attention", "its attention per layer and head")),
    "lm_head": (("bars-col", "the per-step bars"), ("tab-lens", "the logit lens, layer by layer")),
    "sampling": (("settings", "Sampling settings"), ("replay", "Sampling experiments → replay a step")),
    "prefill_decode": (("stats", "the run statistics"), ("latency-chart", "the time of every step")),
    "kv_cache": (("kv-chart", "the KV-cache chart of a run"), ("kv-formula", "its formula")),
    "flops": (("stages", "Inside one token: FLOPs and bytes per stage"),),
}


WALK_ROWS = 12  # of the top-p walk, listed
MASK_CELL_PX = 28  # the widest cell of the causal mask's matrix


def _p(x: float | None) -> str:
    """A probability as the page writes it: 4 decimals, below 1e-4 three significant digits."""
    if x is None:
        return "–"
    return f"{x:.4f}" if x >= 1e-4 or x == 0 else f"{x:.3g}"


def _code(s: str) -> str:
    """A token's piece, every character visible: ␣ a space, ↵ a newline (a newline token is never
    an empty cell), ⟨U+…⟩ one that prints as nothing."""
    return f"<code class='lesson-piece'>{escape(token_label(s))}</code>"


def _count(n: int, word: str, words: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else words or word + 's'}"


def _piece(s: str) -> str:
    """A token's piece; a byte token's says which bytes of a character it holds ("1st of 3 bytes")."""
    hint = short_hint(s)
    return (_code(s)
            + (f" <small class='lesson-hint'>{escape(hint)}</small>" if hint else ""))


def _table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<div class='lesson-scroll'><table class='lesson-table {cls}'><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>"


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f} ms"


# ---------------------------------------------------------------- the chapters


def _tokenize(c: dict) -> tuple[str, str]:
    ex = c["examples"]
    control = [t["piece"] for t in c["tokens"] if t["control"]]
    typed = c["n_tokens"] - len(control)
    what = ("The text fed, your message inside the model's chat template (chat mode), is "
            f"{_count(c['n_chars'], 'character')}: it became" if c.get("chat") else
            f"Your {_count(c['n_chars'], 'character')} became")
    ctl = (f", and the tokenizer put {_count(len(control), 'control token')} among them "
           f"({', '.join(_code(p) for p in dict.fromkeys(control))}: markers such as the start of a text, never typed "
           f"text), {c['n_tokens']:,} ids in all" if control else "")
    text = (f"The model never sees letters: a <b>tokenizer</b> cuts the text into pieces from a fixed vocabulary "
            f"of <b>{c['vocab_size']:,}</b> entries and replaces each by its number, its <b>id</b>. {what} "
            f"<b>{_count(typed, 'token')}</b>{ctl}. A token can be a whole word with its "
            "space, part of a word, one character, or even one <em>byte</em> of a character.")
    if c["byte_tokens"]:
        text += (f" Here {c['byte_tokens']} of the tokens are <b>byte tokens</b> (written &lt;0xNN&gt;): the vocabulary "
                 "has no entry for these characters, so each is spelled by its UTF-8 bytes, and several tokens "
                 "together make one character" + (f", e.g. <code>{escape(ex['split_character'])}</code>" if ex["split_character"] else "")
                 + ". A model that reads a language this way spends more tokens, and more compute, on it.")
    if ex["multi_character_token"]:
        text += f" The other way round, one token can hold several characters: <code>{escape(ex['multi_character_token'])}</code>."
    rows = [[str(t["position"]), str(t["id"]), _code(t["piece"]), str(t["bytes"]), escape(t["byte_hint"] or ("control token" if t["control"] else ""))]
            for t in c["tokens"]]
    chips = "".join(f"<span class='lesson-chip' title='{escape(g['kind'])}'>{escape(g['label'] if g['tokens'] > 1 else (g['text'] or g['label']))}"
                    f"<small>{g['tokens']} token{'s' if g['tokens'] > 1 else ''}</small></span>" for g in c["groups"])
    return text, (f"<div class='lesson-chips'>{chips}</div>"
                  + _table(["position", "id", "piece", "bytes", "what its bytes are"], rows))


def _embed(c: dict) -> str:
    rows = [[str(r["position"]), _piece(r["piece"]), "[" + ", ".join(f"{v:.4f}" for v in r["first_values"]) + ", …]", f"{r['norm']:.3f}"]
            for r in c["rows"]]
    scale = (f" Gemma multiplies each row by √hidden = {c['embed_scale']:.4g} first: the values shown are after it."
             if c["embed_scale"] != 1 else "")
    text = (f"Each id picks one row of the <b>embedding matrix</b>: {c['shape'][0]:,} rows (one per vocabulary entry) × "
            f"{c['shape'][1]:,} numbers, {c['params']:,} values stored as {c['dtype']} "
            f"({c['bytes_per_value']:.4g} bytes each) = <b>{mib(c['bytes'])}</b>. No arithmetic happens here, only a lookup: "
            f"the prompt becomes a matrix of shape [{c['output_shape'][0]}, {c['output_shape'][1]}], one vector per token. "
            "The same id always gives the same vector, wherever it stands: position comes next." + scale)
    return text, _table(["position", "piece", "first 8 values of its row", "norm"], rows)


def _rope(c: dict) -> tuple[str, str]:
    s = c["scores"]
    text = (f"Attention compares a <b>query</b> vector of one position with the <b>key</b> vectors of the others. RoPE "
            f"(rotary position embedding) turns each pair of their {c['head_dim']} dimensions by an angle proportional to the "
            f"position: pair <i>i</i> turns θ<sup>−2i/{c['head_dim']}</sup> radians a position (θ = {c['theta']:g}), so the first "
            "pairs spin fast and the last ones barely move. Because both vectors are turned, their dot product depends only "
            f"on the <b>difference</b> of the angles, that is on the distance between the positions. Below, layer 0's real "
            f"query (of the last token) and key (of the first) at distance {s[0]['distance']}: moved "
            f"{s[-1]['key_position']} positions further, the score stays the same (up to float rounding).")
    if c["layer0_sliding"]:
        text += (f" (Layer 0 of this model is a sliding-window layer with its own base θ = {c['theta']:g}; its "
                 f"full-attention layers use θ = {c['full_theta']:g}.)")
    if c.get("layers_without_rope"):
        text += (f" This model's layers {', '.join(map(str, c['layers_without_rope']))} apply no RoPE at all: there "
                 "query and key are compared as they are, so those layers see order only through the mask.")
    if c.get("rotary_dim", c["head_dim"]) < c["head_dim"]:
        text += (f" This model turns only each head's first {c['rotary_dim']} of its {c['head_dim']} dimensions "
                 f"(pair <i>i</i> is dims <i>i</i> and <i>i</i> + {c['rotary_dim'] // 2}, θ<sup>−2i/{c['rotary_dim']}</sup> "
                 "radians a position); the rest pass through as they are.")
    if c.get("scaling") == "longrope":
        text += (" Its frequencies are divided by LongRoPE's short factors (one a pair; cos and sin scaled): its long "
                 "ones, for texts past the context it was trained on, are not computed here, so its context stops there.")
    elif c.get("scaling") not in (None, "default"):
        text += f" Its frequencies are rescaled ({c['scaling']}), to reach past the context it was trained on."
    n = len(c["positions"])
    shown = list(range(n)) if n <= 12 else [*range(6), *range(n - 6, n)]
    angle_rows = [[f"{p['pair']} ({p['dims'][0]}, {p['dims'][1]})", f"{p['radians_per_position']:.4g}",
                   f"{p['wavelength_positions']:,.1f}"] + [f"{math.degrees(p['radians'][i]) % 360:.3g}°" for i in shown]
                  for p in c["pairs"]]
    score_rows = [[f"{x['query_position']}, {x['key_position']}", str(x["distance"]), f"{x['score']:.6f}"] for x in s]
    other_rows = [[f"{x['query_position']}, {x['key_position']}", str(x["distance"]), f"{x['score']:.6f}"]
                  for x in c["other_distances"]]
    return text, (_table(["pair (dims)", "rad / position", "a turn every … positions", *[f"pos {i}" for i in shown]], angle_rows)
                  + (f"<p class='lesson-note'>Positions {', '.join(map(str, shown))} of {n} shown.</p>" if len(shown) < n else "")
                  + "<h4>The same query and key, moved together: the distance stays, so does the score</h4>"
                  + _table(["query, key positions", "distance", "score q·k × scale"], score_rows)
                  + "<h4>The same two vectors at other distances: other scores</h4>"
                  + _table(["query, key positions", "distance", "score q·k × scale"], other_rows))


def _mask(c: dict) -> str:
    w = c["attention_layer0_head0"]
    k = c["matrix_positions"]
    cells = []
    for i in range(k):
        for j in range(k):
            if c["mask"][i][j]:
                a = w[i][j]
                cells.append(f"<span class='lesson-cell' style='background:rgba(37,99,235,{0.08 + 0.92 * a:.3f})' "
                             f"title='query {i} → key {j}: {a:.4f}'></span>")
            else:
                cells.append("<span class='lesson-cell lesson-masked' title='masked: a future position (−∞)'></span>")
    width = min(k * MASK_CELL_PX, 420)  # a short prompt's cells stay small
    grid = (f"<div class='lesson-mask' style='grid-template-columns:repeat({k},1fr);max-width:min(100%,{width}px)'>"
            f"{''.join(cells)}</div>")
    note = (f"<p class='lesson-note'>The first {k} of {c['n_positions']} positions drawn.</p>" if k < c["n_positions"] else "")
    return ("<p class='lesson-note'>The causal mask as your prompt's own "
            f"{c['n_positions']}×{c['n_positions']} matrix: row = the query's position, column = the key's; grey cells are "
            "the future (masked to −∞ before the softmax), blue ones the real attention weights of layer 0, head 0 "
            "(darker = more). Hover a cell for its weight.</p>" + grid + note)


def _layers(c: dict) -> tuple[str, str]:
    gqa = (f" Grouped-query attention: {c['n_heads']} query heads share {_count(c['n_kv_heads'], 'key/value head')} "
           f"({c['group_size']} each), which makes the KV cache {c['group_size']}× smaller." if c["group_size"] > 1 else "")
    text = (f"The vectors now go through <b>{c['n_layers']} layers</b> of the same shape (each with its own weights). In each, "
            "<b>attention</b> lets every position gather information from the positions before it, then an <b>MLP</b> "
            f"transforms each position on its own. Before each of the two, an <b>RMSNorm</b> rescales the vector "
            "(pre-norm), and each one's result is <b>added</b> back to its input (the residual stream)." + gqa
            + f" The MLP is gated ({escape(c['activation'])}): three matrices, up and gate widen {c['hidden']} → "
            f"{c['intermediate']} (×{c['expansion']:.2f}), down brings it back.")
    rows = [[escape(s["step"]), f"<code>{escape(s['shape'])}</code>", escape(s["note"])] for s in c["steps"]]
    cost = [[escape(r["stage"]), si(r["flops"], "FLOPs"), mib(r["bytes"])] for r in c["per_layer"]]
    n = c["n_positions"]
    counted = (f"<p class='lesson-note'>Attention is counted over all {n}×{n} scores, as the kernel computes them "
               f"(the masked ones too); the causal mask keeps {c['scores_kept']} of the {c['scores_counted']}: "
               f"{si(c['scores_kept_flops'], 'FLOPs')} a layer if only those were counted.</p>") if n > 1 else ""
    return text, (_table(["step of one layer", "shape for your prompt", ""], rows) + _mask(c)
                  + _table(["per layer, this prompt", "FLOPs", "weights read"], cost) + counted
                  + f"<p class='lesson-note'>× {c['n_layers']} layers = <b>{si(c['all_layers_flops'], 'FLOPs')}</b> for the "
                    f"prompt's {c['n_positions']} positions. This model's turns: {escape('; '.join(c['family_path']))}.</p>")


def _lm_head(c: dict) -> tuple[str, str]:
    tied = ("Here it is <b>tied</b>: the same matrix as the embedding, read again, so it costs no extra memory."
            if c["tied"] else f"Here it has its own weights, stored as {c['dtype']}: <b>{mib(c['bytes'])}</b> more.")
    text = (f"After the last layer and a final RMSNorm, only the <b>last position</b> matters for the next token: its "
            f"vector of {c['hidden']} numbers is multiplied by a [{c['hidden']}, {c['vocab_size']:,}] matrix, giving one "
            f"score, a <b>logit</b>, for each of the {c['vocab_size']:,} vocabulary entries. {tied} "
            "Softmax turns the logits into probabilities: p = e<sup>logit</sup> / Σ e<sup>logit</sup>.")
    if c["softcap"]:
        text += f" This model first squashes the logits into ±{c['softcap']:g} (soft-capping)."
    rows = [[str(i + 1), _piece(t["piece"]), str(t["id"]), f"{t['logit']:.3f}", _p(t["prob"])] for i, t in enumerate(c["top"])]
    return text, _table(["rank", "token", "id", "logit", "probability"], rows)


def _sampling(c: dict) -> tuple[str, str]:
    s = c["settings"]
    walk = c["top_p"]
    text = ("The model gives a distribution; <b>sampling</b> picks one token from it. <b>Temperature</b> T divides the "
            "logits before the softmax: T &lt; 1 sharpens the distribution (towards <b>greedy</b>, always the top token), "
            "T &gt; 1 flattens it. <b>Top-k</b> keeps the k most likely tokens; <b>top-p</b> walks down the candidates, "
            "adding their probabilities until the sum reaches P, keeps those and renormalises them to sum to 1. The "
            "<b>repetition penalty</b> makes tokens already in the text less likely. The chosen token is appended to "
            "the text, and the whole loop runs again for the next one.")
    temps = c["temperatures"]
    t_rows = [[_piece(r["piece"]), f"{r['logit']:.3f}", *[_p(r[f"T={t:g}"]) for t in temps]] for r in c["temperature_table"]]
    def w_row(r):
        return [_piece(r["piece"]), _p(r["prob"]), f"{r['cumulative']:.4f}", "kept" if r["kept"] else "stop: P reached",
                _p(r["renormalised"])]
    steps = walk["walk"]
    more = len(steps) - WALK_ROWS
    # A long walk: its first rows, then the last ones, so that the first candidate left out (the
    # row "stop: P reached") is always shown.
    w_rows = ([w_row(r) for r in steps] if more <= 0 else
              [w_row(r) for r in steps[:WALK_ROWS - 3]]
              + [["…", "", "", f"{more + 1} more kept", ""]] + [w_row(r) for r in steps[-2:]])
    shown = (" (this run's top-p is off: shown at P = {:g})".format(walk["p"]) if walk["shown_only"] else "")
    pen = c["repetition_penalty"]
    p_rows = [[_piece(r["piece"]), f"{r['logit']:.3f}", f"{r['penalised_logit']:.3f}", _p(r["prob"]), _p(r["penalised_prob"])]
              for r in pen["rows"]]
    ch = c["chosen"]
    page = (f"temperature {s['temperature']:g}, top-k {s['top_k']} (0 = off), top-p {s['top_p']:g}, "
            f"repetition penalty {s['repetition_penalty']:g}, seed {s['seed']}")
    top = c.get("follow", "sampled") == "top"
    settings = (f"This lesson follows the model's most likely token at each step (greedy). The tables show the page's "
                f"sampling settings ({page}); choose “a sampled token” above to follow a draw instead."
                if top else f"This run draws with the page's sampling settings: {page} (change them there and start "
                "the lesson again to see their effect).")
    return text, (f"<p class='lesson-note'>{escape(settings)}</p>"
                  + "<h4>Temperature: the top candidates' probability at T = " + ", ".join(f"{t:g}" for t in temps) + "</h4>"
                  + _table(["token", "logit", *[f"T = {t:g}" for t in temps]], t_rows)
                  + f"<p class='lesson-note'>Greedy takes {_piece(c['greedy']['piece'])} (p {_p(c['greedy']['prob'])}). "
                    f"Top-k {c['top_k']['k']}{' (shown; off in this run)' if c['top_k']['shown_only'] else ''} keeps "
                    f"{_p(c['top_k']['kept_mass'])} of the probability.</p>"
                  + f"<h4>The top-p walk, P = {walk['p']:g}{escape(shown)}: {walk['kept']} kept, mass {walk['kept_mass']:.4f}</h4>"
                  + _table(["token", "p entering top-p", "running sum", "", "after renormalising"], w_rows)
                  + f"<h4>Repetition penalty {pen['penalty']:g}{' (shown; off in this run)' if pen['shown_only'] else ''} on the prompt's own tokens</h4>"
                  + f"<p class='lesson-note'>{escape(pen['rule'])}.</p>"
                  + _table(["token", "logit", "penalised", "p", "p penalised"], p_rows)
                  + (f"<p class='lesson-note'>The prompt's {pen['seen']} distinct tokens, the {len(p_rows)} most likely "
                     "listed.</p>" if pen.get("seen", 0) > len(p_rows) else "")
                  + (f"<p class='lesson-result'>Appended: {_piece(ch['piece'])}, the most likely token (raw p "
                     f"{_p(ch['raw_prob'])}, rank {ch['rank']}). " if top else
                     f"<p class='lesson-result'>Appended: {_piece(ch['piece'])} (raw p {_p(ch['raw_prob'])}, p sampled from "
                     f"{_p(ch['prob'])}, rank {ch['rank']}). ")
                  + f"Repeating the loop {_count(len(c['run_tokens']), 'time')} gave: <q>{escape(c['run_text'])}</q></p>")


def _prefill_decode(c: dict) -> tuple[str, str]:
    roof, pre, dec = c["roofline"], c["prefill"], c["decode"]
    reused = (f" {c['prompt_tokens_reused']} of its positions came from the prefix cache (a run before had the same "
              "start), so this prefill computed only the rest." if c["prompt_tokens_reused"] else "")
    text = ("Generating has two phases. <b>Prefill</b> reads the whole prompt at once and ends with the first new token: "
            f"its time is the <b>time to first token</b>, here <b>{_ms(c['ttft_ms'])}</b> for {c['prompt_tokens']} tokens."
            + reused + f" Then each <b>decode</b> step makes one token: <b>{_ms(c['decode_step_ms'])}</b> a step here (median "
            f"of {len(c['decode_ms'])}). Both read every weight once, but prefill multiplies them by {c['prompt_tokens']} "
            "vectors and decode by one: its <b>arithmetic intensity</b> (FLOPs per byte read) is far lower. On the "
            "<b>roofline</b> of this machine (below) a pass left of the ridge is limited by memory bandwidth, right of it "
            "by arithmetic: decode sits on the bandwidth slope, and prefill moves towards the compute roof as the prompt grows.")
    rows = [[escape(p["pass"]), _ms(p["seconds"] * 1000 if p["seconds"] else None), si(p["flops"], "FLOPs"), mib(p["bytes"]),
             f"{p['intensity']:.2f}", si(p["achieved_flops"], "FLOP/s") if p["achieved_flops"] else "–",
             si(p["attainable_flops"], "FLOP/s"), p["bound"]] for p in (pre, dec)]
    return text, (_table(["pass", "measured", "FLOPs", "bytes read", "FLOPs/byte", "achieved", "roof allows", "bound by"], rows)
                  + roofline_svg(c)
                  + f"<p class='lesson-note'>This machine, measured now: peak {si(roof['peak_flops'], 'FLOP/s')}, "
                    f"bandwidth {si(roof['bandwidth'], 'B/s')}, ridge at {roof['ridge_flops_per_byte']:.2f} FLOPs/byte. "
                    f"How: {escape(roof['how'])}. Times are of this run, beside whatever else the machine was doing.</p>"
                  + (f"<p class='lesson-note'>This model computes on its GGUF file's quantized blocks: a decode step reads "
                     f"them as stored, {mib(dec['bytes'])} with the KV cache ({mib(c['decode_bytes_float32'])} if they "
                     "were float32); prefill multiplies float32 tiles dequantized from them, counted at float32.</p>"
                     if c["decode_reads_blocks"] else "")
                  + ("<p class='lesson-note'>⚠ A pass measured above the roof: the machine was busier while its peaks "
                     "were measured (other programs share its cores and memory) than during the run. Start the lesson "
                     "again for a new measurement.</p>" if pre["above_roof"] or dec["above_roof"] else ""))


def _kv_cache(c: dict) -> tuple[str, str]:
    text = ("In attention, each new token needs the <b>keys and values</b> of every earlier position. They do not change "
            "once computed, so the engine keeps them: the <b>KV cache</b>. Its size per position is "
            f"<b>{escape(c['formula'])} = {c['bytes_per_position']:,} bytes</b> (2 for K and V), so it grows by that much "
            f"with every token: {mib(c['bytes_per_position'] * (c['prompt_tokens'] + c['steps'] - 1))} after the "
            f"{c['steps']} steps below ({c['prompt_tokens'] + c['steps'] - 1:,} positions), {mib(c['full_context_bytes'])} "
            f"for the full context of {c['context_window']:,} positions. Without a cache every step would recompute all earlier positions. "
            f"Below, the same {c['steps']} greedy tokens made both ways, measured now: without the cache "
            f"<b>{c['without_cache_total_ms']:.0f} ms</b>, with it <b>{c['with_cache_total_ms']:.0f} ms</b> "
            f"(×{c['time_ratio']:.2f} the time, ×{c['flops_ratio']:.2f} the FLOPs)"
            + (", and the same tokens." if c["same_tokens"] else "; the tokens differ (a near tie between two candidates)."))
    n, per = c["prompt_tokens"], c["bytes_per_position"]
    rows = [[str(s), str(n + s), mib(per * (n + s)), f"{c['with_cache_ms'][s]:.1f}", f"{c['without_cache_ms'][s]:.1f}",
             si(c["with_cache_flops"][s]), si(c["without_cache_flops"][s]), _piece(c["tokens"][s])]
            for s in range(c["steps"])]
    return text, (lines_svg([(c["without_cache_ms"], "without a cache", "#dc2626"),
                              (c["with_cache_ms"], "with the KV cache", "#2563eb")], "ms a step")
                  + lines_svg([(c["without_cache_flops"], "without a cache", "#dc2626"),
                                (c["with_cache_flops"], "with the KV cache", "#2563eb")], "FLOPs a step")
                  + _table(["step", "positions cached", "KV cache", "with cache, ms", "without, ms", "FLOPs with",
                            "FLOPs without", "token"], rows)
                  + "<p class='lesson-note'>Step 0 is the prefill, the same work both ways. Each step is timed twice (the "
                    "better kept) and the two runs' steps are taken in turn, so that whatever else the machine does slows both alike. The cache allocated here holds "
                    f"{c['allocated_bytes_per_position']:,} bytes per position, as the formula says.</p>")


def _flops(c: dict) -> tuple[str, str]:
    here, llama = c["model"], c["llama_7b"]
    bm, bl = c["textbook"]["model"], c["textbook"]["llama_7b"]
    text = (f"One token costs <b>{si(here[-1]['flops'], 'FLOPs')}</b> in this model (a multiply-add counts 2, context "
            f"{c['context']}), counted by the same code as every stage of the page. The same code on LLaMA-7B's "
            f"configuration ({c['llama_7b_config']['n_layers']} layers, {c['llama_7b_config']['hidden']} hidden, "
            f"{c['llama_7b_config']['intermediate']} intermediate, {c['llama_7b_config']['n_heads']} heads, vocabulary "
            f"{c['llama_7b_config']['vocab_size']:,}) gives <b>{si(llama[-1]['flops'], 'FLOPs')}</b>. Almost all of it is "
            "the matrix multiplications; attention over the context grows with the context.")
    rows = [[escape(a["component"]), si(a["flops"]), f"{a['share']:.1%}", si(b["flops"]), f"{b['share']:.1%}"]
            for a, b in zip(here, llama)]
    simplifications = [
        f"“2 × parameters”: {si(bm['two_times_params'])} here, {si(bl['two_times_params'])} for LLaMA-7B, against the exact "
        f"{si(bm['exact'])} and {si(bl['exact'])}: it leaves out attention over the context and the norms.",
        f"Two MLP matrices (GPT-2's MLP) instead of three (gated): LLaMA-7B's MLP is {si(bl['mlp_three_matrices'])} FLOPs, "
        f"not {si(bl['mlp_two_matrices'])}.",
        f"LayerNorm instead of RMSNorm: the norms are {bm['norms_share']:.2%} of the FLOPs here, so it changes nothing visible.",
        f"The KV cache counted with all {'query ' if bm['kv_bytes_all_heads'] != bm['kv_bytes_kv_heads'] else ''}heads: "
        f"{bm['kv_bytes_all_heads']:,} bytes a position here instead of {bm['kv_bytes_kv_heads']:,} with its KV heads"
        + (" (grouped-query attention)." if bm["kv_bytes_all_heads"] != bm["kv_bytes_kv_heads"] else " (the same: one KV head per query head)."),
    ]
    m, g = c["this_machine"], c["gpu"]
    limits = [["this machine (measured roofline), this model", f"{m['compute_bound_tokens_per_s']:,.0f}",
               f"{m['bandwidth_bound_tokens_per_s']:,.1f}",
               f"{m['measured_tokens_per_s']:.1f}" if m["measured_tokens_per_s"] else "–"],
              [f"{escape(g['name'])}, this model (bf16)", f"{g['model']['compute_bound_tokens_per_s']:,.0f}",
               f"{g['model']['bandwidth_bound_tokens_per_s']:,.0f}", "–"],
              [f"{escape(g['name'])}, LLaMA-7B (bf16)", f"{g['llama_7b']['compute_bound_tokens_per_s']:,.0f}",
               f"{g['llama_7b']['bandwidth_bound_tokens_per_s']:,.0f}", "–"]]
    return text, (_table(["component", "this model", "share", "LLaMA-7B", "share"], rows)
                  + "<h4>Where textbook figures differ from the exact count</h4><ul>"
                  + "".join(f"<li>{escape(s)}</li>" for s in simplifications) + "</ul>"
                  + "<h4>What it implies: tokens per second for one sequence</h4>"
                  + _table(["", "if compute-bound (peak ÷ FLOPs/token)", "if bandwidth-bound (bytes/s ÷ bytes/token)", "measured"], limits)
                  + f"<p class='lesson-note'>The GPU's peaks are its datasheet's ({si(g['peak_flops'], 'FLOP/s')}, "
                    f"{si(g['bandwidth'], 'B/s')}), not measured. One sequence decodes at the lower of the two, "
                    "bandwidth: the reason servers batch many sequences into each step.</p>"
                  + ("<p class='lesson-note'>⚠ Measured faster than the bandwidth bound: the machine was busier while its "
                     "bandwidth was measured than during the run.</p>"
                     if (m["measured_tokens_per_s"] or 0) > m["bandwidth_bound_tokens_per_s"] else ""))


RENDER = {"tokenize": _tokenize, "embed": _embed, "rope": _rope, "layers": _layers, "lm_head": _lm_head,
          "sampling": _sampling, "prefill_decode": _prefill_decode, "kv_cache": _kv_cache, "flops": _flops}


MODES = {"completion": "completion mode: the prompt is a text the model continues",
         "chat": "chat mode: your message inside the model's chat template"}
FOLLOWS = {"top": "it follows the most likely token at each step",
           "sampled": "it follows a token sampled with the page's settings (seed {seed})"}


def context_note(lesson: dict) -> str:
    """" · chat mode: … · it follows …": how the lesson read the prompt and which token it follows,
    and why the mode is not the page's where it is not (an example is a text to continue)."""
    if "mode" not in lesson:
        return ""
    mode = MODES[lesson["mode"]]
    page = lesson.get("page_mode")
    if page and page != lesson["mode"]:
        mode += f" (the page is in {page} mode; {escape(lesson.get('why_mode') or 'chosen above')})"
    return f" · {mode} · " + FOLLOWS[lesson.get("follow", "top")].format(seed=lesson.get("seed", "?"))


def chapter_html(lesson: dict, index: int) -> str:
    """Chapter `index` (0-based) of a lesson {"model", "prompt", "chapters"}: its title, the
    explanation, its numbers and where to explore further."""
    chapters = lesson["chapters"]
    c = chapters[index]
    text, numbers = RENDER[c["key"]](c)
    explore = ", ".join(f"<a href='#{eid}'>{escape(name)}</a>" for eid, name in EXPLORE[c["key"]])
    steps = "".join(f"<li class='{'lesson-here' if k == index else ''}'>{k + 1}. {escape(x['title'])}</li>"
                    for k, x in enumerate(chapters))
    return gloss(f"<div class='lesson' id='lesson-chapter-{c['key']}'>"
            f"<ol class='lesson-steps' aria-label='chapters'>{steps}</ol>"
            f"<h3>Chapter {c['chapter']} of {len(chapters)}: {escape(c['title'])}</h3>"
            f"<p class='lesson-context'>{escape(lesson['model'])} · prompt <q>{escape(lesson['prompt'])}</q>"
            f"{context_note(lesson)}</p>"
            f"<p class='lesson-text'>{text}</p>{numbers}"
            f"<p class='lesson-explore'>Explore further on this page: {explore}.</p></div>")
