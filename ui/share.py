"""The share section: "Copy link to these settings", and the page restored from a link's query."""

from __future__ import annotations

import dataclasses
import json

import gradio as gr

from inference.errors import TokenLabError, shown
from ui.base import Section, page_error, takes_controls
from ui.controls import (ALWAYS_IN_LINK, MODES, MORE_SETTINGS, NAMES, Controls, controls_from_query, parse_seed,
                         parse_stop, share_url)
from inference.request import tokens_message

MAX_URL_CHARS = 2048  # the page's own address, sent by the browser for the share link

# Marks the page as ready once the link's settings are restored (tests wait for it).
READY_JS = "() => { document.body.dataset.tlReady = '1'; return []; }"
UNCOPY_JS = "() => { if (navigator.clipboard) navigator.clipboard.writeText('').catch(() => {}); return []; }"


def share_js(defaults: Controls) -> str:
    """The copy-link click: builds the same link as controls.share_url (same keys, same encoding
    as Python's urlencode, numbers as String() writes them, the last run's seed for an empty
    seed box, no constraint text while the constraint is off), copies it to the clipboard within the click, and passes the page's address on to
    the server's share_link, which shows the link."""
    names, always = json.dumps(NAMES), json.dumps(ALWAYS_IN_LINK)
    default = json.dumps(dict(zip(NAMES, defaults.values())))
    return """(...a) => {
  const names = %s, defaults = %s, always = %s, n = names.length;
  const base = window.location.origin + window.location.pathname;
  a[n] = base;
  const enc = (s) => encodeURIComponent(s)
    .replace(/[!'()*]/g, (c) => '%%' + c.charCodeAt(0).toString(16).toUpperCase()).replace(/%%20/g, '+');
  const parts = [];
  const constraintOff = !a[names.indexOf('constraint')];
  names.forEach((name, i) => {
    let v = a[i];
    if (name === 'seed' && String(v ?? '').trim() === '' && a[n + 1]) v = a[n + 1];
    if (name === 'constraint_text' && constraintOff) v = defaults[name];
    if (v === defaults[name] && !always.includes(name)) return;
    parts.push(enc(name) + '=' + enc(String(v ?? '')));
  });
  const link = base + '?' + parts.join('&');
  if (navigator.clipboard) navigator.clipboard.writeText(link).catch(() => {});
  return a;
}""" % (names, default, always)


class ShareHandlers(Section):
    def restore(self, request: gr.Request | None = None) -> dict:
        """Controls from the page URL's query parameters; each ignored parameter is named on a
        line of its own in the notice. Also opens "More settings" when the link sets one."""
        query = dict(getattr(request, "query_params", {}) or {})
        base = Controls(**vars(self.defaults))
        if "prompt" in query and "mode" not in query:  # a link from before chat was a default
            base.mode = "completion"
        c, problems = controls_from_query(query, base,
                                          {"max_new_tokens": self.context - 1})
        if c.model and c.model not in self.models.labels:
            problems.append(f"Ignored link parameter `model` = {shown(c.model)}: this page offers "
                            f"{', '.join(self.models.labels)}")
        if c.model not in self.models.labels[1:]:  # the default model is "" (the picker's value)
            c.model = ""
        cap = self.limits.max_new_tokens
        if cap is not None and c.max_new_tokens > cap:
            problems.append(f"Max new tokens lowered from {c.max_new_tokens} to {cap}: {tokens_message(cap)}")
            c.max_new_tokens = cap
        notice = ("**Some link parameters were ignored** (their controls keep the defaults):\n\n"
                  + "\n".join(f"- {p}" for p in problems)) if problems else ""
        out = {**dict(zip(NAMES, c.values())), "notice": notice}
        if any(getattr(c, n) != getattr(self.defaults, n) for n in MORE_SETTINGS):
            out["more"] = gr.update(open=True)
        if c.constraint:  # the link's constraint is shown, not folded away
            out["constrain_box"] = gr.update(open=True)
        if c.model:  # Generate waits for the picker's event (the model's first load, its mode)
            out["generate"] = gr.update(interactive=False)
        return out

    @takes_controls("base", after=("run_seed",))
    def share_link(self, c: Controls, base: str, request: gr.Request = None, run_seed: str = "") -> str:
        """A link that restores these settings; `base` is the page's own address, `run_seed`
        the seed the last run used (it stands in for an empty seed box)."""
        try:  # text that no run could use makes no link (and is not copied into one)
            m = self.view(c.model)
            m.engine.check_prompt_size(c.prompt, c.mode == "chat", c.system)
            parse_stop(c.stop)
            parse_seed(c.seed)
            if c.mode not in MODES:
                raise TokenLabError(f"mode must be one of {', '.join(MODES)}, got {shown(c.mode)}")
        except TokenLabError as e:
            raise page_error(e) from None
        base = base if isinstance(base, str) and len(base) <= MAX_URL_CHARS else ""
        run_seed = run_seed if isinstance(run_seed, str) and run_seed.isdigit() and len(run_seed) < 20 else None
        model = "" if m.label == self.models.default else m.label  # the picker's value
        return share_url(base, dataclasses.replace(c, model=model), self.defaults, seed=run_seed)


SLOT = "run.settings"  # under the settings


def build(page, h) -> None:
    """The link button and the link, under the settings; at the page's load (ui/work's event,
    before the saved work is restored) the controls from the page's link, then READY_JS."""
    page.add("share_button", gr.Button("Copy link to these settings", size="sm", elem_id="copy-link"))
    page.add("page_url", gr.Textbox(visible=False))
    page.add("run_seed", gr.Textbox("", visible=False))  # the seed of the last run, for the link
    page.add("share_link", gr.Textbox(label="Link (restores prompt, mode, settings and seed; copied "
                                            "to the clipboard)", buttons=["copy"], elem_id="share-link"))
    page.load_hooks.append((h.share.restore, (), (*NAMES, "more", "constrain_box", "notice", "generate")))
    page.loaded_js.append(READY_JS)


def wire(page, h, demo) -> None:
    # Its refusals (text no run could use) as a run's: in the queue, unlimited. The click copies
    # the link at once (share_js); a refused link is taken back off the clipboard.
    page.on(page["share_button"].click, h.share.share_link, inputs=(*NAMES, "page_url", "run_seed"),
            outputs=("share_link",), js=share_js(h.page.defaults), api_visibility="private",
            concurrency_limit=None).failure(None, js=UNCOPY_JS)
