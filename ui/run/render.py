"""What the run section's own controls show: the mode's choice, the sampler order, the model
picker's list and its loading line. Pure functions (a run on view: ui/shared/view.py)."""

from __future__ import annotations

import html

from inference.sampling.settings import BY_NAME, DEFAULT_ORDER, decode_order, order
from ui.shared.view import status_text
from server.limits import Limits
from ui.run_state import RunRecord


MODE_INFO = ("chat wraps the prompt in the model's chat template; follow-ups continue the conversation. "
             "Choosing a mode swaps in its example")


def mode_choice(info) -> dict:
    """The mode radio's state for a model: chat offered only where its template can render it."""
    if info.chat:
        return {"interactive": True, "info": MODE_INFO}
    return {"interactive": False, "value": "completion", "info": "completion only: this model has no chat template"}


def order_html(params=None, error: str = "") -> str:
    """The order the stages will run in (settings.order: those sampler_order lists, then the
    rest in DEFAULT_ORDER), numbered; the stages these settings turn on are marked "on", the
    others dimmed. `error`: why the settings cannot be read (the default order is shown)."""
    listed = decode_order(params.sampler_order.strip()) if params is not None else ()
    active = set(params.changed) if params is not None else set()
    names = order(params.sampler_order) if params is not None else DEFAULT_ORDER
    chips = "".join(
        f"<li class='{'tl-on' if n in active else 'tl-off'}{' tl-listed' if n in listed else ''}' "
        f"title='{html.escape(BY_NAME[n].label)}{' (on)' if n in active else ' (off)'}'>"
        f"<code>{n}</code>{'<b> on</b>' if n in active else ''}</li>" for n in names)
    head = ("Order this run's stages will run in" + (f" ({len(listed)} listed first by <i>Sampler order</i>, "
            "then the rest in the default order)" if listed else " (the default order)") + ":")
    note = f"<div class='tl-order-error'>⚠ {html.escape(error)}</div>" if error else ""
    default = ("<div class='tl-order-default'>Default: " + " → ".join(DEFAULT_ORDER) + ". To reorder, list the "
               "<b>on</b> stages in <i>Sampler order</i> in the order you want, e.g. <code>top_k,temperature</code>.</div>")
    return f"<div class='tl-order'>{note}<div>{head}</div><ol>{chips}</ol>{default}</div>"


LOADING = "Loading"


def loading_text(label: str, stage: str = "", seconds: float = 0.0) -> str:
    """The status line while a model loads on its first use: what the load does now (its
    stages: fetched with pip, checked, imported into the cache, read) and for how long."""
    now = f" Now: {stage} ({seconds:.0f} s so far)." if stage else ""
    return (f"{LOADING} **{label}**: its first use, so its weights are read now (fetched and imported into "
            f"the cache first where they are not there: up to a minute or two). Generate waits for it.{now}")


def other_model_text(rec: RunRecord, run_context: int, label: str, context: int) -> str:
    """The status line under a run that another model than the picked one made."""
    ended = status_text(rec, run_context, 0.0) if rec.done is not None else "A run"
    return (f"{ended}, made by **{rec.model}** (a {run_context:,}-token context). The next run uses "
            f"**{label}** (a {context:,}-token context), whose card is shown above.")


def weights_text(f) -> str:
    """A loaded model's weights in memory (a serving.models.Footprint), its second copies said
    apart: the model card counts the parameters once, at the loaded precision."""
    mib = 2 ** 20
    if not f.copies_bytes:
        return f"{f.weights_bytes / mib:,.0f} MiB of weights"
    return (f"{f.weights_bytes / mib:,.0f} MiB of weights in memory: {(f.weights_bytes - f.copies_bytes) / mib:,.0f} "
            f"MiB as loaded and {f.copies_bytes / mib:,.0f} MiB of their second copies (packed for the matmuls, "
            "or at the decode precision)")


def models_markdown(models, available_bytes: int, error: str = "") -> str:
    """The models the page offers, what each loaded one takes, and the memory free now."""
    if len(models.labels) < 2 and not error:
        return ""
    mib = 2 ** 20
    lines = []
    for label in models.labels:
        f = models.footprint(label)
        where = (f"{weights_text(f)} + a {f.pool_bytes / mib:,.0f} MiB KV pool "
                 "(reserved; filled as runs write it)" if f is not None else "not loaded yet: loads on its first use")
        lines.append(f"- **{html.escape(label)}**{' (default)' if label == models.default else ''}: {where}")
    lines.append(f"\n{available_bytes / mib:,.0f} MiB of memory free on this machine now.")
    if error:
        lines.insert(0, f"⚠ {html.escape(error)}\n")
    return "\n".join(lines)


def limits_markdown(limits: Limits) -> str:
    """The shared page's limits, said once above the controls."""
    parts = []
    if limits.runs_per_client is not None:
        parts.append(f"{limits.runs_per_client} run{'s' if limits.runs_per_client != 1 else ''} "
                     "at a time per visitor (one per tab)")
    if limits.max_new_tokens is not None:
        parts.append(f"at most {limits.max_new_tokens} new tokens a run")
    if limits.sessions_per_client is not None:
        parts.append(f"{limits.sessions_per_client} open tabs per visitor")
    if limits.max_samples is not None:
        parts.append(f"at most {limits.max_samples} samples at once")
    if limits.lens_precisions is not None:
        parts.append(f"at most {limits.lens_precisions} precisions besides float32 in a quantization lens")
    if limits.max_tree_nodes is not None:
        parts.append(f"at most {limits.max_tree_nodes} nodes in a loom's tree")
    return ("**Shared page:** " + "; ".join(parts) + ".") if parts else ""
