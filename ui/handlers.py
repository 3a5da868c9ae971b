"""Every page event: one handler object a section (ui/<section>/handlers.py), over one shared
PageContext (ui/base.py) and the page's runs (ui/shared/runs.py: the one prepared request every
section starts a run with). Their methods are plain functions tests can call; multi-output ones
return {component name: value}. No section is given another's."""

from __future__ import annotations

from server.limits import Limits
from server.registry import RunRegistry
from ui.base import PageContext
from ui.branches.handlers import BranchHandlers
from ui.chat import ChatHandlers
from ui.decoding.handlers import DecodingHandlers
from ui.edit.handlers import EditHandlers
from ui.experiments.handlers import ExperimentHandlers
from ui.inside.handlers import InsideHandlers
from ui.lens.handlers import LensHandlers
from ui.lesson.handlers import LessonHandlers
from ui.loom.handlers import LoomHandlers
from ui.run.handlers import RunHandlers
from ui.run.picker import PickerHandlers
from ui.samples.handlers import SampleHandlers
from ui.share import ShareHandlers
from ui.shared.downloads import Downloads
from ui.shared.runs import Runs
from ui.text_score.handlers import TextScoreHandlers
from ui.work.handlers import WorkHandlers


class Handlers:
    """The page's sections' events over one context: the engine (inference.contract's Engine),
    the run registry and the limits, passed in (PageContext's arguments); files_dir: where the
    downloads are written (a temporary folder by default)."""

    def __init__(self, engine, registry: RunRegistry | None = None, top_n: int = 10,
                 update_interval_s: float | None = None, limits: Limits | None = None,
                 files_dir: str | None = None, models=None):
        self.page = PageContext(engine, registry, top_n, update_interval_s, limits, models)
        self.page.runs = Runs(self.page, Downloads(files_dir))
        self.run = RunHandlers(self.page)
        self.picker = PickerHandlers(self.page)
        self.experiments = ExperimentHandlers(self.page)
        self.samples = SampleHandlers(self.page)
        self.text_score = TextScoreHandlers(self.page)
        self.inside = InsideHandlers(self.page)
        self.chat = ChatHandlers(self.page)
        self.share = ShareHandlers(self.page)
        self.branches = BranchHandlers(self.page)
        self.edit = EditHandlers(self.page)
        self.work = WorkHandlers(self.page)
        self.lesson = LessonHandlers(self.page)
        self.decoding = DecodingHandlers(self.page)
        self.lens = LensHandlers(self.page)
        self.loom = LoomHandlers(self.page)
