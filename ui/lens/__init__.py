"""The quantization lens: the model at several precisions on one prompt, token by token."""
