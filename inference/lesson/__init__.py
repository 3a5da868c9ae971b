"""The lesson "Follow one token": a prompt's next token through tokenizer, model and sampler,
with the engine's own numbers and this machine's measurements (explain.explain)."""
