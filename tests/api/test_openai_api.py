"""The OpenAI-compatible API beside the page, driven by the official `openai` client (and plain
HTTP where a client would not send what is tested), on the real page's server and a tiny model.
What it answers is checked against the page's own API (/generate), transformers, and the engine."""

import json
import math
import re
import socket
import threading
from types import SimpleNamespace

import httpx
import pytest
import torch

from api.answers import logprob
from engine_hold import wait_until
from page_api import call, output

openai = pytest.importorskip("openai")
gradio_client = pytest.importorskip("gradio_client")

PROMPT = "The quick"


@pytest.fixture(scope="module")
def client(live_app):
    url, engine, _ = live_app
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_completion_logprobs_are_the_pages_numbers(live_app, client):
    """The same prompt, settings and seed as a page run: the same tokens, and each token's
    log-probability (and each candidate's) is the log of the model's own probability that the
    page's bars show for it, the very number of the run's record the bars are drawn from."""
    from ui.controls import Controls
    from ui.format import bars_html, fmt_p
    url, engine, h = live_app
    c = Controls(prompt=PROMPT, temperature=0.7, top_p=0.8, max_new_tokens=8, seed="11")
    rec = list(h.run.generate(*c.values(), SimpleNamespace(session_hash="api-test")))[-1]["record"]
    answer = client.completions.create(model=engine.name, prompt=PROMPT, max_tokens=8, seed=11, logprobs=3,
                                       temperature=0.7, top_p=0.8)
    choice = answer.choices[0]
    assert choice.text == rec.done.text and len(rec.steps) == 8
    lps = choice.logprobs
    assert lps.tokens == [s.piece for s in rec.steps]
    for step, lp, top in zip(rec.steps, lps.token_logprobs, lps.top_logprobs):
        assert lp == math.log(step.raw_prob)
        assert list(top.values())[:3] == [math.log(cand.raw_prob) for cand in step.top[:3]]
        # The bars print these numbers: the digits of the very probabilities whose logs the API
        # gave (asserted above), not of exp(log p), which can differ in its last bit.
        shown = re.findall(r"<span class='tl-p'>([^<]*)</span>", bars_html(step))
        assert all(fmt_p(cand.raw_prob) in shown for cand in step.top[:3])
    assert answer.usage.completion_tokens == 8


def test_final_logprobs_are_the_probabilities_the_page_api_gives(live_app, client):
    """logprobs_distribution "final": the distribution sampled from, as /generate's tokens give it."""
    url, engine, _ = live_app
    page = gradio_client.Client(url, verbose=False)
    controls = dict(prompt=PROMPT, max_new_tokens=8, seed="11", temperature=0.7, top_p=0.8)
    tokens = output(page.predict(*call(**controls), api_name="/generate"), "api_tokens")
    answer = client.completions.create(model=engine.name, prompt=PROMPT, max_tokens=8, seed=11, logprobs=1,
                                       temperature=0.7, top_p=0.8, extra_body={"logprobs_distribution": "final"})
    lps = answer.choices[0].logprobs.token_logprobs
    assert len(tokens) == 8 and all(t["step"] == i for i, t in enumerate(tokens))  # one chip a token
    # One number: the API's log-probability is math.log of the probability the run stored, the
    # one /generate gives; compared as the API computes it (api.answers.logprob), not as
    # exp(log p), which need not give p back bit for bit (its last bits vary between CPUs).
    assert lps == [logprob(t["prob"]) for t in tokens]
    assert answer.choices[0].text == "".join(t["token"] for t in tokens)


