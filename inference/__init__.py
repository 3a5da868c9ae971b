"""Token Lab's inference engine: a LLaMA-architecture model in PyTorch, one token at a time."""
