"""The loom: a tree of continuations grown from a point of a run (section, handlers, render, store)."""