def test_a_streamed_chat_joins_to_the_unstreamed_text(live_app, client):
    url, engine, _ = live_app
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fox."}]
    whole = client.chat.completions.create(model=engine.name, messages=messages, temperature=0, max_tokens=12)
    chunks = list(client.chat.completions.create(model=engine.name, messages=messages, temperature=0,
                                                 max_tokens=12, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and len(text) > 0
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12 == whole.usage.completion_tokens
    # The conversation went through the model's chat template, as the page's chat mode does.
    assert whole.usage.prompt_tokens == len(engine.prompt_ids("Name a fox.", chat=True, system="Be brief."))


def test_chat_logprobs_and_a_streamed_completion(live_app, client):
    url, engine, _ = live_app
    chat = client.chat.completions.create(model=engine.name, messages=[{"role": "user", "content": "Hi"}],
                                          temperature=0, max_tokens=4, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 3 for c in content)
    # Greedy: the chosen token is the most likely one.
    assert all(c.logprob == c.top_logprobs[0].logprob for c in content)
    streamed = list(client.completions.create(model=engine.name, prompt=PROMPT, max_tokens=6, temperature=0,
                                              stream=True))
    whole = client.completions.create(model=engine.name, prompt=PROMPT, max_tokens=6, temperature=0)
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text


def test_echo_gives_the_prompts_logprobs_as_transformers(tiny_dirs, live_app, client):
    transformers = pytest.importorskip("transformers")
    url, engine, _ = live_app
    prompt = "Paris is the capital of France."
    answer = client.completions.create(model=engine.name, prompt=prompt, max_tokens=0, echo=True, logprobs=2,
                                       extra_body={"return_token_ids": True})
    choice = answer.choices[0]
    ids = choice.model_extra["prompt_token_ids"]
    assert ids == engine.prompt_ids(prompt) and choice.text == prompt
    lps = choice.logprobs
    assert lps.token_logprobs[0] is None and lps.top_logprobs[0] is None
    ref = transformers.LlamaForCausalLM.from_pretrained(tiny_dirs["gqa_tied"], dtype=torch.float32,
                                                        attn_implementation="eager").eval()
    with torch.inference_mode():
        logp = ref(torch.tensor([ids])).logits[0].log_softmax(-1)  # (T, vocab)
    expected = [logp[k - 1, ids[k]].item() for k in range(1, len(ids))]
    assert len(lps.token_logprobs) == len(ids)
    assert max(abs(a - b) for a, b in zip(lps.token_logprobs[1:], expected)) <= 1e-4
    # Each position's candidates: the 2 most likely there, and the prompt's own token.
    for k in range(1, len(ids)):
        best = logp[k - 1].topk(2).values.tolist()
        got = sorted(lps.top_logprobs[k].values(), reverse=True)
        assert got[0] == pytest.approx(best[0], abs=1e-4) and len(got) in (2, 3)


# ---------------------------------------------------------------- errors

BAD = [
    ({"prompt": PROMPT, "temperature": 3}, 400, "temperature"),
    ({"prompt": PROMPT, "top_p": 0}, 400, "top_p"),
    ({"prompt": PROMPT, "temperature": "hot"}, 400, "temperature"),
    ({"prompt": PROMPT, "logprobs": 50}, 400, "logprobs"),
    ({"prompt": PROMPT, "max_tokens": -1}, 400, "max_tokens"),
    ({"prompt": PROMPT, "n": 0}, 400, "n"),
    ({"prompt": PROMPT, "stop": 5}, 400, "stop"),
    ({"prompt": PROMPT, "seed": "x"}, 400, "seed"),
    ({"prompt": PROMPT, "seed": -1}, 400, "seed"),
    ({"prompt": PROMPT, "top_k": -2}, 400, "top_k"),
    ({"prompt": PROMPT, "logit_bias": {"99999": 5}}, 400, "logit_bias"),
    ({"prompt": PROMPT, "logit_bias": {"x": 5}}, 400, "logit_bias"),
    ({"prompt": PROMPT, "response_format": {"type": "json_object"}}, 400, "response_format"),
    ({"prompt": PROMPT, "skip_special_tokens": True}, 400, "skip_special_tokens"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": [1, -4]}, 400, "prompt"),
    ({"prompt": [1, 10**9]}, 400, "prompt"),
    ({"prompt": "x " * 5000}, 400, "prompt"),
    ({"prompt": [5] * 300}, 400, "prompt"),
    ({"prompt": [5] * 200, "max_tokens": 57}, 400, "max_tokens"),  # 200 + 57 > the window's 256
    ({"prompt": PROMPT, "max_tokens": 3, "model": "gpt-5"}, 404, "model"),
    ({"prompt": PROMPT, "dry_sequence_breakers": '"a'}, 400, "dry_sequence_breakers"),
    ({"prompt": PROMPT, "temperature": "0.5"}, 400, "temperature"),  # JSON has numbers
    ({"prompt": PROMPT, "logit_bias": {"5": 101}}, 400, "logit_bias"),  # OpenAI's [-100, 100]
    ({"prompt": PROMPT, "stream_options": {"include_usage": True}}, 400, "stream_options"),  # without stream
    ({"prompt": PROMPT, "model": 5}, 400, "model"),
]


@pytest.mark.parametrize("body,status,param", BAD)
def test_bad_input_is_a_4xx_with_openais_error_body(live_app, body, status, param):
    url, _, _ = live_app
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param
    assert err["message"] and "\n" not in err["message"] and "Traceback" not in err["message"]
    if body.get("max_tokens") == -1:  # an interval open at infinity
        assert err["message"] == "max_tokens must be in [0, ∞), got -1"


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": "hi"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}),
    ("/v1/completions", b"{not json"),
    ("/v1/completions", b"[1, 2]"),
    ("/tokenize", {"prompt": 5}),
    ("/tokenize", {"prompt": "a", "foo": 1}),
    ("/tokenize", {"prompt": "a", "add_special_tokens": "no"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "name": "bob"}]}),
    ("/detokenize", {"tokens": ["a"]}),
])
def test_more_bad_input_is_400(live_app, path, body):
    url, _, _ = live_app
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(url + path, timeout=60, **kw)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_an_empty_user_message_is_a_turn_as_openai_and_vllm_take_it(tiny_dirs, live_app, client):
    """An empty message is still a turn of the chat template (its roles and separators): answered,
    its prompt the template's as transformers renders it; an empty plain prompt stays a 400."""
    transformers = pytest.importorskip("transformers")
    url, engine, _ = live_app
    messages = [{"role": "user", "content": ""}]
    ref = transformers.AutoTokenizer.from_pretrained(str(tiny_dirs["gqa_tied"]))
    rendered = ref.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered.startswith("<|im_start|>user\n<|im_end|>")
    # (transformers' legacy sentencepiece reading puts a space after each control token: the
    # text is its reference, its ids are not.)
    expected = httpx.post(url + "/tokenize", json={"prompt": rendered, "add_special_tokens": False},
                          timeout=60).json()["tokens"]
    answer = client.chat.completions.create(model=engine.name, messages=messages, max_tokens=3, seed=1)
    assert answer.usage.prompt_tokens == len(expected) and answer.usage.completion_tokens == 3
    assert httpx.post(url + "/tokenize", json={"messages": messages}, timeout=60).json()["tokens"] == expected
    r = httpx.post(url + "/v1/completions", json={"prompt": " ", "max_tokens": 2}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_max_tokens_must_fit_the_context_window(live_app, client):
    """Up to the window's end is served in full; one token more is a 400 naming the field and
    the room left, as OpenAI and vLLM answer, never a completion cut short."""
    url, engine, _ = live_app
    room = engine.describe().max_seq_len - 200
    full = client.completions.create(model=engine.name, prompt=[5] * 200, max_tokens=room, temperature=0)
    assert full.usage.completion_tokens == room and full.choices[0].finish_reason == "length"
    messages = [{"role": "user", "content": "hi"}]
    ids = engine.prompt_ids("hi", True, None, [])
    r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "messages": messages, "max_completion_tokens": engine.describe().max_seq_len - len(ids) + 1})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "max_completion_tokens"
    assert f"leaves {engine.describe().max_seq_len - len(ids)} after the prompt's {len(ids)}" in err["message"]


