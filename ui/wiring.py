"""The page's components by name, and events wired by name.

Each section adds its components under names; a handler returns {name: value} for the
components it changes, and `Page.on` hands Gradio {component: value}, so that adding a panel
never shifts anyone's positions. A name a handler leaves out keeps its component as it is.

The sections meet here, not in each other's modules: a section built inside another's layout
names its slot (fill), adds its own steps after a run's end or a model's pick (the hooks), and
starts a run by the run section's chain (chain_run), each by name or through the Page."""

from __future__ import annotations

import functools
import inspect
import typing
from typing import Callable, Iterable, Sequence

import gradio as gr


class Page:
    """Every component of the page, by name, as the sections lay them out."""

    def __init__(self, sections: Sequence = (), handlers=None):
        self._by_name: dict[str, gr.blocks.Block] = {}
        # The page's sections in their order (ui/layout.py), and their handlers: a section built
        # inside another's layout (its SLOT) is built where that one calls fill(slot).
        self.sections, self.handlers = tuple(sections), handlers
        # The run section's chain (click -> begin -> run -> its end): chain_run(trigger) starts a
        # run from another section's trigger (a branch, an edit, an opened beam). Set by ui/run.
        self.chain_run: Callable | None = None
        # Scripts run in the browser when a run starts and when it has ended (ui/work's lost-run mark).
        self.run_going_js: list[str] = []
        self.run_ended_js: list[str] = []
        # At the page's load, before the saved work: (fn, inputs, outputs) hooks (ui/share's link
        # settings), and the scripts run once they are applied.
        self.load_hooks: list[tuple] = []
        self.loaded_js: list[str] = []
        # (fn, inputs, outputs) run after every run of the page has ended (a section's own
        # bookkeeping of runs: ui/branches), in order, outside the queue.
        self.after_run: list[tuple] = []
        # The same after an ended run is put on view again (a branch, an undo, the saved work).
        self.after_view: list[tuple] = []
        # The same after a model was picked in the picker (and loaded on its first use).
        self.after_pick: list[tuple] = []

    def add(self, name: str, component):
        if name in self._by_name:
            raise ValueError(f"two components named {name!r}")
        self._by_name[name] = component
        return component

    def __getitem__(self, name: str):
        return self._by_name[name]

    def fill(self, slot: str) -> None:
        """Build, here, each section whose SLOT is `slot` (in the page's order of sections)."""
        for section in self.sections:
            if getattr(section, "SLOT", None) == slot:
                section.build(self, self.handlers)

    def all(self, names: Iterable[str]) -> list:
        return [self._by_name[n] for n in names]

    def on(self, trigger: Callable, fn: Callable | None, inputs: Sequence[str] = (),
           outputs: Sequence[str] = (), **kwargs):
        """trigger(fn, inputs, outputs, **kwargs) with components named: a multi-output fn
        returns (or yields) {name: value}; a single-output one its value."""
        outs = self.all(outputs)
        if fn is not None and len(outs) > 1:
            fn = keyed(fn, dict(zip(outputs, outs)))
        return trigger(fn, inputs=self.all(inputs), outputs=outs, **kwargs)


    def chain(self, event, hooks: list[tuple]):
        """event, then each (fn, inputs, outputs) of hooks in order, as one event outside the
        queue (each event costs the browser about a quarter of a CPU second, whatever it
        carries). A hook's inputs are as its own event would see them: what an earlier hook
        returned for a component, else the component's value."""
        return self.on_all(event.then, hooks) if hooks else event

    def on_all(self, trigger: Callable, hooks: list[tuple]):
        """trigger, then each (fn, inputs, outputs) of hooks in order, as one event outside the
        queue (see chain)."""
        fn, inputs, outputs = fused(hooks)
        return self.on(trigger, fn, inputs=inputs, outputs=outputs, queue=False, show_progress="hidden",
                       api_visibility="private")


def fused(hooks: list[tuple]) -> tuple[Callable, tuple[str, ...], tuple[str, ...]]:
    """(fn, inputs, outputs): one handler that runs each (fn, inputs, outputs) of hooks in order
    and returns {name: value} for every component any of them changed (the last value wins)."""
    inputs = tuple(dict.fromkeys(n for _, ins, _ in hooks for n in ins))
    outputs = tuple(dict.fromkeys(n for _, _, outs in hooks for n in outs))
    takes_request = [_takes_request(fn) for fn, _, _ in hooks]

    def run_hooks(*args, request: gr.Request = None) -> dict:
        # Gradio passes the request where the signature names it: after the inputs.
        request = args[len(inputs)] if len(args) > len(inputs) else request
        values, changed = dict(zip(inputs, args)), {}
        for (fn, ins, outs), req in zip(hooks, takes_request):
            result = fn(*(values[n] for n in ins), **({"request": request} if req else {}))
            result = result if len(outs) > 1 else {outs[0]: result}
            for name, value in result.items():
                changed[name] = value
                if not _is_update(value):  # (an update's other settings are not a value)
                    values[name] = value
                elif "value" in value:
                    values[name] = value["value"]
        return changed if len(outputs) > 1 else changed.get(outputs[0], gr.skip())

    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in inputs]
    params.append(inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                    annotation=gr.Request))
    run_hooks.__signature__ = inspect.Signature(params)
    run_hooks.__annotations__ = {"request": gr.Request}
    run_hooks.__name__ = "_then_".join(getattr(fn, "__name__", "hook") for fn, _, _ in hooks)
    return run_hooks, inputs, outputs


def _takes_request(fn: Callable) -> bool:
    return "request" in inspect.signature(fn).parameters


def _is_update(value) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update"


def keyed(fn: Callable, components: dict[str, object]) -> Callable:
    """fn, its {name: value} results handed to Gradio as {component: value}. The signature is
    fn's: Gradio reads parameter names (the API's) and where to pass the request from it."""
    first = next(iter(components.values()))

    def convert(values: dict) -> dict:
        unknown = set(values) - set(components)
        if unknown:
            raise KeyError(f"{fn.__name__} returned values for {sorted(unknown)}, not among its outputs")
        # An empty dict changes nothing: one skip says so (Gradio needs at least one entry).
        return {components[n]: v for n, v in values.items()} or {first: gr.skip()}

    if inspect.isgeneratorfunction(fn) or inspect.isgeneratorfunction(getattr(fn, "__func__", None)):
        def wrapper(*args, **kwargs):
            for values in fn(*args, **kwargs):
                yield convert(values)
    else:
        def wrapper(*args, **kwargs):
            return convert(fn(*args, **kwargs))
    functools.update_wrapper(wrapper, fn)
    del wrapper.__wrapped__
    wrapper.__signature__ = sig = inspect.signature(fn)
    # Gradio finds the request by type hint; the hints are resolved here, in fn's own module
    # (the wrapper's would not know fn's names).
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError):
        hints = {}
    hints.update({p.name: p.annotation for p in sig.parameters.values()
                  if p.annotation is not sig.empty and not isinstance(p.annotation, str)})
    hints.pop("return", None)
    wrapper.__annotations__ = hints
    return wrapper
