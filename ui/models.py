"""What the page knows of each model it offers: its engine and what the page derives from it
(its capabilities, context window, default settings, the note under its bars), made on the
model's first use."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ui.controls import CHAT_PROMPT, Controls
from ui.format import bars_note
from ui.streaming import update_interval_for


@dataclass(frozen=True)
class ModelView:
    """One offered model as the page uses it."""
    label: str
    engine: object  # inference.contract's Engine
    info: object  # its EngineInfo
    defaults: Controls  # the page's settings with the model's generation_config.json
    bars_note: str
    update_interval_s: float

    @property
    def caps(self):
        return self.info.capabilities

    @property
    def context(self) -> int:
        return self.info.max_seq_len

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def default_system(self) -> str:
        return self.engine.default_system_prompt or ""


class ModelViews:
    """A ModelView for each offered model (inference.serving.models.Models), made once."""

    def __init__(self, models, top_n: int, max_new_tokens_cap: int | None,
                 update_interval_s: float | None = None):
        self.models, self.top_n, self.cap, self.update_interval_s = models, top_n, max_new_tokens_cap, update_interval_s
        self._views: dict[str, ModelView] = {}
        self._lock = threading.Lock()

    def __call__(self, label: str | None = None) -> ModelView:
        """The model's view (label "" or None: the default), loading it on its first use; an
        unknown model, or one that does not fit in memory, raises InputError."""
        label = self.models.label_of(label)
        view = self._views.get(label)
        if view is None:
            engine = self.models.engine(label)
            with self._lock:
                view = self._views.get(label) or self._make(label, engine)
                self._views[label] = view
        return view

    def _make(self, label: str, engine) -> ModelView:
        info = engine.describe()
        defaults = Controls.for_model(engine.generation_defaults)
        if info.chat:  # an instruct model: its first run is a chat turn
            defaults.mode, defaults.prompt = "chat", CHAT_PROMPT
        if self.cap is not None and defaults.max_new_tokens > self.cap:
            defaults.max_new_tokens = self.cap
        return ModelView(label, engine, info, defaults, bars_note(info, self.top_n),
                         self.update_interval_s or update_interval_for(info))
