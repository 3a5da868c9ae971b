"""The OpenAI-compatible API beside the page: /v1/models, /v1/completions and
/v1/chat/completions (with vLLM's /tokenize, /detokenize and /tokenizer_info at the root), served
on the page's own port by the same engine, under the same logins and per-visitor limits.
routes.py mounts it; params.py reads a request; answers.py writes OpenAI's objects; runs.py runs
a request's completions on the engine; errors.py is OpenAI's error body. What it does not cover:
docs/openai_api.md."""
