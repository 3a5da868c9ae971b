"""The benchmark runs end to end (on random weights of a tiny shape) and reports what it says."""

import json
import os
import sys
from pathlib import Path

import pytest

from bench.run import main


def test_bench_reports_ratios_table_and_json(tmp_path):
    assert main(["--random", "tiny", "--tokens", "8", "--repeats", "1", "--no-page", "--device", "cpu",
                 "--read-mib", "64", "--out", str(tmp_path)]) == 0
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
    assert "| token-lab, 8 runs at once | 8 |" in md  # --rows' default


def test_the_read_bound_summary_reads_both_benchmarks_results(tmp_path, capsys):
    """python -m bench.report (bench/gpu_check.sh's summary): every system and row count of a
    bench.run and a bench.users result, the 1-row figures held against the goal."""
    from bench import report
    run = {"model": "m", "device": "cuda", "dtype": "bf16", "read_bound": {
        "token-lab": {"rows": 1, "read_bound_fraction": 0.7}, "token-lab, 8 runs at once": {"rows": 8, "read_bound_fraction": 0.2}}}
    users = {"model": "m", "device": "cuda", "dtype": "bf16", "systems": {"engine": {
        "1": {"read_bound_fraction": 0.5}, "8": {"read_bound_fraction": 0.3}}, "page": {"1": {"aggregate_tok_s": 9.0}}}}
    (tmp_path / "run.json").write_text(json.dumps(run))
    (tmp_path / "users.json").write_text(json.dumps(users))
    assert report.main([str(tmp_path / "run.json"), str(tmp_path / "users.json"), "--goal", "0.65"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:3] == ["  token-lab (1 row): 70% of the read-bound rate  (meets the goal of 65%)",
                        "  token-lab, 8 runs at once (8 rows): 20% of the read-bound rate"]
    assert out[4:] == ["  engine (1 row): 50% of the read-bound rate  (below the goal of 65%)",
                       "  engine (8 rows): 30% of the read-bound rate"]


def test_page_measurement_receives_every_token(hold):
    """The page measurement: the real app, a gradio_client in another process, and the engine
    alone in turn; every requested token arrives at the client."""
    from bench.run import measure_page
    from bench.shapes import random_engine
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
                       "--tokens", "6", "--no-page", "--rounds", "2", "--read-mib", "64", "--out", str(tmp_path)]) == 0
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
                       "--tokens", "4", "--rounds", "1", "--read-mib", "64", "--out", str(tmp_path), *client]) == 0
    result = json.loads((tmp_path / "users.json").read_text())
    page = result["systems"]["page"]
    assert page["2"]["users"] == 2 and 2 <= page["2"]["tokens"] <= 8 and page["2"]["clients_cpu_s"] > 0
    assert page["2"]["updates"] >= 2 and page["2"]["server_cpu_s"] > 0
    # The page's time ends at the last client's last update, before the clients' processes exit.
    assert 0 < page["2"]["wall_s"] <= page["2"]["wall_to_exits_s"]
    assert [page["2"]["same_as_alone"], result["systems"]["engine"]["2"]["same_as_alone"]] == [2, 2]
    assert "page: aggregate 2 users / 1 user" in result["ratios"]
    md = (tmp_path / "users.md").read_text()
    assert "CPU-seconds of" in md and "page 2 users 2/2" in md


def test_users_bench_on_random_weights_of_a_published_shape(tmp_path):
    """--random: what bench/gpu_check.sh runs where no checkpoint can be fetched."""
    from bench import users
    assert users.main(["--random", "tiny", "--device", "cpu", "--users", "1", "2", "--tokens", "4",
                       "--no-page", "--rounds", "1", "--read-mib", "64", "--out", str(tmp_path)]) == 0
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
    rc = adversarial.main(["--random", "tiny", "--device", "cpu", "--step-ms", "5", "--runs", "2",
                           "--out", str(tmp_path)])
    result = json.loads((tmp_path / "adversarial-tiny.json").read_text())
    # Its exit says what went wrong: no server error and no dropped connection here, ever; whether one
    # of the findings' Stops caught a run mid-way depends on the machine's speed (CI saw none once),
    # so a run that saw no cut exits 1 for that alone, and says so in its results.
    found = result["findings"]
    assert found["server_errors"] == 0 and found["dropped"] == 0
    assert rc == (0 if found.get("cut_runs") and (found.get("most_passes_after_a_cut") or 0) <= 1 else 1)
    assert {k: result[k] for k in ("model", "device", "step_ms", "ttft_ratio")} == {
        "model": "tiny (random weights)", "device": "cpu", "step_ms": 5, "ttft_ratio": 2.0}
    md = (tmp_path / "adversarial-tiny.md").read_text()
    assert md == adversarial.to_markdown(result) and "TTFT under attack / alone**: 2.00×" in md


