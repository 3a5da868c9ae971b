"""The model and its maths: config, RoPE, the transformer, the KV cache, one step's anatomy."""
