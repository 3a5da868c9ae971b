"""The benchmark runs end to end (on random weights of a tiny shape) and reports what it says."""

import json

import pytest

from bench.run import main


def test_bench_reports_ratios_table_and_json(tmp_path):
    assert main(["--random", "tiny", "--tokens", "8", "--repeats", "1", "--no-page", "--device", "cpu",
                 "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "bench-tiny.json").read_text())
    ours = result["systems"]["token-lab"]
    assert ours["decode_tok_s"] > 0 and ours["p95_ms"] >= ours["p50_ms"] > 0
    # The bandwidth figures are measured (numbers, no bounds: they are the machine's) and the
    # ones derived from them follow from them and the bytes a step reads.
    assert result["copy_bandwidth_gb_s"] > 0 and result["read_bandwidth_gb_s"] > 0
    assert ours["achieved_gb_s"] == pytest.approx(result["bytes_read_per_token"] * ours["decode_tok_s"] / 1e9)
    assert ours["roofline_fraction"] == pytest.approx(ours["achieved_gb_s"] / result["copy_bandwidth_gb_s"])
    assert ours["read_bound_ms"] == pytest.approx(1000 * result["bytes_read_per_token"] / (result["read_bandwidth_gb_s"] * 1e9))
    assert ours["times_read_bound"] == pytest.approx(1000 / ours["decode_tok_s"] / ours["read_bound_ms"])
    assert "instrumentation_overhead_pct" in ours and result["peak_rss_mib"] > 0
    # A decode step of the tiny shape (hidden 64, FFN 128, 2 layers, 4 heads of 16, 2 KV heads,
    # 512 tokens, untied) at the run's middle position 32 + 8 / 2, float32: every weight but the
    # embedding table, one row of that, and K and V of 36 positions in both layers.
    weights = 2 * (64 * (64 + 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 512 * 64 + 64 + 64
    assert result["bytes_read_per_token"] == 4 * (weights + 2 * 2 * 36 * 32)
    md = (tmp_path / "bench-tiny.md").read_text()
    assert "| token-lab |" in md and "| token-lab (no instrumentation) |" in md


def test_page_measurement_receives_every_token(hold):
    """The page measurement: the real app, a gradio_client in another process, and the engine
    alone in turn; every requested token arrives at the client."""
    from bench.run import measure_page, random_engine
    engine = random_engine("tiny", "cpu", "float32")
    hold(engine).one_token_per_update()  # tokens arrive over several updates, as with a real model
    page = measure_page(engine, 8, rounds=2)
    assert page["tokens_received"] == [8, 8]
    assert page["tok_s"] > 0 and page["engine_tok_s"] > 0 and page["rounds"] == 2


def test_cli_measurement_reads_each_step_line_of_its_own_process(tiny_dirs):
    """The command line, run as its users run it, in a process of its own: one line a token
    arrives for every token its summary reports, on the prompt given."""
    from bench.run import measure_cli
    from inference.loading.load import load_tokenizer
    model_dir = tiny_dirs["gqa_tied"]
    prompt = "The history of computing is a story"
    cli = measure_cli(model_dir, "cpu", "float32", prompt, 6, 3)
    assert cli["tokens"] == cli["generated_tokens"] >= 2 and cli["decode_tok_s"] > 0
    assert cli["prompt_tokens"] == len(load_tokenizer(model_dir).encode(prompt))
    with pytest.raises(RuntimeError, match="the CLI run failed"):
        measure_cli(model_dir, "cpu", "float32", " ", 6, 3)  # an empty prompt: the CLI refuses it


def test_users_bench_reports_each_system_and_ratios(tiny_dirs, tmp_path):
    from bench import users
    assert users.main(["--model", str(tiny_dirs["gqa_tied"]), "--device", "cpu", "--users", "1", "3",
                       "--tokens", "6", "--no-page", "--rounds", "2", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "users.json").read_text())
    rows = result["systems"]["engine"]
    assert set(rows) == {"1", "3"} and rows["3"]["users"] == 3
    assert rows["3"]["tokens"] <= 3 * 6 and rows["3"]["aggregate_tok_s"] > 0
    assert "engine: aggregate 3 users / 1 user" in result["ratios"]
    assert (tmp_path / "users.md").read_text() == users.to_markdown(result)


@pytest.mark.parametrize("client", [[], ["--gradio-client"]], ids=["http", "gradio_client"])
def test_users_bench_through_the_page(tiny_dirs, tmp_path, client):
    """The real app and one page client process per user (raw HTTP, or gradio_client), told to
    go together; every user's text is checked against its prompt's text alone."""
    from bench import users
    assert users.main(["--model", str(tiny_dirs["gqa_tied"]), "--device", "cpu", "--users", "1", "2",
                       "--tokens", "4", "--rounds", "1", "--out", str(tmp_path), *client]) == 0
    result = json.loads((tmp_path / "users.json").read_text())
    page = result["systems"]["page"]
    assert page["2"]["users"] == 2 and 2 <= page["2"]["tokens"] <= 8 and page["2"]["clients_cpu_s"] > 0
    assert page["2"]["updates"] >= 2 and page["2"]["server_cpu_s"] > 0
    assert [page["2"]["same_as_alone"], result["systems"]["engine"]["2"]["same_as_alone"]] == [2, 2]
    assert "page: aggregate 2 users / 1 user" in result["ratios"]
    md = (tmp_path / "users.md").read_text()
    assert "CPU-seconds of" in md and "page 2 users 2/2" in md


def test_users_bench_on_random_weights_of_a_published_shape(tmp_path):
    """--random: what bench/gpu_check.sh runs where no checkpoint can be fetched."""
    from bench import users
    assert users.main(["--random", "tiny", "--device", "cpu", "--users", "1", "2", "--tokens", "4",
                       "--no-page", "--rounds", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "users-tiny.json").read_text())
    assert result["model"] == "tiny (random weights)" and result["systems"]["engine"]["2"]["tokens"] == 8


def test_users_bench_reports_the_median_round():
    from bench.users import median_round
    runs = [{"aggregate_tok_s": 30.0, "same_as_alone": 8, "ttft_s_median": 1.0},
            {"aggregate_tok_s": 10.0, "same_as_alone": 7, "ttft_s_median": 3.0},
            {"aggregate_tok_s": 20.0, "same_as_alone": 8, "ttft_s_median": 2.0}]
    assert median_round(runs) == {"aggregate_tok_s": 20.0, "same_as_alone": 7, "ttft_s_median": 2.0,
                                  "rounds_tok_s": [30.0, 10.0, 20.0]}
    assert median_round(runs[:2])["aggregate_tok_s"] == 10.0  # even: the lower middle


def test_adversarial_bench_serves_its_page_and_writes_its_results(tmp_path, monkeypatch):
    """bench.adversarial's main on random weights of the tiny shape: the page it serves in a
    process of its own, with a shared page's limits, answers a user's run and refuses a run past
    the cap; what the measurement returns is written as JSON and markdown. The measurement itself
    (the visitor beside the user, every field it reports) runs end to end in
    tests/shared_page/test_adversarial.py."""
    from gradio_client import Client
    from bench import adversarial

    def one_run(url, pid, runs, work):
        client = Client(url, verbose=False, headers={"X-Forwarded-For": adversarial.GOOD})
        try:
            ttft, text = adversarial.good_run(client)
            with pytest.raises(Exception, match=f"allows at most {adversarial.CAP_TOKENS} new tokens"):
                client.predict(*adversarial.args(max_new_tokens=10_000), api_name="/generate")
        finally:
            client.close()
        assert text and ttft > 0 and runs == 2 and work.is_dir() and adversarial.cpu_s(pid) > 0
        return {"ttft_alone_ms": 1000 * ttft, "ttft_attacked_ms": 2000 * ttft, "ttft_ratio": 2.0, "runs_alone": 1,
                "runs_attacked": 1, "same_text_alone": 1, "same_text_attacked": 1, "refused_empty_cpu_ms": 1.0,
                "refused_8mb_cpu_ms": 2.0, "refused_8mb_round_trip_ms": 3.0,
                "visitor_requests": adversarial.VISITOR_REQUESTS}

    monkeypatch.setattr(adversarial, "measure", one_run)
    assert adversarial.main(["--random", "tiny", "--device", "cpu", "--step-ms", "5", "--runs", "2",
                             "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "adversarial-tiny.json").read_text())
    assert {k: result[k] for k in ("model", "device", "step_ms", "ttft_ratio")} == {
        "model": "tiny (random weights)", "device": "cpu", "step_ms": 5, "ttft_ratio": 2.0}
    md = (tmp_path / "adversarial-tiny.md").read_text()
    assert md == adversarial.to_markdown(result) and "TTFT under attack / alone**: 2.00×" in md


def test_a_peer_that_dies_before_it_is_ready_is_named_with_its_exit_status():
    """A peer process that crashes while it loads (llama.cpp's AMX kernels did, on a virtual
    machine) stops the benchmark with one line naming the peer, how it ended and how to rerun it."""
    import sys
    from bench.run import PeerProcess
    cmd = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    with pytest.raises(RuntimeError) as raised:
        PeerProcess(cmd, "llama.cpp")
    assert str(raised.value) == f"the llama.cpp peer did not start (it exited with status -11: run {' '.join(cmd)} to see why)"


def test_start_bench_alternates_the_two_commands_and_times_the_launchers_check(tmp_path):
    """bench.start on a stand-in clone: its `tokenlab` and its `.venv/bin/python app.py` each serve
    200 on --port until SIGTERM; every round times both, each going first in turn, and `./tokenlab
    install` is timed alone. The numbers are this machine's (none asserted); what is measured is."""
    import os
    import sys
    from bench import start
    clone = tmp_path / "clone"
    (clone / ".venv" / "bin").mkdir(parents=True)
    (clone / ".venv" / "bin" / "python").symlink_to(sys.executable)
    (clone / "app.py").write_text(
        "import http.server, os, signal, sys\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))  # as the page stops\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
        "    def log_message(self, *a): pass\n"
        "with open(sys.argv[0] + '.calls', 'a') as f: f.write(os.environ.get('VIA', 'python') + '\\n')\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[sys.argv.index('--port') + 1])), H).serve_forever()\n")
    (clone / "tokenlab").write_text(
        '#!/bin/sh\nif [ "$1" = install ]; then echo "tokenlab: nothing to install" >&2; exit 0; fi\n'
        f'echo "tokenlab: nothing to install" >&2\nVIA=tokenlab exec {sys.executable} "$(dirname "$0")/app.py" "$@"\n')
    os.chmod(clone / "tokenlab", 0o755)
    result = start.measure(clone, 2, tmp_path)
    assert [len(s["seconds"]) for s in result["systems"].values()] == [2, 2] and len(result["check_s"]) == 8
    assert result["ratio_median"] == pytest.approx(result["systems"]["./tokenlab"]["median_s"]
                                                   / result["systems"]["python app.py"]["median_s"])
    # the warm-up start (python app.py), then both commands in every round, each first in turn
    assert (clone / "app.py.calls").read_text().split() == ["python", "tokenlab", "python", "python", "tokenlab"]
    assert "| `./tokenlab` |" in start.to_markdown(result) and "median" in start.to_markdown(result)
