"""The benchmarks' results written out: JSON and markdown files, and the parts of their markdown
more than one benchmark writes (the step against its read-bound time, llama.cpp's builds)."""

from __future__ import annotations

import json
from pathlib import Path


def save(out_dir, stem: str, data, md: str) -> None:
    """Write a benchmark's results as out_dir/stem.json and .md, and print the markdown."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(data, indent=2))
    (out / f"{stem}.md").write_text(md)
    print(md)


def to_markdown(r: dict) -> str:
    """bench.run's result in words: ratios, the systems' table, the step against its bytes, the builds."""
    lines = [f"# Token Lab benchmark: {r['model']} on {r['device']} ({r['dtype']}, decode weights "
             f"{r.get('weights', r['decode_dtype'])})", ""]
    for k, v in r["ratios"].items():
        lines.append(f"- **{k}**: " + (", ".join(f"{x:.2f}×" for x in v) if isinstance(v, list) else f"{v:.2f}×"))
    lines += ["", "| system | TTFT 128 | TTFT 512 | decode tok/s | p50 ms | p95 ms |", "|---|---|---|---|---|---|"]
    for name, s in r["systems"].items():
        if s is None:
            lines.append(f"| {name} | not installed | | | | |")
            continue
        f = lambda v, fmt="{:.1f}": "–" if v is None else fmt.format(v)  # noqa: E731
        lines.append(f"| {name} | {f(s['ttft_128_ms'], '{:.0f} ms')} | {f(s['ttft_512_ms'], '{:.0f} ms')} | "
                     f"{f(s['decode_tok_s'])} | {f(s['p50_ms'])} | {f(s['p95_ms'])} |")
    ours = r["systems"]["token-lab"]
    lines += ["", f"- instrumentation overhead (top-N, raw and final probabilities, entropy, rank, stored "
                  f"logits, KV stats): {ours['instrumentation_ms']:.2f} ms a step timed directly = "
                  f"{ours['instrumentation_direct_pct']:.1f}% of a decode step; end to end "
                  f"{ours['instrumentation_overhead_pct']:.1f}% (noisy)",
              f"- bytes read per decode token: {r['bytes_read_per_token'] / 2**20:.0f} MiB; achieved "
              f"{ours['achieved_gb_s']:.1f} GB/s = {100 * ours['roofline_fraction']:.0f}% of the copy "
              f"bandwidth measured in this run ({r['copy_bandwidth_gb_s']:.1f} GB/s read + written); at the read "
              f"bandwidth measured ({r['read_bandwidth_gb_s']:.1f} GB/s, a sum over {r.get('read_mib', 1024)} MiB; the median of "
              f"{len(r['read_bandwidth_samples_gb_s'])} measurements in this run, "
              f"{min(r['read_bandwidth_samples_gb_s']):.1f}-{max(r['read_bandwidth_samples_gb_s']):.1f}) those bytes take "
              f"{ours['read_bound_ms']:.1f} ms: a decode step takes {ours['times_read_bound']:.2f}× that",
              f"- peak RSS: {r['peak_rss_mib']:.0f} MiB"]
    if "page_tok_s" in ours:
        lines.append(f"- the page (bench/page_client.py streaming from the real app) receives {ours['page_tok_s']:.1f} "
                     f"tok/s = {100 * ours['page_fraction']:.0f}% of the engine's decode rate alone on the same "
                     f"prompt ({ours['page_engine_tok_s']:.1f} tok/s; runs alternated, medians)")
    lines += read_bound_lines(r["read_bound"]) + llama_lines(r.get("llama_cpp"))
    q = r.get("quality_guard")
    if q:
        lines.append(f"- quality guard vs float32: top-1 equal on {100 * q['top1_agreement']:.1f}% of "
                     f"{q['steps']} steps; largest probability difference {q['max_prob_diff']:.4f}")
    return "\n".join(lines) + "\n"


def read_bound_lines(bound: dict) -> list[str]:
    """The step's fraction of its read-bound time, a row per system and number of rows."""
    if not bound:
        return []
    lines = ["", "Fraction of the read-bound time (the bytes a step reads at the read bandwidth measured beside "
             "each round, against the round's step; 100% is a step that only streams its bytes):", "",
             "| system | rows | bytes a step | fraction (median) | each round |", "|---|---|---|---|---|"]
    for name, b in bound.items():
        lines.append(f"| {name} | {b['rows']} | {b['step_bytes'] / 2**20:.1f} MiB | {100 * b['read_bound_fraction']:.0f}% | "
                     + ", ".join(f"{100 * x:.0f}%" for x in b["read_bound_fraction_by_round"]) + " |")
    return lines


def llama_lines(figures: dict | None) -> list[str]:
    """Which llama.cpp build each figure came from, and what each build is."""
    if not figures:
        return []
    lines = ["", "llama.cpp's builds:"]
    if "decode_from" in figures:  # bench.run's: which build each of its ratios is against
        ttft = figures["ttft_from"] or "none (no build evaluated its prompt batched: TTFT not compared)"
        lines[-1] = f"llama.cpp: decode ratios against the {figures['decode_from']} build, time to first token against {ttft}."
    for build, r in figures["builds"].items():
        died = f" (its batched prompt died of signal {-r['batched_prompt_died']})" if "batched_prompt_died" in r else ""
        lines.append(f"- {build}: llama-cpp-python {r['version']}, prompt {r['prompt']}{died}, {r['threads']} threads; "
                     f"`{r['system_info']}`")
    lines += [f"- {build}: did not start ({why})" for build, why in figures.get("not_started", {}).items()]
    return lines


def fractions(result: dict) -> dict:
    """A bench.run or bench.users result's read-bound fractions: {"system, rows": fraction}."""
    if "read_bound" in result:  # bench.run's
        return {f"{name} ({b['rows']} row{'s' * (b['rows'] != 1)})": b["read_bound_fraction"]
                for name, b in result["read_bound"].items()}
    return {f"{system} ({n} row{'s' * (int(n) != 1)})": r["read_bound_fraction"]  # bench.users'
            for system, by_n in result["systems"].items() for n, r in by_n.items() if "read_bound_fraction" in r}


def main(argv=None) -> int:
    """python -m bench.report FILE.json... [--goal 0.65]: each result's step against its read-bound
    time, a line per system and number of rows (bench/gpu_check.sh's summary: on a GPU, against the
    HBM read bandwidth measured in the same run)."""
    import argparse
    p = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--goal", type=float, default=None, help="a fraction to hold each 1-row figure against")
    args = p.parse_args(argv)
    for path in args.files:
        result = json.loads(Path(path).read_text())
        print(f"{path}: {result['model']} on {result['device']} ({result['dtype']})")
        for name, f in fractions(result).items():
            goal = "" if args.goal is None or "(1 row)" not in name else \
                f"  ({'meets' if f >= args.goal else 'below'} the goal of {100 * args.goal:.0f}%)"
            print(f"  {name}: {100 * f:.0f}% of the read-bound rate{goal}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
