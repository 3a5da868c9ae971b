"""Every page event, one class: each section's handlers (ui/<section>) mixed in over PageBase's
shared state. Its methods are plain functions tests can call; multi-output ones return
{component name: value}."""

from ui.branches.handlers import BranchHandlers
from ui.edit.handlers import EditHandlers
from ui.work.handlers import WorkHandlers
from ui.chat import ChatHandlers
from ui.experiments.handlers import ExperimentHandlers
from ui.inside.handlers import InsideHandlers
from ui.run.handlers import DOWNLOAD_ROUTE, KEEP_FILES, RUN_OUTPUTS, STALE_PANELS, RunHandlers  # noqa: F401
from ui.samples.handlers import SampleHandlers
from ui.share import ShareHandlers
from ui.text_score.handlers import TextScoreHandlers
from ui.decoding.handlers import DecodingHandlers


class Handlers(RunHandlers, ExperimentHandlers, SampleHandlers, TextScoreHandlers, InsideHandlers, ChatHandlers,
               ShareHandlers, BranchHandlers, EditHandlers, WorkHandlers, DecodingHandlers):
    """The engine (inference.contract's Engine), the run registry and the limits, passed in."""
