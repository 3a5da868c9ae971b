"""The benchmark runs end to end (on random weights of a tiny shape) and reports what it says."""

import json
import shutil

import pytest

from bench.run import main


def test_bench_reports_ratios_table_and_json(tmp_path):
    assert main(["--random", "tiny", "--tokens", "8", "--repeats", "1", "--no-page", "--device", "cpu",
                 "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "bench-tiny.json").read_text())
    ours = result["systems"]["token-lab"]
    assert ours["decode_tok_s"] > 0 and ours["p95_ms"] >= ours["p50_ms"] > 0
    assert 0 < ours["roofline_fraction"] < 1.5 and result["copy_bandwidth_gb_s"] > 0
    assert "instrumentation_overhead_pct" in ours and result["peak_rss_mib"] > 0
    # A decode step of the tiny shape (hidden 64, FFN 128, 2 layers, 4 heads of 16, 2 KV heads,
    # 512 tokens, untied) at the run's middle position 32 + 8 / 2, float32: every weight but the
    # embedding table, one row of that, and K and V of 36 positions in both layers.
    weights = 2 * (64 * (64 + 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 512 * 64 + 64 + 64
    assert result["bytes_read_per_token"] == 4 * (weights + 2 * 2 * 36 * 32)
    md = (tmp_path / "bench-tiny.md").read_text()
    assert "| token-lab |" in md and "| token-lab (no instrumentation) |" in md


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="inductor needs a C++ compiler on the CPU")
def test_bench_compiled_decode(tmp_path):
    assert main(["--random", "tiny", "--tokens", "8", "--repeats", "1", "--no-page", "--device", "cpu",
                 "--compile", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "bench-tiny-compiled.json").read_text())
    assert result["compiled"] and result["systems"]["token-lab"]["decode_tok_s"] > 0
    assert "compiled decode step" in (tmp_path / "bench-tiny-compiled.md").read_text()


def test_page_measurement_receives_every_token(hold):
    """The page measurement: the real app, a gradio_client in another process, and the engine
    alone in turn; every requested token arrives at the client."""
    from bench.run import measure_page, random_engine
    engine = random_engine("tiny", "cpu", "float32")
    hold(engine).one_token_per_update()  # tokens arrive over several updates, as with a real model
    page = measure_page(engine, 8, rounds=2)
    assert page["tokens_received"] == [8, 8]
    assert page["tok_s"] > 0 and page["engine_tok_s"] > 0 and page["rounds"] == 2
