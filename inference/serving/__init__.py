"""Serving: the engine, its scheduler, the paged KV pool, per-step statistics, stop strings."""
