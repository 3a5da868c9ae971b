"""The server engine: the engine contract served by a vLLM server over its OpenAI API."""
