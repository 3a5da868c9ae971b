"""A request's body read into what the engine runs: its prompts or messages, its sampling
settings, how many completions and what to return of them. Every bad value is a 400 naming its
field; a field Token Lab does not serve is refused, never ignored.

The sampling settings come from the schema (inference/sampling/settings.py): each is read under
the key vLLM's request uses for it (`server_key`) where vLLM has one, else under the setting's own
name (typical_p, xtc_probability, dry_multiplier, mirostat_tau, ...). Their defaults are the
model's generation_config.json values where it has them, as vLLM's, else the schema's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

from api.errors import APIError, bad, request_key
from inference.errors import InputError, lone_surrogate, shown
from inference.sampling.constrain import MAX_SCHEMA_DEPTH, check
from inference.sampling.params import SamplingParams
from inference.sampling.settings import BY_NAME, CONSTRAINT_KINDS, SETTINGS
from inference.request import SettingErrors, choose_seed, parse_settings, tokens_message

MAX_LOGPROBS = 20  # top candidates per token at most, as vLLM's default --max-logprobs
MAX_N = 16  # completions of one prompt at most
MAX_PROMPTS = 64  # prompts in one completions request at most
COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
MAX_BIAS = 100  # a logit bias in [-100, 100], as OpenAI's API takes it

# Each sampling setting's request key: vLLM's name where the schema gives it, else its own.
# (The decoding group, beam search, is asked as vLLM asks it: use_beam_search, n the width,
# length_penalty; see _ask.)
SAMPLING_KEYS = {(s.server_key or s.name): s for s in SETTINGS
                 if s.name != "max_new_tokens" and s.stage_name != "constraint" and s.group != "decoding"}
MAX_TOKENS = BY_NAME["max_new_tokens"].server_key  # "max_tokens"
# vLLM's top_k is -1 when off; the schema's off is 0.
TOP_K_OFF = -1

# Fields of both endpoints beside the sampling settings. Each is read below; "user" changes nothing
# Token Lab computes.
COMMON = {"model", "n", "stream", "stream_options", "seed", "stop", "user", MAX_TOKENS, "structured_outputs",
          "logprobs_distribution", "return_token_ids", "return_tokens_as_token_ids",
          "skip_special_tokens", "spaces_between_special_tokens", "best_of", "use_beam_search", "length_penalty"}
COMPLETION_FIELDS = COMMON | {"prompt", "echo", "logprobs", "prompt_logprobs", "suffix"}
CHAT_FIELDS = COMMON | {"messages", "logprobs", "top_logprobs", "max_completion_tokens",
                        "add_generation_prompt", "response_format"}
# The constraint's settings, read from vLLM's structured_outputs object (and OpenAI's
# response_format on chat), never under their own names.
CONSTRAINT = BY_NAME["constraint"].server_key  # "structured_outputs"
STRUCTURED_KEYS = {v[2]: k for k, v in CONSTRAINT_KINDS.items()}  # "json" -> "json_schema", ...
DISTRIBUTIONS = ("raw", "final")


@dataclass(frozen=True)
class Ask:
    """What one request asks of the engine, beside its prompts."""
    params: SamplingParams  # the first completion's; completion i is seeded with seed + i
    n: int  # completions per prompt
    max_tokens: int | None  # None: the endpoint's default; 0: no new tokens (echo only)
    stream: bool
    include_usage: bool  # streamed: a last chunk with the token counts
    logprobs: int | None  # candidates per token returned; None: no log-probabilities
    final: bool  # the log-probabilities of the distribution sampled from, not the model's own
    token_ids: bool  # vLLM's return_token_ids: each choice's new token ids
    ids_as_tokens: bool  # vLLM's return_tokens_as_token_ids: tokens named "token_id:N"
    max_tokens_key: str = "max_tokens"  # the field max_tokens was read from (chat: or max_completion_tokens)
    echo: bool = False  # completions: the prompt's tokens first, with their log-probabilities
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs: candidates per prompt token
    beams: bool = False  # vLLM's use_beam_search: one beam search of width n, its n best beams the choices

    def seeded(self, i: int, max_new_tokens: int) -> SamplingParams:
        """Completion i's settings: its own seed, so that n completions differ and each can be
        repeated; the first one's is the seed given."""
        return replace(self.params, seed=self.params.seed + i, max_new_tokens=max_new_tokens)


def _flag(body: dict, key: str, default: bool = False) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"{key} must be true or false, got {shown(value)}", key)
    return value


