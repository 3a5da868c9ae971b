"""The quantization lens's HTML: a row of numbers per precision, three charts per step (the KL
divergence from float32, the rank of float32's top token, top-1 agreement) with each precision's
fork step marked, and the two texts where they fork. Pure functions of the lens's results
(inference/lenses/precisions.py's PrecisionResult), float32's first; every term glossed."""

from __future__ import annotations

import math
from html import escape

from inference.lenses.quantize import TYPES
from ui.format import count, token_label
from ui.glossary import gloss
from ui.widgets import SERIES_COLORS

LOCAL_ONLY = ("The quantization lens reads the model's own weights again in float32: this model's are not here "
              "(a model behind a server, or one made in memory).")

# The charts are drawn at about a phone's width (their 13 px labels stay readable there), as the lesson's.
W, H, L, R, T, B = 400, 230, 56, 12, 12, 42
KL_FLOOR = 1e-12  # a KL of 0 (or a rounding's -1e-17) is drawn here, on the log axis's floor


def shown_name(precision: str) -> str:
    """A precision as the page names it: a quantized type as GGUF writes it (q4_0 -> Q4_0), float32,
    the file's own blocks, or another file's name."""
    return precision.upper() if precision in TYPES else "the file's own blocks" if precision == "file" else precision


def short_name(precision: str) -> str:
    """A precision's name in a chart's row (8 characters at most)."""
    return precision.upper() if precision in TYPES else precision[:8]


def _colors(results) -> dict[str, str]:
    return {r.precision: SERIES_COLORS[i % len(SERIES_COLORS)] for i, r in enumerate(results[1:])}


def model_note_md(note: str | None, local: bool) -> str:
    """What the lens measures on the model picked: its note where the source is a quantized file."""
    if not local:
        return gloss("⚠ " + LOCAL_ONLY)
    return gloss(f"⚠ The model picked: {note}.") if note else ""


def progress_md(done: list, wanted: list[str]) -> str:
    """While it runs: what is measured, what is being made next."""
    have = [shown_name(r.precision) for r in done]
    left = [shown_name(p) for p in wanted[len(done):]]
    now = f"now {'reading float32' if not done else 'making and measuring ' + left[0]}" if left else "finishing"
    return gloss(f"Quantization lens: {len(done)} of {len(wanted)} precisions measured"
                 + (f" ({', '.join(have)})" if have else "") + f"; {now}…")


def summary_md(results: list, note: str | None, stopped: bool = False, busy_note: str = "") -> str:
    """What was measured, on what, and how to read it; the source's note first where it is a
    quantized file."""
    ref = results[0]
    n = len(ref.steps)
    parts = ["**Stopped**: the precisions measured before the stop are shown."] if stopped else []
    if note:
        parts.append(f"⚠ {note[:1].upper()}{note[1:]}.")
    parts.append(f"**Quantization lens**: float32's greedy text of {count(n, 'token')}, read by every precision "
                 f"({', '.join(shown_name(r.precision) for r in results)}). Per step, KL(float32 ‖ precision) of "
                 "the next-token distributions in nats (0: the same), top-1 agreement (both would pick the same "
                 "token) and the rank of float32's top token (1: still the top). Each precision's own greedy text "
                 "gives its fork step (the first step where it writes another token than float32), marked on the "
                 "charts. Bytes per token: the weights one decode step reads; tok/s: its own greedy run's decode, "
                 "measured here" + busy_note + " (one greedy run each: compare them within one lens, not across "
                 "lenses); perplexity: of float32's text under each.")
    return gloss(" ".join(parts))


def table_html(results: list) -> str:
    """A row per precision: bytes per token, decode tok/s, perplexity, mean and max KL, top-1
    agreement and the fork step."""
    rows = []
    for r in results:
        kls = [max(s.kl, 0.0) for s in r.steps]
        agree = sum(s.top1_agree for s in r.steps)
        rate = "–" if r.decode_tokens_per_s is None else f"{r.decode_tokens_per_s:.1f}"
        fork = "never" if r.fork_step is None else str(r.fork_step)
        kls = kls or [0.0]  # (a text of no token: nothing measured)
        rows.append(f"<tr data-precision='{escape(r.precision, quote=True)}'><th>{escape(shown_name(r.precision))}</th>"
                    f"<td class='tl-num'>{r.bytes_per_token:,}</td><td class='tl-num'>{rate}</td>"
                    f"<td class='tl-num'>{r.perplexity:.3f}</td><td class='tl-num'>{sum(kls) / len(kls):.2e}</td>"
                    f"<td class='tl-num'>{max(kls):.2e}</td><td class='tl-num'>{agree} of {len(r.steps)}</td>"
                    f"<td class='tl-num'>{fork}</td></tr>")
    head = ("<tr><th>precision</th><th>bytes per token</th><th>decode tok/s</th><th>perplexity</th><th>mean KL</th>"
            "<th>max KL</th><th>top-1 agreement</th><th>fork step</th></tr>")
    return f"<div class='tl-qlens-wrap'><table class='tl-qlens' id='lens-table'>{head}{''.join(rows)}</table></div>"