def test_a_peer_that_dies_before_it_is_ready_is_named_with_its_exit_status():
    """A peer process that crashes while it loads (llama.cpp's AMX kernels did, on a virtual
    machine) stops the benchmark with one line naming the peer, how it ended and how to rerun it."""
    import sys
    from bench.peers import PeerProcess
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


# ---------------------------------------------------------------- llama.cpp's builds, the read-bound time

FAKE_LLAMA = Path(__file__).resolve().parents[1] / "fake_llama"  # a llama_cpp stand-in: a toy model


def tiny_f16_gguf(path: Path, **changes) -> Path:
    """The tiny random shape as an F16 GGUF file, written by bench.gguf_shape (as the 1B's is)."""
    from bench.gguf_shape import write_f16
    from bench.shapes import RANDOM_SHAPES
    write_f16(path, {**RANDOM_SHAPES["tiny"], **changes})
    return path


def python_that(tmp_path: Path, name: str, line: str) -> Path:
    """A stand-in for a llama.cpp build's Python: a shell script that runs `line` ("$@": its arguments)."""
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\n{line}\n")
    script.chmod(0o755)
    return script


@pytest.fixture
def fake_llama(tmp_path, monkeypatch):
    """Two llama.cpp builds of the stand-in: "native" dies of SIGSEGV on a batched prompt (as on an
    Intel Xeon with AMX), "portable" runs it."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FAKE_LLAMA), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("TOKEN_LAB_LLAMA_PYTHON", str(python_that(tmp_path, "native", f'FAKE_LLAMA_CRASH=1 exec {sys.executable} "$@"')))
    monkeypatch.setenv("TOKEN_LAB_LLAMA_PORTABLE_PYTHON", sys.executable)
    return tiny_f16_gguf(tmp_path / "tiny-F16.gguf")


def toy_continuation(prompt: list[int], n: int) -> list[int]:
    """What the stand-in's toy model gives a prompt alone, greedy: the independent reference."""
    sys.path.insert(0, str(FAKE_LLAMA))
    try:
        from llama_cpp import _next
    finally:
        sys.path.remove(str(FAKE_LLAMA))
    seq = list(prompt)
    for _ in range(n):
        seq.append(_next(seq))
    return seq[len(prompt):]


def test_the_read_bound_fraction_is_a_steps_bytes_at_its_rounds_bandwidth_over_its_time():
    from bench import roofline
    # 1 GB at 20 GB/s takes 50 ms: a 100 ms step reaches half of it; each round with its own bandwidth
    assert roofline.fraction(10**9, 100.0, 20.0) == pytest.approx(0.5)
    by = roofline.by_round(10**9, [100.0, 50.0, 25.0], [20.0, 10.0, 40.0])
    assert by["read_bound_fraction_by_round"] == pytest.approx([0.5, 2.0, 1.0]) and by["read_bound_fraction"] == pytest.approx(1.0)
    # A step reads its weights once whatever its rows, each row its KV cache and embedding row.
    assert roofline.StepReads(1000, 10).at(1) == 1010 and roofline.StepReads(1000, 10).at(8) == 1080


