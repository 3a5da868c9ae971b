"""The saved-work line and its events: under the title, what the browser keeps and "Clear saved
work"; the controls kept as typed, the work after each run, all of it restored at load (after a
link's settings, which win)."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from ui.controls import NAMES
from ui.shared.charts import chart_colors
from ui.shared.outputs import SHOWN
from ui.work.handlers import NOTHING

# The browser's storage keys. The values are encrypted by gradio with this key, which the page
# itself sends: it only keeps them from being read as plain text; they never leave the browser.
SETTINGS_KEY, WORK_KEY, SECRET = "tokenlab-settings", "tokenlab-work", "token-lab-saved-work"
# Forget both and open the page afresh (without a link's query): the defaults.
CLEAR_JS = """() => {
  localStorage.removeItem(%r); localStorage.removeItem(%r);
  window.location.replace(window.location.origin + window.location.pathname);
  return [];
}""" % (SETTINGS_KEY, WORK_KEY)
# Until the saved work is restored the controls wait (text typed sooner would be replaced); then
# the page is marked restored (tests wait for it) and they take input.
RESTORING_JS = (Path(__file__).parent.parent / "assets" / "restoring.js").read_text(encoding="utf-8")
# A run going is marked in this tab's session storage until it ends: a reload meanwhile loses it
# (only ended runs are kept), and the restored page says so instead of showing the last ended
# run as if nothing had been going. A tab closed meanwhile takes its session storage with it: as
# it goes (pagehide, which a reload and a close both send) the mark is copied to the browser's
# local storage, which the next tab of the page reads.
RUN_GOING_KEY = "tokenlab-run-going"
RUN_GOING_JS = """() => {
  sessionStorage.setItem(%r, '1');
  if (!window.tlLeaveWatched) {
    window.tlLeaveWatched = true;
    window.addEventListener('pagehide', () => {
      if (sessionStorage.getItem(%r)) localStorage.setItem(%r, '1');
    });
  }
  return [];
}""" % (RUN_GOING_KEY, RUN_GOING_KEY, RUN_GOING_KEY)
RUN_ENDED_JS = "() => { sessionStorage.removeItem(%r); return []; }" % RUN_GOING_KEY
LOST_RUN = ("The run that was going when this page was reloaded or its tab closed was not kept (the browser "
            "keeps runs once they end).")
LOST_RUN_JS = """
  if (sessionStorage.getItem(%r) || localStorage.getItem(%r)) {
    sessionStorage.removeItem(%r);
    localStorage.removeItem(%r);
    const line = document.querySelector('#saved-work');
    if (line && !document.querySelector('#lost-run')) {
      const note = document.createElement('p');
      note.id = 'lost-run';
      note.textContent = %r;
      line.appendChild(note);
    }
  }""" % (RUN_GOING_KEY, RUN_GOING_KEY, RUN_GOING_KEY, RUN_GOING_KEY, LOST_RUN)
RESTORED_JS = """() => {""" + LOST_RUN_JS + """
  // A link's settings are applied and kept (keep_link_settings): off the address, so that a
  // reload restores the work done since, not the link again.
  if (window.location.search) history.replaceState(history.state, '', window.location.pathname + window.location.hash);
  document.body.dataset.tlRestored = '1';
  document.querySelectorAll('#input-col, #settings-col').forEach((c) => c.removeAttribute('aria-busy'));
  return [];
}"""
RESTORED = (*SHOWN, "more", "constrain_box", "branches", "branch_view", "history", "conversation", "regenerate",
            "edit_box", "work_md", "generate")
SAVED = ("saved_settings", "saved_work", "work_md")


def build(page, h) -> None:
    with gr.Row(elem_id="saved-work-row"):
        page.add("work_md", gr.Markdown(NOTHING, elem_id="saved-work"))
        page.add("clear_work", gr.Button("Clear saved work", size="sm", scale=0, min_width=160, elem_id="clear-work"))
    page.add("saved_settings", gr.BrowserState(None, storage_key=SETTINGS_KEY, secret=SECRET))
    page.add("saved_work", gr.BrowserState(None, storage_key=WORK_KEY, secret=SECRET))
    # A run going is marked from its click to its end (the run section runs these).
    page.run_going_js.append(RUN_GOING_JS)
    page.run_ended_js.append(RUN_ENDED_JS)


def keep(page, h) -> None:
    """After every run (the last of its hooks: the tree and the edit panel have their run): the
    work. (The layout calls every section's keep once all are built, before any is wired.)"""
    page.after_run.append((h.work.save_work, ("record", "branches", "history", *NAMES), SAVED))
    page.after_view.append((h.work.save_work, ("record", "branches", "history", *NAMES), SAVED))


def wire(page, h, demo: gr.Blocks) -> None:
    """At load, one event: the page's load hooks (ui/share: the link's settings), then the work
    saved in this browser (a link's settings win: nothing is restored then)."""
    demo.load(None, js=RESTORING_JS)
    restored = page.on_all(demo.load, [*page.load_hooks,
                                       (h.work.restore_work, ("saved_settings", "saved_work"), RESTORED)])
    for js in page.loaded_js:
        restored.then(None, js=js)
    kept = page.chain(restored, [(chart_colors, ("record",), ("kv_chart", "run_chart")),  # after their data
                                 (h.work.keep_link_settings, NAMES, ("saved_settings",))])
    kept.then(None, js=RESTORED_JS)
    gr.on([page[n].input for n in NAMES], h.work.save_settings, inputs=page.all(NAMES), outputs=page["saved_settings"],
          queue=False, show_progress="hidden", trigger_mode="always_last", api_visibility="private")
    page.on(page["new_chat"].click, h.work.save_new_chat, inputs=("record", "branches", *NAMES), outputs=SAVED,
            queue=False, api_visibility="private", show_progress="hidden")
    page["clear_work"].click(None, js=CLEAR_JS, api_visibility="private")
