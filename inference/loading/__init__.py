"""Loading: checkpoints (safetensors, GGUF), the default model, tokenizers, chat templates."""