def test_a_prompt_is_counted_once_and_control_token_text_is_read_as_vllm_reads_it(live_app, client):
    """usage counts each prompt once however many completions (OpenAI's, vLLM's); text that spells
    a control token is that token (as Hugging Face's tokenizers read a prompt), so a prompt
    rendered by the client is the chat route's own; a stream sends no empty deltas."""
    url, engine, _ = live_app
    n_ids = len(engine.prompt_ids(PROMPT))
    many = client.completions.create(model=engine.name, prompt=[PROMPT, "Hi"], n=3, max_tokens=2, seed=1)
    assert many.usage.prompt_tokens == n_ids + len(engine.prompt_ids("Hi"))
    chat = client.chat.completions.create(model=engine.name, messages=[{"role": "user", "content": "Hi"}], n=2,
                                          max_tokens=2, seed=1)
    chat_ids = engine.prompt_ids("Hi", chat=True)
    assert chat.usage.prompt_tokens == len(chat_ids)
    # (The default model's whole rendering reads back as its chat ids: tests/loading/test_default_model.py.)
    rendered = engine.tokenizer.decode(chat_ids)
    controls = {engine.tokenizer.raw_pieces.index(s) for s in ("<|im_start|>", "<|im_end|>")}
    read = httpx.post(url + "/tokenize", json={"prompt": rendered}).json()["tokens"]
    assert controls <= set(chat_ids) and controls <= set(read) and not controls & set(engine.prompt_ids(rendered))
    assert httpx.post(url + "/tokenize", json={"prompt": "</s>", "add_special_tokens": False}).json()["tokens"] \
        == [engine.tokenizer.eos_ids[0]]
    as_text = client.completions.create(model=engine.name, prompt=rendered, max_tokens=1)
    assert as_text.usage.prompt_tokens == len(read)
    stream = client.chat.completions.create(model=engine.name, messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=12, temperature=0, stream=True, logit_bias={str(engine.tokenizer.eos_ids[0]): 100})
    deltas = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].finish_reason is None]
    assert deltas[0] == "" and all(deltas[1:])  # the role's chunk, then only chunks with text


