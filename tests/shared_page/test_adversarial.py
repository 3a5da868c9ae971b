"""A hostile visitor and a well-behaved one on the same shared page, on loopback only.

The app runs as a user starts it (with the limits of a --share page, given as flags), each
forward pass of its tiny model made 15 ms longer by a sleep so that runs overlap as a real
model's do, and every text its tokenizer is given logged by length (slow_app.py). The attack is
bench.adversarial's own measurement (its `measure`), so the benchmark's figures are checked here
too. The visitor (in a process of its own) uploads files, sends 8 MB prompts and 20 MiB
bodies, opens sessions past its share, Generates and Stops at once and runs capped runs back to
back, a fixed number of requests of each. While it lasts the well-behaved user runs its prompt
again and again: every run must give the same text as alone. The visitor must have been refused
what it should not get, each refusal a message; no 8 MB prompt may reach the tokenizer; and
afterwards the app's memory is back within 100 MB of where it started and nothing is left in
its temporary directories. Nothing here depends on how fast the machine is: the time to first
token alone and under attack is a benchmark figure (python -m bench.adversarial), only checked
to agree with itself.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.adversarial import (BIG_PROMPT, CAP_TOKENS, GOOD, args, GOOD_SETTINGS, SESSIONS, VISITOR_REQUESTS, good_run,
                               measure, to_markdown, visitor_log)
from bench.page_client import free_port, wait_until_served
from helpers import files_under

gradio_client = pytest.importorskip("gradio_client")

STEP_S = 0.015
RUNS = 3  # the user's runs alone before the attack, and again after it


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


# ------------------------------------------------------------------ the test


@pytest.mark.slow  # the page in a process of its own under a hostile visitor for tens of seconds
def test_a_hostile_visitor_does_not_hurt_a_well_behaved_one(tiny_dirs, tmp_path):
    port = free_port()
    gradio_tmp, py_tmp = tmp_path / "gradio", tmp_path / "tmp"
    py_tmp.mkdir()
    tokenized_log, server_log = tmp_path / "tokenized.txt", tmp_path / "server.log"
    env = {**os.environ, "TOKENLAB_TEST_STEP_S": str(STEP_S), "GRADIO_TEMP_DIR": str(gradio_tmp),
           "TMPDIR": str(py_tmp), "TOKENLAB_TEST_TOKENIZED": str(tokenized_log)}

    def tokenized() -> list[int]:
        """The length of every text the app's tokenizer has been given, in order."""
        return [int(n) for n in tokenized_log.read_text().split()] if tokenized_log.exists() else []

    with open(server_log, "w") as out:  # a file, not a pipe nobody reads while the app runs
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve().parents[1] / "slow_app.py"), "--model", str(tiny_dirs["gqa_tied"]),
             "--port", str(port), "--max-new-tokens-cap", str(CAP_TOKENS), "--runs-per-client", "1",
             "--sessions-per-client", str(SESSIONS)],
            env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        try:
            wait_until_served(proc, port)
        except AssertionError:
            raise AssertionError(server_log.read_text()[-3000:]) from None
        good = gradio_client.Client(url, verbose=False, headers={"X-Forwarded-For": GOOD})
        _, text = good_run(good)  # warm-up
        assert text and tokenized().count(len(GOOD_SETTINGS["prompt"])) == 1  # the log works: the run's prompt is in it
        # A refused 8 MB prompt is refused by its length: the tokenizer is never given it.
        other = gradio_client.Client(url, verbose=False, headers={"X-Forwarded-For": "192.0.2.9"})
        for prompt in ("", BIG_PROMPT, "", BIG_PROMPT):
            before = tokenized()
            with pytest.raises(Exception, match="empty|characters but the context window is"):
                other.predict(*args(prompt=prompt), api_name="/generate")
            assert tokenized() == before, len(prompt)
        other.close()
        rss_before = rss_mib(proc.pid)  # once an 8 MB request has been read and refused
        files_before = files_under(gradio_tmp, py_tmp)

        # bench.adversarial's measurement: the user's runs alone; an empty and an 8 MB prompt
        # refused (twice each); the visitor's fixed number of requests while the user runs again
        # and again (at least RUNS times), then alone again.
        result = measure(url, proc.pid, RUNS, tmp_path)
        kinds = visitor_log(tmp_path / "visitor.jsonl")
        print({k: len(v) for k, v in kinds.items()}, f"while the user ran {result['runs_attacked']} runs")

        # The well-behaved user: the same text under attack and after it as alone.
        assert result["runs_alone"] == 2 * RUNS and result["runs_attacked"] >= RUNS
        assert result["same_text_alone"] == result["runs_alone"]
        assert result["same_text_attacked"] == result["runs_attacked"]
        # The benchmark's figures agree with each other (their sizes depend on the machine: not checked).
        assert result["ttft_alone_ms"] > 0 and result["ttft_attacked_ms"] > 0
        assert result["ttft_ratio"] == pytest.approx(result["ttft_attacked_ms"] / result["ttft_alone_ms"])
        assert result["refused_8mb_cpu_ms"] >= 0 and result["refused_empty_cpu_ms"] >= 0
        assert result["refused_8mb_round_trip_ms"] > 0
        assert "TTFT under attack / alone" in to_markdown({"model": "tiny", "device": "cpu", "step_ms": 15, **result})
        assert good_run(good)[1] == text  # and the same as this client's before it all

        # The visitor made every request it was to make, got nothing it should not, and was told why.
        assert {k: len(v) for k, v in kinds.items()} == VISITOR_REQUESTS == result["visitor_requests"]
        assert kinds["upload"] and all(s == 404 for (s,) in kinds["upload"] + kinds["file"])
        assert kinds["8mb"] and all("characters but the context window is" in e[0] for e in kinds["8mb"])
        # None of the 8 MB prompts (the visitor's, and the measurement's own) reached the tokenizer.
        assert max(tokenized()) < len(BIG_PROMPT)
        assert all(s.startswith("HTTP/1.1 413") for (s,) in kinds["20mib"])
        assert len(kinds["session"]) == 2 * SESSIONS and any("429" in s for (s,) in kinds["session"]), kinds["session"]
        # Over the cap: the slider's end, or the visitor's share already taken.
        assert all(re.search("allows at most 40 new tokens|run going", s) for (s,) in kinds["too many tokens"])
        assert any(s == "ran" for (s,) in kinds["long"])
        refusals = [s for (s,) in kinds["long"] + kinds["generate/stop"] + kinds["session"]
                    if s not in ("ran", "ended", "opened")]
        assert not [s for s in refusals if re.search("Traceback|Server Error|Server error|5[0-9][0-9] ", s)], refusals

        # Afterwards: memory back within 100 MB, nothing left in the temporary directories.
        good.close()
        deadline = time.monotonic() + 60  # memory is given back when it is; only a leak waits this long
        while rss_mib(proc.pid) - rss_before > 100 and time.monotonic() < deadline:
            time.sleep(0.5)
        rss_after = rss_mib(proc.pid)
        print(f"RSS before the attack {rss_before:.0f} MiB, after {rss_after:.0f} MiB")
        assert rss_after - rss_before <= 100
        assert files_under(gradio_tmp, py_tmp) == files_before == []
    finally:
        proc.terminate()
        proc.wait(60)
    out = server_log.read_text()
    # The server's log: gradio prints its own input checks (a value past a slider's end) with a
    # traceback; any other exception is a failure.
    raised = [line for line in out.splitlines() if re.match(r"[\w.]+(Error|Exception|Exit)\b.*:", line)
              and not line.startswith("gradio.exceptions.Error: ")]
    assert not raised, out[-3000:]
    assert files_under(gradio_tmp, py_tmp) == []