def _count(body: dict, key: str, low: int, high: int | None, default=None):
    """An integer field in [low, high], or `default` when absent or null."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        raise bad(f"{key} must be an integer, got {shown(value)}", key)  # NaN and Infinity too
    value = int(value)
    if value < low or (high is not None and value > high):
        raise bad(f"{key} must be in [{low}, {f'{high}]' if high is not None else '∞)'}, got {value}", key)
    return value


def check_unicode_values(body: dict) -> None:
    """400 naming the field where a text or a key holds a lone UTF-16 surrogate ("\\ud800"): no
    tokenizer can encode it, and no answer could quote it back as UTF-8."""
    found = lone_surrogate(body)
    if found is not None:
        where, field = found
        raise bad(f"{where} holds a lone surrogate: text must be valid Unicode, where surrogates come in pairs", field)


def check_fields(body, allowed: set[str], served: str | None = None) -> None:
    """Every field of the body is one the route reads: `allowed`, and the sampling settings
    unless `served` (what the route takes instead, said in the refusal) is given."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    unknown = sorted(k for k in body if k not in allowed and (served is not None or k not in SAMPLING_KEYS))
    if unknown:
        raise bad(f"Token Lab does not serve the field {unknown[0]!r}; "
                  + (served or "see docs/openai_api.md for what it serves"), unknown[0])


def check_model(body: dict, served: str, offered: list[str] | None = None) -> None:
    """The model asked for must be the one served (absent: the one served); `offered`: every
    model the server offers, named in the refusal."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad(f"model must be a model's name, got {shown(model)}", "model")
    if model is not None and model != served:
        names = ", ".join(repr(m) for m in (offered or [served]))
        raise APIError(404, f"The model {shown(model)} does not exist; this server serves {names}",
                       param="model", code="model_not_found")


def _logit_bias(value) -> str:
    """OpenAI's {"token id": bias} as the schema's text, ID:BIAS ..."""
    if not isinstance(value, dict):
        raise bad('logit_bias must be an object of token ids and biases, e.g. {"50256": -100}', "logit_bias")
    items = []
    for key, b in value.items():
        if not str(key).isdigit() or isinstance(b, bool) or not isinstance(b, (int, float)) or (isinstance(b, float) and not math.isfinite(b)):
            raise bad(f"logit_bias maps token ids to finite numbers, got {shown(key)}: {shown(b)}", "logit_bias")
        if not -MAX_BIAS <= b <= MAX_BIAS:  # OpenAI's range (the page's own logit bias has none)
            raise bad(f"logit_bias values must be in [-{MAX_BIAS}, {MAX_BIAS}], got {shown(key)}: {shown(b)}", "logit_bias")
        items.append(f"{int(key)}:{b!r}")
    return " ".join(items)


def _schema_text(schema, key: str) -> str:
    """A JSON schema sent as an object (or as its JSON text) as the constraint's text."""
    deep = f"{key} nests deeper than {MAX_SCHEMA_DEPTH} levels of objects and arrays: flatten the schema"
    field = key.split(".")[0]  # the request's field (structured_outputs, response_format)
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except RecursionError:
            raise bad(deep, field) from None
        except ValueError:
            raise bad(f"{key} must be a JSON schema (an object, or its JSON text)", field) from None
    if not isinstance(schema, dict):
        raise bad(f"{key} must be a JSON schema (an object)", field)
    try:
        return json.dumps(schema)
    except RecursionError:  # (the body's parser reads deeper than its writer writes)
        raise bad(deep, field) from None


