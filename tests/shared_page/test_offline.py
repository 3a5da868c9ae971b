"""Nothing leaves the machine: the app, started as a user starts it, looks up and connects to
no host but this one, from start-up through a generation."""

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.page_client import free_port, wait_until_served
from page_api import call

LOCAL = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}


def test_app_makes_no_outside_lookup(tiny_dirs, tmp_path):
    from gradio_client import Client

    log, port = tmp_path / "net.jsonl", free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("GRADIO_ANALYTICS_ENABLED", "HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "DO_NOT_TRACK")}
    env["NETLOG"] = str(log)
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parents[1] / "net_probe.py"),
                             "--model", str(tiny_dirs["gqa_tied"]), "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_served(proc, port)
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        result = client.predict(*call(prompt="The quick brown fox", max_new_tokens=5, seed="1"),
                                api_name="/generate")
        assert len(result[0]) >= 1  # one generated token at least
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    hosts = [json.loads(line) for line in log.read_text().splitlines()]
    assert hosts, "the probe recorded nothing: it is not hooked in"
    outside = sorted({h for _, h in hosts if h not in LOCAL})
    assert outside == [], f"the app reached outside the machine: {outside}"
    assert "--share" in out and "share=True" not in out, out
