"""Each chapter's headline numbers in one line: the CLI's output without --jsonl, and the line
under each chapter's title on the page."""

from __future__ import annotations


def si(x: float, unit: str = "") -> str:
    """1234567 -> "1.23 M" + unit."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}".rstrip()


def mib(n: int) -> str:
    return f"{n / 2 ** 20:,.1f} MiB" if n >= 2 ** 20 else f"{n / 1024:,.1f} KiB"


def summary_line(c: dict) -> str:
    """One line of a chapter's numbers, prefixed by its number and title."""
    key = c["key"]
    if key == "tokenize":
        line = (f"{c['n_chars']} characters → {c['n_tokens']} tokens of a {c['vocab_size']:,}-token vocabulary: "
                + " | ".join(f"{t['id']} {t['piece']!r}" for t in c["tokens"]))
        if c["examples"]["split_character"]:
            line += f"; a character in byte tokens: {c['examples']['split_character']}"
    elif key == "embed":
        last = c["rows"][-1]
        line = (f"embedding matrix {c['shape'][0]:,} × {c['shape'][1]:,} {c['dtype']} = {mib(c['bytes'])}; "
                f"the last token's row: norm {last['norm']:.3f}, first values {last['first_values'][:4]}")
    elif key == "rope":
        s = c["scores"]
        line = (f"θ {c['theta']:g}, head dim {c['head_dim']}; pair 0 turns {c['pairs'][0]['radians_per_position']:.3g} rad a position, "
                f"pair {c['pairs'][-1]['pair']} {c['pairs'][-1]['radians_per_position']:.3g}; the same query/key at distance "
                f"{s[0]['distance']}: score {s[0]['score']:.5f} at positions {s[0]['query_position']}/{s[0]['key_position']}, "
                f"{s[-1]['score']:.5f} at {s[-1]['query_position']}/{s[-1]['key_position']}")
    elif key == "layers":
        line = (f"{c['n_layers']} layers of: Q [{c['n_positions']}, {c['n_heads']}, {c['head_dim']}], K and V "
                f"[{c['n_positions']}, {c['n_kv_heads']}, {c['head_dim']}], scores [{c['n_heads']}, {c['n_positions']}, "
                f"{c['n_positions']}] under a causal mask, MLP {c['hidden']} → {c['intermediate']} → {c['hidden']} "
                f"(×{c['expansion']:.2f}, 3 matrices); {si(c['layer_flops'], 'FLOPs')} a layer for this prompt")
    elif key == "lm_head":
        line = (f"hidden [{c['hidden']}] → {c['vocab_size']:,} logits ({'tied to the embedding' if c['tied'] else 'own weights, ' + c['dtype'] + ', ' + mib(c['bytes'])}); top: "
                + ", ".join(f"{t['piece']!r} {t['logit']:.2f} (p {t['prob']:.4f})" for t in c["top"][:5]))
    elif key == "sampling":
        t = c["temperature_table"][0]
        walk = c["top_p"]
        line = (f"top candidate {t['piece']!r}: p {t['T=0.1']:.4f} at T 0.1, {t['T=1']:.4f} at T 1, {t['T=2']:.4f} at T 2; "
                f"top-p {walk['p']:g} keeps {walk['kept']} (mass {walk['kept_mass']:.4f}); "
                f"appended {c['chosen']['piece']!r} (p {c['chosen']['prob']:.4f}); the run: {c['run_text']!r}")
    elif key == "prefill_decode":
        roof, pre, dec = c["roofline"], c["prefill"], c["decode"]
        line = (f"TTFT {c['ttft_ms']:.1f} ms ({si(pre['flops'], 'FLOPs')}, {mib(pre['bytes'])}, {pre['intensity']:.2f} FLOPs/byte, "
                f"{pre['bound']} bound); decode {c['decode_step_ms']:.1f} ms a step ({si(dec['flops'], 'FLOPs')}, "
                f"{dec['intensity']:.2f} FLOPs/byte, {dec['bound']} bound); roofline here: {si(roof['peak_flops'], 'FLOP/s')}, "
                f"{si(roof['bandwidth'], 'B/s')}, ridge {roof['ridge_flops_per_byte']:.2f} FLOPs/byte")
    elif key == "kv_cache":
        line = (f"{c['formula']} = {c['bytes_per_position']:,} bytes a position; {c['steps']} steps without a cache "
                f"{c['without_cache_total_ms']:.0f} ms vs {c['with_cache_total_ms']:.0f} ms with it "
                f"(×{c['time_ratio']:.2f} time, ×{c['flops_ratio']:.2f} FLOPs), same tokens: {c['same_tokens']}")
    elif key == "flops":
        here, llama = c["model"][-1], c["llama_7b"][-1]
        line = (f"{si(here['flops'], 'FLOPs')} a token here (context {c['context']}), LLaMA-7B {si(llama['flops'], 'FLOPs')}; "
                f"this machine's roofline allows {c['this_machine']['bandwidth_bound_tokens_per_s']:.1f} tokens/s by bandwidth, "
                f"measured {c['this_machine']['measured_tokens_per_s']:.1f}")
    else:
        line = ""
    return f"{c['chapter']}. {c['title']}: {line}"
