"""python -m inference: JSONL that scripts can rely on, and exit status 2 for bad arguments."""

import json
import subprocess
import sys

import pytest

from inference.cli import main

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_generate_jsonl_keys(tiny_dirs, capsys):
    assert main(["generate", "--model", str(tiny_dirs["mha"]), "--prompt", "The quick",
                 "--max-new-tokens", "5", "--seed", "3", "--top", "3", "--jsonl"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    steps, done = lines[:-1], lines[-1]
    assert len(steps) == 5
    for s in steps:
        assert {"step", "token_id", "piece", "text", "prob", "raw_prob", "top", "kv_cache_bytes",
                "kv_cache_capacity_bytes", "ms", "masked_mass"} <= set(s)
        assert s["masked_mass"] == 0.0  # no constraint: it removed nothing
        assert all(set(c) == {"id", "piece", "prob", "raw_prob", "forbidden", "removed_by"} and not c["forbidden"] for c in s["top"])
    assert "prefill_ms" in steps[0] and "prompt_tokens" in steps[0]
    assert done["done"] is True and done["reason"] == "length"
    assert {"text", "prompt_tokens", "generated_tokens", "ttft_ms", "decode_tokens_per_s"} <= set(done)
    assert done["text"] == "".join(s["text"] for s in steps) + done["tail"]


def test_generate_plain_text_and_stop(tiny_dirs, capsys):
    args = ["generate", "--model", str(tiny_dirs["mha"]), "--prompt", "The quick",
            "--max-new-tokens", "20", "--temperature", "0"]
    assert main(args) == 0
    full = capsys.readouterr().out.rstrip("\n")
    stop = full[4:6]
    assert main(args + ["--stop", stop]) == 0
    assert capsys.readouterr().out.rstrip("\n") == full[:full.index(stop)]


def test_tokenize_prints_ids_and_pieces(tiny_dirs, capsys):
    assert main(["tokenize", "--model", str(tiny_dirs["mha"]), "--text", "fox 😀"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out[0] == {"id": 1, "piece": "<s>"}  # add_bos_token is true in this config
    assert "".join(t["piece"] for t in out[1:]).startswith(" fox")


@pytest.mark.parametrize("extra, message", [
    (["--temperature", "nan"], "temperature"), (["--temperature", "inf"], "temperature"),
    (["--temperature", "-1"], "temperature"), (["--top-p", "0"], "top_p"),
    (["--top-p", "1.5"], "top_p"), (["--top-k", "-3"], "top_k"), (["--min-p", "2"], "min_p"),
    (["--repetition-penalty", "0"], "repetition_penalty"), (["--top-k", "abc"], "invalid int"),
    (["--max-new-tokens", "0"], "max_new_tokens"),
])
def test_bad_arguments_exit_2_with_one_line(tiny_dirs, capsys, extra, message):
    argv = ["generate", "--model", str(tiny_dirs["mha"]), "--prompt", "hi"] + extra
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("prompt, message", [("", "empty"), ("   ", "empty"),
                                             ("fox " * 400, "context window is 256")])
def test_bad_prompts_exit_2(tiny_dirs, capsys, prompt, message):
    assert main(["generate", "--model", str(tiny_dirs["mha"]), "--prompt", prompt]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_real_entry_point_exit_status(tiny_dirs):
    proc = subprocess.run([sys.executable, "-m", "inference", "generate", "--model", str(tiny_dirs["mha"]),
                           "--prompt", "x", "--top-p", "7"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "top_p" in proc.stderr


def test_app_safe_defaults():
    import app
    args = app.parse_args([])
    assert args.host == "127.0.0.1" and not args.share and args.auth is None
    assert app.parse_args(["--auth", "ann:secret"]).auth == ("ann", "secret")
    with pytest.raises(SystemExit) as e:
        app.parse_args(["--auth", "nopassword"])
    assert e.value.code == 2


def test_launch_turns_monitoring_off_and_hides_errors(monkeypatch, tiny_engine):
    """The launch settings that keep a shared link safe: checked where they are set."""
    import gradio as gr
    from app import serve
    from ui.layout import build_ui
    seen = {}
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kw: seen.update(kw))
    serve(build_ui(tiny_engine), tiny_engine, block=False)
    assert seen["server_name"] == "127.0.0.1" and seen["enable_monitoring"] is False
    assert seen["show_error"] is False and seen["share"] is False


def test_share_prints_a_public_warning(monkeypatch, tiny_dirs, capsys):
    import app
    import ui.layout
    monkeypatch.setattr(ui.layout, "launch", lambda *a, **k: None)
    assert app.main(["--model", str(tiny_dirs["mha"]), "--share"]) == 0
    assert "PUBLIC" in capsys.readouterr().err


def test_no_upload_or_file_components(tiny_engine):
    import gradio as gr
    from ui.layout import build_ui
    demo = build_ui(tiny_engine)
    kinds = {type(b).__name__ for b in demo.blocks.values()}
    assert not kinds & {"File", "UploadButton", "FileExplorer", "Image", "Audio", "Video"}
    assert isinstance(demo, gr.Blocks)


def test_generation_config_supplies_defaults(tiny_dirs, capsys, tmp_path):
    """The tiny models' generation_config.json says temperature 0.7, top_p 0.9."""
    import shutil
    from inference.serving.engine import Engine
    from ui.controls import Controls
    engine = Engine.from_hf_dir(tiny_dirs["mha"])
    assert engine.generation_defaults == {"temperature": 0.7, "top_p": 0.9}
    c = Controls.for_model(engine.generation_defaults)
    assert (c.temperature, c.top_p, c.top_k) == (0.7, 0.9, 0)
    d = tmp_path / "greedy"
    shutil.copytree(tiny_dirs["mha"], d)
    (d / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    runs = []
    for _ in range(2):  # greedy by the model's config: the same text without a seed
        assert main(["generate", "--model", str(d), "--prompt", "The quick", "--max-new-tokens", "12"]) == 0
        runs.append(capsys.readouterr().out)
    assert runs[0] == runs[1]


def test_a_reader_that_goes_away_ends_the_run_quietly(tiny_dirs):
    """`generate --jsonl | head -1`: the run's later lines fill the pipe (far more than its
    buffer holds), so the write after the reader closes it fails for certain; the CLI stops
    without a traceback and exits as a tool ended by SIGPIPE (141). The end of text is banned
    (a logit bias), so the run makes all its 200 lines (a sampled run that drew it early wrote
    less than the pipe holds and exited 0)."""
    proc = subprocess.Popen([sys.executable, "-m", "inference", "generate", "--model", str(tiny_dirs["mha"]),
                             "--prompt", "The quick", "--max-new-tokens", "200", "--top", "50", "--jsonl",
                             "--logit-bias", "2:-100", "--seed", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    first = json.loads(proc.stdout.readline())
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, err
    assert first["step"] == 0 and "Traceback" not in err and "Exception ignored" not in err


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: what it checks is refused before any model loads."""
    import inference.factory
    from inference.serving.engine import Engine

    def loaded(*a, **k):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(Engine, "load", classmethod(loaded))
    monkeypatch.setattr(inference.factory, "open_models", loaded)


@pytest.mark.parametrize("value", ["nan", "0", "-5", "inf", "-inf", "abc"])
@pytest.mark.parametrize("command", [["generate", "--prompt", "Hi"], ["score-text", "--text", "Hi"],
                                     ["tokenize", "--text", "Hi"], ["app"]])
def test_kv_pool_mib_must_be_a_positive_number(no_model, capsys, command, value):
    """--kv-pool-mib, shared by every subcommand and app.py: an argument error (status 2, one
    line naming the flag) before a model loads, never a traceback or a pool of one block."""
    import app
    with pytest.raises(SystemExit) as e:
        if command == ["app"]:
            app.main([f"--kv-pool-mib={value}"])
        else:
            main(command + [f"--kv-pool-mib={value}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2
    assert "--kv-pool-mib" in err[-1] and "must be a positive number of MiB" in err[-1] and repr(value) in err[-1]
    if command != ["app"]:  # (app.py's parser prints its usage first, as for its other flags)
        assert len(err) == 1


def test_a_taken_port_is_an_error_before_the_model_loads(no_model, capsys, monkeypatch):
    """`app.py --port P` with P taken: one line naming it, before the model loads (minutes).
    Without --port, Gradio's 7860 or the next free one: an error only when all of them are taken."""
    import socket

    import gradio.http_server
    import app
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert app.main(["--port", str(port)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: --port {port} cannot be used") and len(err.splitlines()) == 1
        monkeypatch.setattr(gradio.http_server, "INITIAL_PORT_VALUE", port)
        monkeypatch.setattr(gradio.http_server, "TRY_NUM_PORTS", 1)
        assert app.main([]) == 2
        assert f"no free port from {port} to {port}" in capsys.readouterr().err
        monkeypatch.setattr(gradio.http_server, "TRY_NUM_PORTS", 50)  # the next free one is taken
        assert app.port_problem(None) is None
    assert app.port_problem(port) is None  # free again
    assert app.port_problem(70000) == "--port must be from 0 to 65535, got 70000"


@pytest.mark.parametrize("flag, text, message", [
    ("--regex", "([a-", "--regex is not a valid regular expression: "),
    ("--regex", " ", "--regex is empty: give the regular expression"),
    ("--grammar", "root ::= (", "--grammar is not a valid grammar (EBNF): "),
    ("--json-schema", "{not json", "--json-schema is not a valid JSON schema: "),
    ("--grammar", "x" * 16_001, "--grammar: the grammar (EBNF) is 16,001 characters; at most 16,000"),
])
def test_constraint_errors_name_the_flag(no_model, capsys, tmp_path, flag, text, message):
    """A bad --regex, --grammar or --json-schema is named by its flag, not by the setting the
    page and the API call it (constraint_text)."""
    if flag != "--regex":
        (tmp_path / "c").write_text(text)
        text = str(tmp_path / "c")
    assert main(["generate", "--prompt", "Hi", flag, text]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: " + message) and len(err.splitlines()) == 1 and "constraint_text" not in err


def test_the_summary_records_the_prefix_ids(tiny_dirs, capsys):
    """--prefix-ids is part of how the run was made: its summary's settings record them, and
    the same command without them is a different run (so they are needed to reproduce it)."""
    argv = ["generate", "--model", str(tiny_dirs["mha"]), "--prompt", "The quick", "--temperature", "0",
            "--max-new-tokens", "4", "--jsonl"]
    assert main(argv + ["--prefix-ids", "7, 9"]) == 0
    done = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert done["settings"]["prefix_ids"] == [7, 9] and done["settings"]["temperature"] == 0.0
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert "prefix_ids" not in plain["settings"] and plain["text"] != done["text"]


def test_system_needs_chat_and_score_text_lists_the_preferred_tokens(tiny_dirs, capsys, tiny_engine):
    """--system without --chat would change nothing: refused. score-text --top N lists, beside each
    token, the N tokens the model preferred there (the engine's own numbers), not only in --jsonl."""
    model = ["--model", str(tiny_dirs["gqa_tied"])]
    assert main(["generate", *model, "--prompt", "Hi", "--system", "Be brief."]) == 2
    assert capsys.readouterr().err.strip() == "error: --system is the chat template's system prompt: give --chat too"
    assert main(["score-text", *model, "--text", "The quick brown fox", "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()[:-1]
    ids, before = tiny_engine.text_ids("The quick brown fox")
    scores = tiny_engine.score_ids(ids, 2)[before:]
    assert len(lines) == len(scores)
    for line, sc in zip(lines, scores):
        top = "  ".join(f"{c.piece!r} {c.raw_prob:.4f}" for c in sc.top)
        assert (line.endswith(f"  · preferred: {top}") if sc.top else "preferred" not in line), line
