"""/generate over Gradio's API by name: its parameters from the page's Controls (the settings
schema) and its outputs from RUN_OUTPUTS, so that no test lists them by position."""

from dataclasses import asdict

from ui.controls import Controls
from ui.shared.outputs import RUN_OUTPUTS

# A short greedy run: what most API tests ask for.
ARGS = asdict(Controls(prompt="The quick", temperature=0.0, max_new_tokens=20, seed="5"))


def call(**kw) -> list:
    """/generate's positional values: ARGS with `kw` replacing some, by name."""
    return Controls(**{**ARGS, **kw}).values()


def output(result, name: str):
    """One of /generate's outputs, by its component's name."""
    return result[RUN_OUTPUTS.index(name)]
