"""The sampling experiments: replay of a step, compare A/B, how likely was X."""
