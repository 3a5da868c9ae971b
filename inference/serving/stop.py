"""Stop strings: find them in the streamed text, holding back text that may still become one."""

from __future__ import annotations


class StopMatcher:
    """Feed text deltas; get back what is safe to show. A found stop string is never shown."""

    def __init__(self, stops: tuple[str, ...] | list[str]):
        self.stops = tuple(s for s in stops if s)
        self.pending = ""
        self.matched: str | None = None

    def push(self, delta: str) -> str:
        if not self.stops:
            return delta
        self.pending += delta
        hits = [(self.pending.find(s), s) for s in self.stops if s in self.pending]
        if hits:
            index, self.matched = min(hits)
            out, self.pending = self.pending[:index], ""
            return out
        hold = self._held_length()
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        """At the end of a run nothing can complete a stop string: release what was held."""
        out, self.pending = self.pending, ""
        return out

    def _held_length(self) -> int:
        """Length of the longest suffix of pending that is a proper prefix of some stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(s[:k]):
                    best = k
                    break
        return best
