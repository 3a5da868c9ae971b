"""The lesson's two charts, drawn as SVG at about a phone's width (their 13 px labels stay readable
there): this machine's roofline with the prefill and decode passes on it, and the per-step lines of
the run with and without a KV cache."""

from __future__ import annotations

import math
from html import escape

from inference.lesson.summary import si


def roofline_svg(c: dict) -> str:
    roof = c["roofline"]
    peak, bw = roof["peak_flops"], roof["bandwidth"]
    pts = [(c["prefill"], "prefill", "#dc2626"), (c["decode"], "decode", "#2563eb")]
    xs = [p["intensity"] for p, _, _ in pts] + [roof["ridge_flops_per_byte"]]
    x0, x1 = 10 ** math.floor(math.log10(min(xs) / 3)), 10 ** math.ceil(math.log10(max(xs) * 3))
    y1 = 10 ** math.ceil(math.log10(peak * 2))
    y0 = y1 / 1e4
    # Drawn at about its size on a phone (the panel's width there): its 13 px labels stay readable.
    W, H, L, B = 400, 260, 54, 38

    def X(v):
        return L + (math.log10(v) - math.log10(x0)) / (math.log10(x1) - math.log10(x0)) * (W - L - 10)

    def Y(v):
        v = max(v, y0)
        return H - B - (math.log10(v) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)) * (H - B - 10)

    ridge = peak / bw
    xa = max(x0, y0 / bw)
    line = f"M{X(xa):.1f},{Y(xa * bw):.1f} L{X(ridge):.1f},{Y(peak):.1f} L{X(x1):.1f},{Y(peak):.1f}"
    parts = [f"<path d='{line}' fill='none' stroke='#111' stroke-width='2'/>"]
    for p, name, colour in pts:
        if p["achieved_flops"]:
            parts.append(f"<circle cx='{X(p['intensity']):.1f}' cy='{Y(p['achieved_flops']):.1f}' r='6' fill='{colour}'/>"
                         f"<text x='{X(p['intensity']) + 9:.1f}' y='{Y(p['achieved_flops']) + 4:.1f}' font-size='14' fill='{colour}'>{name}</text>")
    ticks = []
    e = math.log10(x0)
    while e <= math.log10(x1) + 1e-9:
        ticks.append(f"<text x='{X(10 ** e):.1f}' y='{H - B + 16}' font-size='13' text-anchor='middle'>{10 ** e:g}</text>")
        e += 1
    e = math.log10(y0)
    while e <= math.log10(y1) + 1e-9:
        ticks.append(f"<text x='{L - 4}' y='{Y(10 ** e) + 4:.1f}' font-size='13' text-anchor='end'>{si(10 ** e)}</text>")
        e += 1
    labels = (f"<text x='{(L + W) / 2}' y='{H - 6}' font-size='13' text-anchor='middle'>arithmetic intensity (FLOPs per byte read)</text>"
              f"<text x='12' y='{(H - B) / 2}' font-size='13' text-anchor='middle' transform='rotate(-90 12 {(H - B) / 2})'>FLOP/s</text>"
              f"<text x='{X(x1) - 4:.1f}' y='{Y(peak) - 6:.1f}' font-size='13' text-anchor='end'>peak {si(peak, 'FLOP/s')}</text>"
              f"<text x='{X(xa) + 6:.1f}' y='{Y(xa * bw) - 8:.1f}' font-size='13'>{si(bw, 'B/s')}</text>")
    return (f"<svg class='lesson-chart' viewBox='0 0 {W} {H}' role='img' aria-label='roofline of this machine'>"
            f"<rect x='{L}' y='10' width='{W - L - 10}' height='{H - B - 10}' fill='none' stroke='#ccc'/>"
            + "".join(parts) + "".join(ticks) + labels + "</svg>")


def lines_svg(series: list[tuple[list[float], str, str]], ylabel: str) -> str:
    W, H, L, B = 400, 216, 50, 50  # the step ticks, the axis's name, then the legend on a line of its own
    n = max(len(s) for s, _, _ in series)
    top = max(max(s) for s, _, _ in series) * 1.1 or 1

    def X(i):
        return L + i / max(n - 1, 1) * (W - L - 10)

    def Y(v):
        return H - B - v / top * (H - B - 10)

    parts = []
    for values, name, colour in series:
        pts = " ".join(f"{X(i):.1f},{Y(v):.1f}" for i, v in enumerate(values))
        parts.append(f"<polyline points='{pts}' fill='none' stroke='{colour}' stroke-width='2'/>")
    legend = "".join(f"<text x='{L + 8 + 170 * k}' y='{H - 4}' font-size='13' fill='{c}'>— {escape(name)}</text>"
                     for k, (_, name, c) in enumerate(series))
    ticks = (f"<text x='{L - 4}' y='{Y(top / 1.1) + 4:.1f}' font-size='13' text-anchor='end'>{si(top / 1.1)}</text>"
             f"<text x='{L - 4}' y='{Y(0) + 4:.1f}' font-size='13' text-anchor='end'>0</text>"
             + "".join(f"<text x='{X(i):.1f}' y='{H - B + 14}' font-size='13' text-anchor='middle'>{i}</text>" for i in range(n)))
    return (f"<svg class='lesson-chart' viewBox='0 0 {W} {H}' role='img' aria-label='{escape(ylabel)} per step'>"
            f"<rect x='{L}' y='10' width='{W - L - 10}' height='{H - B - 10}' fill='none' stroke='#ccc'/>"
            + "".join(parts) + legend + ticks
            + f"<text x='{(L + W) / 2}' y='{H - B + 30}' font-size='13' text-anchor='middle'>step</text>"
            + f"<text x='12' y='{(H - B) / 2}' font-size='13' text-anchor='middle' transform='rotate(-90 12 {(H - B) / 2})'>{escape(ylabel)}</text></svg>")