def test_top_k_off_is_minus_one_or_zero_and_its_error_says_so(live_app, client):
    url, engine, _ = live_app
    texts = [client.completions.create(model=engine.name, prompt=PROMPT, max_tokens=8, seed=3, temperature=1.5,
                                       extra_body={"top_k": k}).choices[0].text for k in (-1, 0, 1)]
    assert texts[0] == texts[1] != texts[2]  # off twice the same; top_k 1 is greedy, another text
    r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "top_k": -3}, timeout=60)
    assert "-1 or 0 (off)" in r.json()["error"]["message"]


@pytest.mark.parametrize("method,path,status", [("POST", "/v1/embeddings", 404), ("GET", "/v1/completions", 405),
                                                ("DELETE", "/v1/models/x", 404), ("GET", "/tokenize", 405)])
def test_a_path_not_served_answers_in_openais_error_shape(live_app, method, path, status):
    url, _, _ = live_app
    r = httpx.request(method, url + path, json={"input": "x"}, timeout=60)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and f"{method} {path}" in err["message"]
    assert "POST /v1/chat/completions" in err["message"]


def test_the_openai_client_raises_bad_request_with_the_message(live_app, client):
    url, engine, _ = live_app
    with pytest.raises(openai.BadRequestError, match="temperature must be in"):
        client.completions.create(model=engine.name, prompt=PROMPT, temperature=9)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="context window"):
        client.completions.create(model=engine.name, prompt=list(range(3, 300)))


