"""The models one server offers (`app.py --model A --model B`): each loaded on its first use,
what each takes in memory, and a load that would not fit refused before it starts."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from inference.device import available_memory_bytes
from inference.errors import InputError, shown
from inference.model.quant import QuantWeight

# What a load leaves free besides the new model's weights and KV pool: the page, the Python
# heap of its sessions, the forward pass's activations.
RESERVE_BYTES = 512 * 2**20


@dataclass(frozen=True)
class Footprint:
    """A model's memory: its weights (and the linear layers' second copies) and its KV pool (the
    pool is reserved whole; on a CPU its pages are committed only as runs write them)."""
    weights_bytes: int  # the parameters and tables as loaded, and copies_bytes
    pool_bytes: int
    copies_bytes: int = 0  # of weights_bytes: the second copies (reduced precision, or oneDNN's packed layout)

    @property
    def total(self) -> int:
        return self.weights_bytes + self.pool_bytes


def footprint_of(engine) -> Footprint:
    """What a loaded local engine holds (a server's engine holds nothing here): its parameters
    and tables, and the linear layers' second copies (a reduced-precision one for decoding, or
    oneDNN's layout for several rows: model.layers.Linear)."""
    model = getattr(engine, "model", None)
    if model is None:
        return Footprint(0, 0)
    seen, weights = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() not in seen:  # a tied LM head is the embedding
            seen.add(t.data_ptr())
            weights += t.numel() * t.element_size()
    blocks = {id(m.qweight): m.qweight for m in model.modules() if getattr(m, "qweight", None) is not None}
    weights += sum(b.nbytes for b in blocks.values())  # a GGUF file's blocks: no parameters
    copies = {id(c): c for m in model.modules()
              for c in (getattr(m, "decode_weight", None), getattr(m, "rows_weight", None)) if c is not None}
    copied = sum(c.nbytes if isinstance(c, QuantWeight) else c.numel() * c.element_size() for c in copies.values())
    pool = engine.scheduler.pool
    return Footprint(weights + copied, pool.k.numel() * pool.k.element_size() + pool.v.numel() * pool.v.element_size(),
                     copied)


class Models:
    """Offered models by label, in the order given; the first is the page's default. Each
    engine is opened by `open_engine(spec, pool_mib)` on its first use; `needs(spec)` says what
    its weights will take (None when unknown before loading), so that a load that cannot fit
    in the memory available is refused with a one-line message."""

    def __init__(self, specs: list, open_engine: Callable, needs: Callable | None = None,
                 available: Callable[[], int] = available_memory_bytes, labels: list[str] | None = None):
        if not specs:
            raise ValueError("no model to offer")
        self.labels = list(labels or [str(s) for s in specs])
        if len(set(self.labels)) != len(self.labels):
            raise InputError("the same model is given twice")
        self._spec = dict(zip(self.labels, specs))
        self._open, self._needs, self._available = open_engine, needs, available
        self._engines: dict[str, object] = {}
        self._lock = threading.Lock()  # one load at a time; a second asker waits for it

    @classmethod
    def of(cls, engine, label: str | None = None) -> "Models":
        """One engine, already open."""
        label = label or engine.describe().name
        models = cls([label], open_engine=None, labels=[label])
        models._engines[label] = engine
        return models

    @property
    def default(self) -> str:
        return self.labels[0]

    def label_of(self, label: str | None) -> str:
        """The offered label asked for ("" or None: the default); an unknown one is refused."""
        if not label:
            return self.default
        if label not in self._spec:
            raise InputError(f"model {shown(label)} is not offered here; choose one of {', '.join(self.labels)}")
        return label

    def loaded(self, label: str) -> bool:
        return label in self._engines

    def engine(self, label: str | None = None):
        """The model's engine, opened now if this is its first use."""
        label = self.label_of(label)
        engine = self._engines.get(label)
        if engine is not None:
            return engine
        with self._lock:
            if label not in self._engines:
                self._engines[label] = self._load(label)
            return self._engines[label]

    def _load(self, label: str):
        spec = self._spec[label]
        held = sum(footprint_of(e).pool_bytes for e in self._engines.values())
        # The pools already reserved are not yet committed: what is available now still counts
        # them, and a new model may not take what they were promised.
        room = self._available() - held - RESERVE_BYTES
        need = self._needs(spec) if self._needs is not None else None
        if need is not None and need > room:
            raise InputError(f"model {label} needs {need / 2**20:,.0f} MiB for its weights but only "
                             f"{max(room, 0) / 2**20:,.0f} MiB are free beside the models loaded")
        # Its KV pool: a quarter of what is left after its weights (a lone model's default).
        pool_mib = max(room - (need or 0), 0) / 4 / 2**20 if self._engines else None
        return self._open(spec, pool_mib)

    def footprint(self, label: str) -> Footprint | None:
        """What a loaded model takes; None while it is not loaded."""
        engine = self._engines.get(label)
        return None if engine is None else footprint_of(engine)

    def close(self) -> None:
        for engine in list(self._engines.values()):
            engine.close()

    def __enter__(self) -> "Models":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
