"""What a server serves: the model it names, the model's config where this machine has it, and
which distribution its log-probabilities are."""

from __future__ import annotations

import json
import math
from pathlib import Path

from inference.contract import Capabilities, EngineInfo
from inference.errors import InputError, ModelError, ModelNotServed, ServerError
from inference.model.config import ModelConfig
from inference.remote.http import ServerHTTP
from inference.sampling.settings import SETTINGS


def server_info(name: str, url: str, max_seq_len: int, logprobs: str, logprobs_source: str,
                cfg: ModelConfig | None = None, config_source: str | None = None,
                config_dtype: str | None = None, kv_bytes: int | None = None,
                kv_bytes_source: str = "") -> EngineInfo:
    """A served model's EngineInfo. logprobs: "raw" or "processed", which distribution the
    server's numbers are; kv_bytes: bytes per KV-cache value on the server, where known."""
    caps = Capabilities(internals=False, whole_distribution=False, measured_kv=False, server_load=True,
                        settings=frozenset(s.name for s in SETTINGS if s.server_key is not None or s.sent_by_stage),
                        masked_mass=False,
                        logprobs=logprobs, local_timing=False)
    return EngineInfo(name, max_seq_len, cfg, caps, url, kv_bytes, kv_bytes_source,
                      logprobs_source=logprobs_source, config_source=config_source, config_dtype=config_dtype)



def pick_model(models, wanted: str | None, url: str) -> dict:
    entries = models.get("data") if isinstance(models, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "id" in e for e in entries):
        raise ServerError(f"{url}/models is not an OpenAI model list")
    ids = [e["id"] for e in entries]
    if wanted is not None:
        for e in entries:
            if wanted in (e["id"], e.get("root")):
                return e
        raise ModelNotServed(f"the model server at {url} does not serve {wanted!r}; it serves "
                             f"{', '.join(map(repr, ids)) or 'nothing'}")
    if len(entries) != 1:
        raise InputError(f"the model server at {url} serves {len(entries)} models "
                         f"({', '.join(map(repr, ids))}); choose one with --engine-model NAME")
    return entries[0]


def read_config(given: str | None, served_root: str | None):
    """(cfg, where it was read, its dtype, sampling defaults) from a config.json or a model
    directory: the one given, else the path the server loaded the model from when this machine
    has it. A config that is given but unreadable is an error; a served path that is not here is
    no config."""
    from inference.loading.load import generation_defaults

    path = Path(given).expanduser() if given else None
    if path is None and served_root and Path(served_root).is_dir():
        path = Path(served_root)
    if path is None:
        return None, None, None, {}
    config = path / "config.json" if path.is_dir() else path
    if not config.is_file():
        if given:
            raise ModelError(f"--engine-config {given}: no config.json there")
        return None, None, None, {}
    cfg = ModelConfig.from_json(config)
    data = json.loads(config.read_text(encoding="utf-8"))
    dtype = data.get("torch_dtype") or data.get("dtype")
    gen = generation_defaults(config.parent)
    return cfg, str(config), dtype if isinstance(dtype, str) else None, gen


def probe_logprobs_mode(http: ServerHTTP, model: str) -> str:
    """Which distribution the server's log-probabilities are: one greedy-free request for one
    token with top-k 1. With processed log-probabilities only that token is left (log p = 0,
    the rest -inf, which vLLM writes as -9999); raw ones are the model's distribution (log p < 0
    for both). Logits instead of log-probabilities (raw_logits, processed_logits) are refused."""
    body = {"model": model, "prompt": "The", "max_tokens": 1, "temperature": 1.0, "top_k": 1,
            "seed": 0, "logprobs": 2, "return_tokens_as_token_ids": True}
    answer = http.post_json("/completions", body)
    try:
        top = answer["choices"][0]["logprobs"]["top_logprobs"][0]
        values = sorted((float(v) for v in top.values()), reverse=True)
    except (KeyError, IndexError, TypeError, ValueError):
        raise ServerError("the model server returned no log-probabilities; Token Lab needs an "
                          "OpenAI completions API with logprobs (vLLM)") from None
    if len(values) < 2:
        raise ServerError("the model server returned fewer log-probabilities than asked for")
    v1, v2 = values[:2]
    restart = ("; restart it with --logprobs-mode raw_logprobs (vLLM's default) or "
               "processed_logprobs, or say which with --engine-logprobs")
    if v2 <= -9000 or math.isinf(v2):  # top-k 1 removed the rest: processed numbers
        if abs(v1) < 1e-4:
            return "processed"
        raise ServerError(f"the model server returns processed logits, not log-probabilities{restart}")
    if v1 > 1e-4 or math.exp(v1) + math.exp(v2) > 1 + 1e-3:
        raise ServerError(f"the model server returns raw logits, not log-probabilities{restart}")
    return "raw"