def test_models_and_tokenizer_routes(live_app, client):
    url, engine, _ = live_app
    [model] = client.models.list().data
    assert model.id == engine.name and model.model_extra["max_model_len"] == engine.cfg.max_seq_len
    ids = httpx.post(url + "/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    assert ids == engine.prompt_ids(PROMPT)
    assert httpx.post(url + "/tokenize", json={"prompt": " fox", "add_special_tokens": False}).json()["tokens"] \
        == engine.tokenizer.encode_continuation(" fox")
    chat = httpx.post(url + "/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()["tokens"]
    assert chat == engine.prompt_ids("Hi", chat=True)
    assert httpx.post(url + "/detokenize", json={"tokens": ids[1:]}).json()["prompt"] == engine.tokenizer.decode(ids[1:])
    info = httpx.get(url + "/tokenizer_info").json()
    assert info["eos_token"] == engine.tokenizer.eos_token and "im_start" in info["chat_template"]


def test_n_completions_differ_and_the_first_is_the_seeds(live_app, client):
    url, engine, _ = live_app
    one = client.completions.create(model=engine.name, prompt=PROMPT, max_tokens=8, temperature=1, seed=4)
    three = client.completions.create(model=engine.name, prompt=[PROMPT, PROMPT], max_tokens=8, temperature=1,
                                      seed=4, n=3)
    texts = [c.text for c in sorted(three.choices, key=lambda c: c.index)]
    assert len(texts) == 6 and texts[0] == texts[3] == one.choices[0].text
    assert len(set(texts[:3])) == 3
    assert three.usage.completion_tokens == 48


def test_a_stop_string_ends_the_completion_and_is_named(live_app, client):
    url, engine, _ = live_app
    run = dict(model=engine.name, prompt=PROMPT, max_tokens=12, temperature=1, seed=2)
    text = client.completions.create(**run).choices[0].text
    at = next(i for i in range(2, len(text) - 1) if text.find(text[i:i + 2]) == i)  # its first occurrence
    stop = text[at:at + 2]
    answer = client.completions.create(**run, stop=[stop, "zzz"])
    choice = answer.choices[0]
    assert choice.text == text[:text.index(stop)] and choice.finish_reason == "stop"
    assert choice.model_extra["stop_reason"] == stop


# ---------------------------------------------------------------- logins and limits

@pytest.fixture(scope="module")
def guarded_app(tiny_dirs):
    """The page with a login and a shared page's limits (one run per visitor, 6 tokens a run)."""
    from conftest import no_early_end
    from inference.serving.engine import Engine
    from ui.handlers import Handlers
    from app import serve
    from ui.layout import build_ui
    from server.limits import Limits

    engine = Engine.from_hf_dir(tiny_dirs["gqa_tied"], device="cpu", dtype="float32")
    no_early_end(engine)
    handlers = Handlers(engine, limits=Limits.shared(max_new_tokens=6))
    demo = build_ui(engine, handlers)
    _, url, _ = serve(demo, engine, port=None, block=False, auth=[("ann", "s3cret")])
    yield url.rstrip("/"), engine
    demo.close()
    engine.close()


def test_a_login_is_the_api_key(guarded_app):
    url, engine = guarded_app
    wrong = openai.OpenAI(base_url=url + "/v1", api_key="ann:wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model=engine.name, prompt=PROMPT, max_tokens=2)
    assert httpx.post(url + "/tokenize", json={"prompt": "a"}).status_code == 401
    right = openai.OpenAI(base_url=url + "/v1", api_key="ann:s3cret", max_retries=0)
    assert right.completions.create(model=engine.name, prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2


def test_the_shared_pages_limits_hold_for_the_api(guarded_app, hold):
    url, engine = guarded_app
    api = openai.OpenAI(base_url=url + "/v1", api_key="ann:s3cret", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="at most 6 new tokens"):
        api.completions.create(model=engine.name, prompt=PROMPT, max_tokens=7)
    with pytest.raises(openai.RateLimitError, match="allows 1 at a time"):
        api.completions.create(model=engine.name, prompt=PROMPT, max_tokens=2, n=2)
    # Without max_tokens a chat gets the cap, not the rest of the context window.
    chat = api.chat.completions.create(model=engine.name, messages=[{"role": "user", "content": "Hi"}])
    assert chat.usage.completion_tokens == 6
    # One run at a time per visitor: a second while the first is held is refused with 429.
    h = hold(engine)
    first = threading.Thread(target=api.completions.create,
                             kwargs=dict(model=engine.name, prompt=PROMPT, max_tokens=2))
    first.start()
    wait_until(lambda: h.started >= 1)
    with pytest.raises(openai.RateLimitError, match="already have 1 run"):
        api.completions.create(model=engine.name, prompt=PROMPT, max_tokens=2)
    h.open()
    first.join(60)
    assert api.completions.create(model=engine.name, prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2
    # A body over the page's limit is refused before it is read, in OpenAI's shape.
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ann:s3cret\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (17 * 1024 * 1024))
        head, _, body = s.makefile("rb").read().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and json.loads(body)["error"]["code"] == "request_too_large"


def test_a_stream_left_early_ends_its_run(live_app, client, hold):
    """A client that stops reading a stream (and closes it) cancels the run on the engine."""
    url, engine, _ = live_app
    h = hold(engine)
    h.allow(3)
    stream = client.completions.create(model=engine.name, prompt=PROMPT, max_tokens=200, temperature=0, stream=True)
    for i, _ in zip(range(2), stream):
        pass
    stream.close()
    h.open()
    wait_until(lambda: engine.active_runs == 0)


@pytest.mark.parametrize("route,body", [
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 200, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 200, "n": 2})])
def test_a_client_gone_before_its_answer_ends_its_runs(live_app, hold, route, body):
    """A request answered at its end (not streamed) whose client goes away (a timeout, Ctrl-C)
    ends its runs: no answer is computed for nobody. The runs are held before their first
    token, so only their cancellation lets them end."""
    from urllib.parse import urlparse
    url, engine, _ = live_app
    h = hold(engine)
    started, ended = h.started, h.ended
    address = urlparse(url)
    payload = json.dumps({"model": engine.name, **body}).encode()
    sock = socket.create_connection((address.hostname, address.port))
    sock.sendall(f"POST {route} HTTP/1.1\r\nHost: {address.netloc}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    wait_until(lambda: h.started > started, "the run's first forward pass")  # on the engine, held
    sock.close()
    # The server looks every half second; 30 s only ends a broken test before the hold's own 60 s
    # (after which the held pass fails and the run would end anyway).
    wait_until(lambda: h.ended >= ended + body.get("n", 1), "the runs' end", timeout_s=120)
    wait_until(lambda: engine.active_runs == 0)


def test_beam_search_answers_with_the_beams_transformers_finds(tiny_dirs, live_app, client):
    """vLLM's use_beam_search: n is the width and the choices are the finished beams, best first,
    the same tokens as transformers' beam search on the same weights; in a chat too. What a beam
    search cannot give (a stream, log-probabilities, one beam) is a 400 naming its field."""
    from helpers import hf_beams, hf_reference
    from inference.request import prepare_run
    url, engine, _ = live_app
    hf = hf_reference(tiny_dirs["gqa_tied"])
    ids = list(prepare_run(engine, {"max_new_tokens": 1}, prompt=PROMPT).prompt_ids)
    seqs, _ = hf_beams(hf, ids, 3, 0.5, 6, engine.eos_ids)
    out = client.completions.create(model=engine.name, prompt=PROMPT, max_tokens=6, n=3,
                                    extra_body={"use_beam_search": True, "length_penalty": 0.5,
                                                "return_token_ids": True})
    choices = sorted(out.choices, key=lambda c: c.index)
    assert [c.model_dump()["token_ids"] for c in choices] == seqs
    assert [c.text for c in choices] == [engine.tokenizer.decode(s) for s in seqs]
    assert out.usage.completion_tokens == sum(len(s) for s in seqs) and out.usage.prompt_tokens == len(ids)
    chat = client.chat.completions.create(model=engine.name, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=4, n=2, extra_body={"use_beam_search": True})
    assert len(chat.choices) == 2 and all(c.message.content is not None for c in chat.choices)
    for extra, field in (({"stream": True}, "stream"), ({"logprobs": 2}, "logprobs"), ({"n": 1}, "n"),
                         ({"n": 9}, "n")):
        body = {"model": engine.name, "prompt": PROMPT, "max_tokens": 4, "n": 2, "use_beam_search": True, **extra}
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (extra, r.text)
    r = httpx.post(url + "/v1/completions", json={"model": engine.name, "prompt": PROMPT, "length_penalty": 2.0},
                      timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "length_penalty"