def test_bench_measures_llama_cpp_native_one_token_at_a_time_and_portable_for_ttft(fake_llama, tmp_path):
    """The native build's batched prompt dies of a signal: it is started again feeding its prompt one
    token at a time and decodes; time to first token is compared with the portable build, which
    evaluated its prompt batched; every figure names its build; llama.cpp's step and ours at 1 and
    3 rows are set against the bytes they read."""
    from bench.users import prompt
    assert main(["--random", "tiny", "--gguf", str(fake_llama), "--tokens", "6", "--repeats", "2", "--rows", "3",
                 "--no-page", "--device", "cpu", "--read-mib", "64", "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "bench-tiny.json").read_text())
    llama = r["llama_cpp"]
    native, portable = llama["builds"]["native"], llama["builds"]["portable"]
    assert (native["prompt"], native["batched_prompt_died"], native["native"]) == ("one token at a time", -11, True)
    assert (portable["prompt"], portable["native"], portable["system_info"]) == ("batched", False, "CPU : FAKE = 1 |")
    assert (llama["decode_from"], llama["ttft_from"], llama["not_started"]) == ("native", "portable", {})
    rows = r["systems"]
    native_row = rows["llama.cpp native (llama-cpp-python 0.0-fake, prompt one token at a time (its batched prompt "
                      "died of signal 11)) on tiny-F16.gguf, own process"]
    portable_row = rows["llama.cpp portable (llama-cpp-python 0.0-fake, prompt batched) on tiny-F16.gguf, own process"]
    ours = rows["token-lab"]
    assert r["ratios"]["decode_vs_llama_cpp"] == pytest.approx(ours["decode_tok_s"] / native_row["decode_tok_s"])
    assert r["ratios"]["ttft512_vs_llama_cpp"] == pytest.approx(ours["ttft_512_ms"] / portable_row["ttft_512_ms"])
    assert len(r["ratios"]["decode_vs_llama_cpp_by_round"]) == 2
    # llama.cpp's step on the F16 file (bytes by hand): 2 layers of q, k, v, o, gate, up, down at 2
    # bytes, the norms at 4, the 512 x 64 output matrix, one embedding row, and a float16 KV cache
    # (2 layers x 2 KV heads x 16 x K and V) at the run's middle position 32 + 6 / 2.
    weights = 2 * 2 * (64 * (64 + 32 + 32) + 64 * 64 + 3 * 64 * 128) + 4 * (2 * 2 * 64 + 64) + 2 * 512 * 64
    bound = r["read_bound"]
    assert bound["llama.cpp native"]["step_bytes"] == weights + 2 * 64 + 2 * 2 * 2 * 16 * 2 * 35
    assert bound["llama.cpp native"]["rows"] == 1 and len(bound["llama.cpp native"]["read_bound_fraction_by_round"]) == 2
    # Ours at 3 rows (float32): the weights once, and each row's KV cache and embedding row, each
    # row at bench.users' prompts' mean length + 3.
    context = round(sum(len(prompt(i).encode()) for i in range(3)) / 3) + 3
    ours_weights = 4 * (2 * (64 * (64 + 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 512 * 64 + 64)
    three = bound["token-lab, 3 runs at once"]
    assert three["rows"] == 3 and three["step_bytes"] == ours_weights + 3 * (4 * 2 * 2 * 2 * 16 * context + 4 * 64)
    assert three["aggregate_tok_s"] > 0 and bound["token-lab"]["step_bytes"] == r["bytes_read_per_token"]
    md = (tmp_path / "bench-tiny.md").read_text()
    assert "| token-lab, 3 runs at once | 3 |" in md and "time to first token against portable" in md
    assert "- native: llama-cpp-python 0.0-fake, prompt one token at a time (its batched prompt died of signal 11)" in md


def test_llama_cpp_decodes_many_sequences_in_one_batch_each_as_alone(fake_llama, tmp_path):
    """bench/peer_llama_batch.py: every prompt alone, then three at once in one batch a step; each
    sequence's ids are its toy continuation alone (a sequence fed another's tokens or positions
    would get others, and the stand-in refuses a position out of order). With its prompt fed one
    token at a time (the native build's way here) the ids are the same."""
    from bench.peers import llama_builds, start_llama
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps(prompts))
    expected = [toy_continuation(p, 5) for p in prompts]
    for build, python in llama_builds().items():
        peer = start_llama(python, "peer_llama_batch.py", [fake_llama, ids, 5, 1, 3], build)
        try:
            assert peer.ready["alone"] == expected and peer.ready["seqs"] == 3
            assert peer.ready["prompt"] == {"native": "one token at a time", "portable": "batched"}[build]
            three = peer.measure(3)
            assert [run["text"] for run in three["runs"]] == expected and [run["tokens"] for run in three["runs"]] == [5] * 3
            assert three["step_ms"] > 0 and three["wall_s"] > 0
            assert [run["text"] for run in peer.measure(1)["runs"]] == expected[:1]
        finally:
            peer.close()


def test_users_bench_measures_llama_cpp_batched_beside_the_engine(fake_llama, tmp_path):
    from bench import users
    assert users.main(["--random", "tiny", "--gguf", str(fake_llama), "--device", "cpu", "--users", "1", "3",
                       "--tokens", "5", "--no-page", "--rounds", "2", "--read-mib", "64", "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "users-tiny.json").read_text())
    for build in ("llama.cpp native", "llama.cpp portable"):
        three = r["systems"][build]["3"]
        assert (three["users"], three["tokens"], three["same_as_alone"]) == (3, 15, 3)
        assert len(three["read_bound_fraction_by_round"]) == 2 and three["step_ms"] > 0
        assert f"engine / {build} aggregate at 3 users" in r["ratios"]
    assert r["llama_cpp"]["builds"]["llama.cpp native"]["prompt"] == "one token at a time"
    assert "alone" not in r["llama_cpp"]["builds"]["llama.cpp native"]
    # The bytes a step of 3 rows reads: llama.cpp's on the F16 file with a float16 KV cache, ours
    # at float32; each row at the prompts' mean length + 5 // 2.
    context = round(sum(len(users.prompt(i).encode()) for i in range(3)) / 3) + 2
    weights = 2 * 2 * (64 * (64 + 32 + 32) + 64 * 64 + 3 * 64 * 128) + 4 * (2 * 2 * 64 + 64) + 2 * 512 * 64
    assert r["systems"]["llama.cpp native"]["3"]["step_bytes"] == weights + 3 * (2 * 64 + 2 * 2 * 2 * 16 * 2 * context)
    engine = r["systems"]["engine"]
    ours_weights = 4 * (2 * (64 * (64 + 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 512 * 64 + 64)
    assert engine["1"]["step_bytes"] == ours_weights + 4 * 64 + 4 * 2 * 2 * 2 * 16 * context
    assert engine["3"]["read_bound_fraction"] > 0 and engine["3"]["same_as_alone"] == 3
    md = (tmp_path / "users-tiny.md").read_text()
    assert "| llama.cpp native, 3 users | 3 |" in md and "llama.cpp native 3 users 3/3" in md


def test_a_llama_build_that_dies_both_ways_is_named_and_another_measured(tmp_path, fake_llama):
    """A build that dies of a signal with its prompt batched and one token at a time is named
    with why, while another build runs; with none running the benchmark stops with one line. A
    build that exits (no signal) is not tried again one token at a time."""
    from bench.peers import PeerDied, start_llama, start_llama_builds
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps({n: list(range(n)) for n in (32, 128, 512)}))
    args = [fake_llama, ids, 4, 1]
    dies = python_that(tmp_path, "dies", "kill -SEGV $$")
    peers, failed = start_llama_builds("peer_llama_cpp.py", args, {"native": dies, "portable": Path(sys.executable)})
    try:
        assert list(peers) == ["portable"] and list(failed) == ["native"]
        assert "the llama.cpp (native, prompt one token at a time) peer did not start (it exited with status -11" in failed["native"]
    finally:
        peers["portable"].close()
    with pytest.raises(RuntimeError, match="status -11"):
        start_llama_builds("peer_llama_cpp.py", args, {"native": dies})
    with pytest.raises(PeerDied, match=r"the llama.cpp \(native\) peer did not start \(it exited with status 3"):
        start_llama(python_that(tmp_path, "exits", "exit 3"), "peer_llama_cpp.py", args, "native")


def test_a_published_shape_written_as_gguf_reads_back_as_that_shape(tmp_path):
    """bench.gguf_shape's writer (what the Llama-3.2-1B file is built with): our importer reads the
    file back as the shape's own config, tied or not, and the engine decodes it."""
    from bench.shapes import RANDOM_SHAPES
    from inference.loading.gguf_import import import_gguf
    from inference.model.config import ModelConfig
    from inference.sampling.params import SamplingParams
    from inference.serving.engine import Engine
    fields = ("vocab_size", "hidden_size", "intermediate_size", "n_layers", "n_heads", "n_kv_heads", "head_dim",
              "rope_theta", "tie_word_embeddings", "max_seq_len")
    for tied in (False, True):
        shape = {**RANDOM_SHAPES["tiny"], "tie_word_embeddings": tied, "rope_theta": 5e5}
        out = import_gguf(tiny_f16_gguf(tmp_path / f"t{tied}.gguf", **shape), tmp_path / f"m{tied}", progress=False)
        read, want = ModelConfig.from_json(out / "config.json"), ModelConfig.from_hf_dict(shape)
        assert {f: getattr(read, f) for f in fields} == {f: getattr(want, f) for f in fields}
        assert read.rms_norm_eps == pytest.approx(want.rms_norm_eps, rel=1e-6)  # stored as a float32
    engine = Engine.from_hf_dir(out, "cpu")
    done = list(engine.generate_ids(engine.prompt_ids("The quick brown fox"), SamplingParams(temperature=0.0, max_new_tokens=3), 2))[-1]
    assert done.generated_tokens == 3
    # Llama-3.2-1B's shapes: its published parameter count (tied embeddings).
    assert ModelConfig.from_hf_dict(RANDOM_SHAPES["llama-3.2-1b"]).param_counts()["total"] == 1_235_814_400


def test_page_client_opens_its_session_before_its_run(tiny_dirs):
    """A page client opens its session as a page's load does (a fresh session costs gradio ~20 ms
    of its event loop, paid at a visitor's page load): after open_session the server holds the
    session and no run or stop is pending for it, and the run then streams in that session."""
    from app import serve
    from bench.page_client import PageClient
    from inference.serving.engine import Engine
    from ui.controls import Controls
    from ui.handlers import Handlers
    from ui.layout import build_ui
    engine = Engine.load(str(tiny_dirs["gqa_tied"]), "cpu")
    demo = build_ui(engine, Handlers(engine))
    _, url, _ = serve(demo, engine, block=False)
    try:
        client = PageClient(url)
        assert client.session not in demo.state_holder
        client.open_session()
        assert client.session in demo.state_holder
        arrivals, text = client.run(Controls(prompt="Hello", temperature=0.0, max_new_tokens=3, seed="1").values())
        assert arrivals[-1][1] == 3 and text  # the run was not stopped by the /stop that opened the session
    finally:
        demo.close()
        engine.close()