def _x(i: int, n: int) -> float:
    return L + (i + 0.5) / max(n, 1) * (W - L - R)


def _axes(n: int, ylabel: str, yticks: list[tuple[float, str]], h: int = H) -> list[str]:
    """The frame, the steps along x and the y ticks of a chart `h` high."""
    parts = [f"<rect x='{L}' y='{T}' width='{W - L - R}' height='{h - T - B}' fill='none' stroke='#ccc'/>"]
    every = max(1, math.ceil(n / 10))
    parts += [f"<text x='{_x(i, n):.1f}' y='{h - B + 15}' font-size='13' text-anchor='middle'>{i}</text>"
              for i in range(0, n, every)]
    parts += [f"<text x='{L - 4}' y='{y + 4:.1f}' font-size='13' text-anchor='end'>{label}</text>"
              f"<line x1='{L}' x2='{W - R}' y1='{y:.1f}' y2='{y:.1f}' stroke='#eee'/>" for y, label in yticks]
    parts.append(f"<text x='{(L + W) / 2}' y='{h - 6}' font-size='13' text-anchor='middle'>step</text>")
    if ylabel:
        parts.append(f"<text x='12' y='{(h - B) / 2}' font-size='13' text-anchor='middle' "
                     f"transform='rotate(-90 12 {(h - B) / 2})'>{escape(ylabel)}</text>")
    return parts


def _forks(results, colors, n: int, h: int = H) -> list[str]:
    """Each precision's fork step: a dashed line in its colour."""
    return [f"<line class='tl-fork' data-precision='{escape(r.precision, quote=True)}' x1='{_x(r.fork_step, n):.1f}' "
            f"x2='{_x(r.fork_step, n):.1f}' y1='{T}' y2='{h - B}' stroke='{colors[r.precision]}' "
            "stroke-dasharray='4 3' stroke-width='1.5'/>" for r in results[1:] if r.fork_step is not None]


