"""Every page event: one handler object a section (ui/<section>/handlers.py), over one shared
PageContext (ui/base.py). Their methods are plain functions tests can call; multi-output ones
return {component name: value}. A section that runs another's events is given that section."""

from __future__ import annotations

from server.limits import Limits
from server.registry import RunRegistry
from ui.base import PageContext
from ui.branches.handlers import BranchHandlers
from ui.chat import ChatHandlers
from ui.edit.handlers import EditHandlers
from ui.experiments.handlers import ExperimentHandlers
from ui.inside.handlers import InsideHandlers
from ui.lesson.handlers import LessonHandlers
from ui.run.handlers import RunHandlers
from ui.samples.handlers import SampleHandlers
from ui.share import ShareHandlers
from ui.text_score.handlers import TextScoreHandlers
from ui.work.handlers import WorkHandlers
from ui.decoding.handlers import DecodingHandlers


class Handlers:
    """The page's sections' events over one context: the engine (inference.contract's Engine),
    the run registry and the limits, passed in (PageContext's arguments)."""

    def __init__(self, engine, registry: RunRegistry | None = None, top_n: int = 10,
                 update_interval_s: float | None = None, limits: Limits | None = None,
                 files_dir: str | None = None, models=None):
        self.page = PageContext(engine, registry, top_n, update_interval_s, limits, models)
        self.run = RunHandlers(self.page, files_dir)
        self.experiments = ExperimentHandlers(self.page, self.run)
        self.samples = SampleHandlers(self.page, self.run)
        self.text_score = TextScoreHandlers(self.page)
        self.inside = InsideHandlers(self.page)
        self.chat = ChatHandlers(self.page, self.run)
        self.share = ShareHandlers(self.page)
        self.branches = BranchHandlers(self.page, self.run)
        self.edit = EditHandlers(self.page, self.run, self.branches)
        self.work = WorkHandlers(self.page, self.run, self.branches)
        self.lesson = LessonHandlers(self.page)
        self.decoding = DecodingHandlers(self.page, self.run)
