"""The page starts on a busy machine: Gradio's own check that a page answers (one HEAD, 3 s) gave up
on a page that was up, in CI beside other jobs; ui.layout.answers checks instead and asks again."""
import socket
import threading

import gradio.networking
import httpx

from app import main
from bench.page_client import free_port
import ui.layout
from ui.layout import answers


class Refuser:
    """A localhost server that closes its first `refuse` connections unanswered, then answers each
    request 200: a page that does not answer at first."""

    def __init__(self, refuse: int):
        self.refuse, self.seen = refuse, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.seen += 1
                if self.seen > self.refuse:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def close(self):
        self.sock.close()


def test_a_page_that_does_not_answer_at_first_is_asked_again():
    server = Refuser(refuse=3)
    try:
        assert answers(server.url) and server.seen == 4
    finally:
        server.close()


def test_an_address_nothing_serves_does_not_answer():
    assert not answers(f"http://127.0.0.1:{free_port()}/", within_s=0.5)


def test_the_page_starts_though_gradios_own_check_gives_up(monkeypatch, tiny_dirs):
    """Gradio's check is not asked (it would refuse to start); the page serves."""
    from inference.serving.engine import Engine
    from ui.handlers import Handlers
    from ui.layout import build_ui
    from app import serve

    asked = []
    monkeypatch.setattr(gradio.networking, "url_ok", lambda url: asked.append(url) or False)
    with Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32") as engine:
        demo = build_ui(engine, Handlers(engine))
        try:
            _, url, _ = serve(demo, engine, port=None, block=False)
            assert httpx.get(url, trust_env=False).status_code == 200 and asked == []
        finally:
            demo.close()


def test_a_page_that_never_answers_ends_app_py_with_one_line(tiny_dirs, monkeypatch, capsys):
    monkeypatch.setattr(ui.layout, "answers", lambda url: False)
    assert main(["--model", str(tiny_dirs["gqa_tied"]), "--port", str(free_port())]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: the page's server started but http://") and "did not answer" in err[-1]
    assert not any("Traceback" in line for line in err)