def _log_chart(results, values, ylabel: str, floor: float, name: str) -> str:
    """A line per precision (float32's own is the reference: not drawn) on a log axis."""
    colors, n = _colors(results), len(results[0].steps)
    ys = [max(v, floor) for r in results[1:] for v in values(r)] or [floor]
    lo = 10 ** math.floor(math.log10(min(ys)))
    hi = 10 ** math.ceil(math.log10(max(ys) * 1.001))
    hi = hi if hi > lo else lo * 10

    def y(v: float) -> float:
        return H - B - (math.log10(max(v, floor)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * (H - B - T)

    decades = range(round(math.log10(lo)), round(math.log10(hi)) + 1)
    step = max(1, math.ceil(len(decades) / 6))
    parts = _axes(n, ylabel, [(y(10.0 ** e), f"{10.0 ** e:g}") for e in list(decades)[::step]])
    parts += _forks(results, colors, n)
    for r in results[1:]:
        pts = [(_x(i, n), y(v)) for i, v in enumerate(values(r))]
        parts.append(f"<polyline points='{' '.join(f'{a:.1f},{b:.1f}' for a, b in pts)}' fill='none' "
                     f"stroke='{colors[r.precision]}' stroke-width='2'/>")
        parts += [f"<circle cx='{a:.1f}' cy='{b:.1f}' r='2.5' fill='{colors[r.precision]}'/>" for a, b in pts]
    return (f"<svg class='tl-qlens-svg' id='{name}' viewBox='0 0 {W} {H}' role='img' "
            f"aria-label='{escape(ylabel)} per step, one line per precision'>" + "".join(parts) + "</svg>")


def _agree_chart(results) -> str:
    """A row of cells per precision: filled where its top token is float32's, hollow where not;
    its fork step a dashed line. As high as its rows."""
    colors, n = _colors(results), len(results[0].steps)
    rows, row_h = results[1:], 28
    h = T + row_h * len(rows) + B
    cell = (W - L - R) / max(n, 1)
    parts = _axes(n, "", [], h)
    for k, r in enumerate(rows):
        top = T + k * row_h
        parts.append(f"<text x='{L - 4}' y='{top + row_h / 2 + 4:.1f}' font-size='12' text-anchor='end'>"
                     f"{escape(short_name(r.precision))}</text>")
        for s in r.steps:
            fill = colors[r.precision] if s.top1_agree else "#fff"
            parts.append(f"<rect x='{L + s.step * cell + 1:.1f}' y='{top + 3:.1f}' width='{max(cell - 2, 1):.1f}' "
                         f"height='{row_h - 6:.1f}' fill='{fill}' stroke='{colors[r.precision]}'/>")
    parts += _forks(results, colors, n, h)
    return (f"<svg class='tl-qlens-svg' id='lens-agree' viewBox='0 0 {W} {h}' role='img' "
            "aria-label='top-1 agreement per step, one row per precision'>" + "".join(parts) + "</svg>")


def charts_html(results: list) -> str:
    """The three charts per step and their legend (outside the pictures, so that its terms are glossed)."""
    if len(results) < 2:
        return ""
    colors = _colors(results)
    legend = " ".join(f"<span class='tl-qlens-key' style='--c:{c}'>{escape(shown_name(p))}</span>"
                      for p, c in colors.items())
    charts = (("KL(float32 ‖ precision) per step, nats (log scale)",
               _log_chart(results, lambda r: [s.kl for s in r.steps], "KL (nats)", KL_FLOOR, "lens-kl")),
              ("Rank of float32's top token per step (1: still the top; log scale)",
               _log_chart(results, lambda r: [s.rank for s in r.steps], "rank", 1, "lens-rank")),
              ("Top-1 agreement per step (filled: the same top token)", _agree_chart(results)))
    return (f"<div class='tl-qlens-legend'>{legend} <span class='tl-qlens-fork-key'>dashed line: the fork step"
            "</span></div><div class='tl-qlens-charts'>"
            + "".join(f"<figure class='tl-qlens-chart'><figcaption>{escape(title)}</figcaption>{svg}</figure>"
                      for title, svg in charts) + "</div>")


def _shown(text: str) -> str:
    """A text escaped, each character that would print as nothing but a line break or a tab (a
    control character, a zero-width space) written as its code point: ⟨U+000B⟩."""
    return escape("".join(ch if ch.isprintable() or ch in " \n\t" else f"⟨U+{ord(ch):04X}⟩" for ch in text))


def forks_html(results: list, common: dict[str, str]) -> str:
    """float32's greedy text; for each precision that forks, both texts from the fork on
    (common[precision]: the text they share before it)."""
    ref = results[0]
    out = [f"<p class='tl-qlens-text'><b>float32's greedy text</b>: <q>{_shown(ref.text)}</q></p>"]
    for r in results[1:]:
        name = escape(shown_name(r.precision))
        if r.fork_step is None:
            out.append(f"<p class='tl-qlens-text'><b>{name}</b> writes the same greedy text, token for token.</p>")
            continue
        same = common.get(r.precision, "")
        ref_rest = ref.text[len(same):] if ref.text.startswith(same) else ref.text
        rest = r.text[len(same):] if r.text.startswith(same) else r.text
        out.append(f"<div class='tl-qlens-fork' data-precision='{escape(r.precision, quote=True)}'>"
                   f"<b>{name}</b> forks at step {r.fork_step}:"
                   f"<div>float32: <q>{_shown(same)}<mark>{_shown(ref_rest)}</mark></q></div>"
                   f"<div>{name}: <q>{_shown(same)}<mark>{_shown(rest)}</mark></q></div></div>")
    return "".join(out)


def steps_html(results: list, piece=None) -> str:
    """Every step's numbers, as the charts draw them (the charts' text for a screen reader), each
    step with float32's token there (piece: a token id's piece), so that a rank reads against a word."""
    if len(results) < 2:
        return ""
    names = [(r.precision, escape(shown_name(r.precision))) for r in results[1:]]
    head = ("<tr><th>step</th>" + ("<th>float32's token</th>" if piece else "")
            + "".join(f"<th>{n} KL</th><th>{n} top-1</th><th>{n} rank</th>" for _, n in names) + "</tr>")
    rows = []
    tokens = results[0].tokens
    for k in range(len(results[0].steps)):
        token = (f"<td data-metric='token'><code class='tl-piece'>{escape(token_label(piece(tokens[k])))}</code></td>"
                 if piece and k < len(tokens) else ("<td></td>" if piece else ""))
        cells = []
        for r in results[1:]:
            s, p = r.steps[k], escape(r.precision, quote=True)
            cells.append(f"<td class='tl-num' data-precision='{p}' data-metric='kl'>{s.kl:.3e}</td>"
                         f"<td class='tl-num' data-precision='{p}' data-metric='top1'>{'✓' if s.top1_agree else '✗'}</td>"
                         f"<td class='tl-num' data-precision='{p}' data-metric='rank'>{s.rank}</td>")
        rows.append(f"<tr data-step='{k}'><td class='tl-num'>{k}</td>{token}{''.join(cells)}</tr>")
    return ("<details class='tl-qlens-steps'><summary>Every step's numbers</summary><div class='tl-qlens-wrap'>"
            f"<table class='tl-qlens' id='lens-steps'>{head}{''.join(rows)}</table></div></details>")


def view_html(results: list, common: dict[str, str], piece=None) -> str:
    return gloss(table_html(results) + charts_html(results) + forks_html(results, common) + steps_html(results, piece))
