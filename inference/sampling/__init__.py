"""Sampling: the settings schema, the stages from logits to the distribution drawn from, replay."""
