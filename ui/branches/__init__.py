"""Branches of a run: continue from any candidate of any step, as token ids, and switch between them."""