def constraint(body: dict) -> dict:
    """The constraint a request asks for, as the schema's settings: vLLM's structured_outputs
    ({"json": schema} | {"regex": pattern} | {"grammar": EBNF}, one of them) or, on chat,
    OpenAI's response_format ({"type": "json_schema", "json_schema": {"schema": ...}},
    {"type": "json_object"} or {"type": "text"}). Both together are refused."""
    out = {}
    so = body.get(CONSTRAINT)
    if so is not None:
        kinds = [k for k in STRUCTURED_KEYS if isinstance(so, dict) and so.get(k) is not None]
        extra = sorted(set(so) - set(STRUCTURED_KEYS)) if isinstance(so, dict) else []
        if not isinstance(so, dict) or len(kinds) != 1 or extra:
            raise bad(f"{CONSTRAINT} must be an object with one of " + ", ".join(repr(k) for k in STRUCTURED_KEYS)
                      + (f"; Token Lab does not serve {extra[0]!r}" if extra else ""), CONSTRAINT)
        key = kinds[0]
        value = so[key]
        if key == "json":
            text = _schema_text(value, f"{CONSTRAINT}.json")
        elif isinstance(value, str):
            text = value
        else:
            raise bad(f"{CONSTRAINT}.{key} must be text", CONSTRAINT)
        out = {"constraint": STRUCTURED_KEYS[key], "constraint_text": text}
    rf = body.get("response_format")
    if rf is not None:
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind not in ("text", "json_object", "json_schema"):
            raise bad("response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                      "{\"type\": \"json_schema\", \"json_schema\": {\"schema\": ...}}", "response_format")
        if out and kind != "text":
            raise bad(f"response_format and {CONSTRAINT} together: send one constraint", "response_format")
        if kind == "json_object":
            out = {"constraint": "json_schema", "constraint_text": '{"type": "object"}'}
        elif kind == "json_schema":
            spec = rf.get("json_schema")
            if not isinstance(spec, dict) or "schema" not in spec:
                raise bad("response_format.json_schema must be an object with a schema", "response_format")
            out = {"constraint": "json_schema", "constraint_text": _schema_text(spec["schema"], "response_format")}
    if out:
        try:
            check(out["constraint"], out["constraint_text"])
        except InputError as e:
            raise bad(str(e), "response_format" if rf is not None else CONSTRAINT) from None
    return out


def sampling(body: dict, generation_defaults: dict, decoding: dict | None = None) -> SamplingParams:
    """The request's sampling settings over the model's defaults (parsed as every door's are:
    inference.request.parse_settings), its seed (a random one when not given: the answer's
    completions can then be told apart, not repeated) and stops."""
    raw = {}
    for key, s in SAMPLING_KEYS.items():
        value = body.get(key)
        if value is None:
            continue
        if s.kind is not str and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise bad(f"{key} must be a number, got {shown(value)}", key)  # "0.5" too: JSON has numbers
        if s.name == "logit_bias":
            value = _logit_bias(value)
        elif s.name == "top_k" and value == TOP_K_OFF:
            value = 0
        elif s.name == "top_k" and value < 0:
            raise bad(f"top_k must be -1 or 0 (off) or a whole number of tokens to keep, got {shown(value)}", key)
        raw[s.name] = value
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
        raise bad("stop must be a string or a list of strings", "stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad(f"seed must be an integer, got {shown(seed)}", "seed")
    try:  # max_new_tokens is the endpoint's to settle (Ask.seeded): any valid value here
        return parse_settings({**raw, **constraint(body), **(decoding or {}), "max_new_tokens": 1},
                              generation_defaults, choose_seed(seed), stops)
    except SettingErrors as e:  # the first, as the request's field names it
        field, message = e.errors[0]
        raise bad(message, request_key(field)) from None
    except InputError as e:
        raise bad(str(e), request_key(e.field)) from None


def _ask(body: dict, generation_defaults: dict, max_tokens_key: str, min_tokens: int,
         token_cap: int | None, **rest) -> Ask:
    """The fields both endpoints share."""
    for key, vllm_default in (("skip_special_tokens", True), ("spaces_between_special_tokens", True)):
        if body.get(key) is True:
            raise bad(f"{key}: Token Lab writes special tokens' text as tokens (every token but the "
                      "end-of-sequence one); send false or leave it out", key)
    if body.get("suffix") is not None:
        raise bad("suffix (insertion) is not served: Token Lab continues a prompt", "suffix")
    n = _count(body, "n", 1, MAX_N, 1)
    best_of = _count(body, "best_of", 1, None, n)
    if best_of != n:
        raise bad("best_of is not served: every completion generated is returned (leave it out, or equal to n)", "best_of")
    beams, decoding = _flag(body, "use_beam_search"), None
    if beams:  # as vLLM: n is the beam width, and the n best beams are the choices
        widest = BY_NAME["num_beams"].maximum
        if not 2 <= n <= widest:
            raise bad(f"use_beam_search needs n from 2 to {widest}: n is the beam width, got {n}", "n")
        for key in ("stream", "logprobs", "top_logprobs", "echo", "prompt_logprobs"):
            if body.get(key) not in (None, False):
                raise bad(f"{key} is not served with use_beam_search: a beam search answers with its beams "
                          "at its end", key)
        decoding = {"num_beams": n, "length_penalty": body.get("length_penalty", 1.0)}
    elif body.get("length_penalty") is not None:
        raise bad("length_penalty applies to a beam search: send use_beam_search: true", "length_penalty")
    max_tokens = _count(body, max_tokens_key, min_tokens, None)
    if token_cap is not None and max_tokens is not None and max_tokens > token_cap:
        raise bad(tokens_message(token_cap, max_tokens), max_tokens_key)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad("stream_options must be an object", "stream_options")
    stream = _flag(body, "stream")
    if options is not None and not stream:
        raise bad("stream_options needs stream: true", "stream_options")
    distribution = body.get("logprobs_distribution", "raw")
    if distribution not in DISTRIBUTIONS:
        raise bad(f"logprobs_distribution must be 'raw' (the model's own, the default) or 'final' "
                  f"(the distribution sampled from), got {shown(distribution)}", "logprobs_distribution")
    return Ask(sampling(body, generation_defaults, decoding), n, max_tokens, stream,
               stream and _flag(options or {}, "include_usage"), final=distribution == "final",
               token_ids=_flag(body, "return_token_ids"),
               ids_as_tokens=_flag(body, "return_tokens_as_token_ids"), max_tokens_key=max_tokens_key,
               beams=beams, **rest)


def completion_ask(body, served: str, generation_defaults: dict, token_cap: int | None) -> tuple[list, Ask]:
    """/v1/completions: (the prompts, each a text or a list of token ids; what to do)."""
    check_fields(body, COMPLETION_FIELDS)
    check_model(body, served)
    prompts = prompt_list(body.get("prompt"))
    ask = _ask(body, generation_defaults, MAX_TOKENS, 0, token_cap,
               logprobs=_count(body, "logprobs", 0, MAX_LOGPROBS), echo=_flag(body, "echo"),
               prompt_logprobs=_count(body, "prompt_logprobs", 0, MAX_LOGPROBS))
    if ask.stream and ask.echo and ask.logprobs is not None and len(prompts) > 1:
        raise bad("a streamed echo with logprobs takes one prompt", "echo")
    return prompts, ask


def prompt_list(prompt) -> list:
    """OpenAI's prompt forms: a text, a list of texts, a list of token ids, a list of lists of ids."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            out = list(prompt)
        elif all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            out = [list(prompt)]
        elif all(isinstance(p, list) and p and all(isinstance(i, int) and not isinstance(i, bool) for i in p)
                 for p in prompt):
            out = [list(p) for p in prompt]
        else:
            out = None
        if out is not None:
            if len(out) > MAX_PROMPTS:
                raise bad(f"at most {MAX_PROMPTS} prompts a request, got {len(out)}", "prompt")
            return out
    raise bad("prompt must be a text, a list of texts, a list of token ids or a list of lists of "
              "token ids", "prompt")


def chat_ask(body, served: str, generation_defaults: dict, token_cap: int | None) -> tuple[dict, Ask]:
    """/v1/chat/completions: (the engine's chat arguments: prompt, system and history; what to do)."""
    check_fields(body, CHAT_FIELDS)
    check_model(body, served)
    if body.get("add_generation_prompt") is False:
        raise bad("add_generation_prompt false is not served: the answer is the assistant's next "
                  "message", "add_generation_prompt")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else MAX_TOKENS
    logprobs = _flag(body, "logprobs")
    top = _count(body, "top_logprobs", 0, MAX_LOGPROBS, 0)
    if body.get("top_logprobs") is not None and not logprobs:
        raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    ask = _ask(body, generation_defaults, key, 1, token_cap, logprobs=top if logprobs else None)
    return chat_arguments(body.get("messages")), ask


def _content(message: dict, i: int) -> str:
    """A message's text: a string, or a list of text parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise bad(f"messages[{i}].content must be text or a list of text parts (Token Lab's models "
              "read text only)", "messages")


def chat_arguments(messages) -> dict:
    """OpenAI's messages as the engine's chat arguments: one system message first (if any),
    the earlier user and assistant turns, and the last message, the user's."""
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise bad("messages must be a non-empty list of {role, content} objects", "messages")
    system = None
    turns = []
    for i, m in enumerate(messages):
        extra = sorted(set(m) - {"role", "content"})
        if extra:  # (name included: the chat templates Token Lab renders have no place for it)
            raise bad(f"messages[{i}] has {extra[0]!r}: Token Lab's chat templates read a message's role "
                      "and content only", "messages")
        role = m.get("role")
        if role in ("system", "developer") and i == 0:
            system = _content(m, i)
        elif role in ("user", "assistant"):
            turns.append({"role": role, "content": _content(m, i)})
        else:
            raise bad(f"messages[{i}].role must be user or assistant (a system message only first), "
                      f"got {shown(role)}", "messages")
    if not turns or turns[-1]["role"] != "user":
        raise bad("the last message must be the user's: the answer is the assistant's next message", "messages")
    return {"prompt": turns[-1]["content"], "system": system, "history": turns[:-1]}
