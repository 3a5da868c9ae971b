"""A reload while a run streams says that run was not kept (the browser keeps runs
once they end), rather than showing the last ended run as if nothing had been going; a reload
after a run's end says nothing of the kind. In chromium at 1400 px, the note looked at again at
420 px; screenshots under test-results/shots/test_reload_mid_run_browser/."""

from browser import open_page, overflows, run_to_end, shot, wait_loaded
from engine_hold import wait_until
from ui.work.section import LOST_RUN

QUERY = "?prompt=Once&mode=completion&max_new_tokens=4&temperature=1&seed=1"


def test_a_reload_mid_run_says_the_run_was_not_kept(live_app, browser, hold):
    url, engine, _ = live_app
    page = open_page(browser, viewport={"width": 1400, "height": 1000})
    page.goto(url + "/" + QUERY)
    wait_loaded(page)
    run_to_end(page, lambda: page.click("#generate"))  # an ended run, kept
    page.reload()
    wait_loaded(page)
    assert page.locator("#lost-run").count() == 0  # nothing was going
    held = hold(engine)
    page.fill("#max-new-tokens input[type=number]", "200")
    page.press("#max-new-tokens input[type=number]", "Enter")
    page.click("#generate")
    held.step(2)  # the run has made 2 tokens and is held before the 3rd
    page.reload()
    wait_loaded(page)
    page.wait_for_selector("#lost-run")
    assert page.inner_text("#lost-run") == LOST_RUN
    shot(page, "lost-run-1400", selector="#saved-work")
    page.set_viewport_size({"width": 420, "height": 900})  # the note on a phone
    assert page.locator("#lost-run").is_visible() and not overflows(page)
    shot(page, "lost-run-420", selector="#saved-work")
    page.set_viewport_size({"width": 1400, "height": 1000})
    wait_until(lambda: engine.active_runs == 0, "the reloaded tab's run to end")
    page.reload()  # said once
    wait_loaded(page)
    assert page.locator("#lost-run").count() == 0
    page.close()


def held_run(context, url: str, engine, hold):
    """A new tab of the page whose run streams, held after its 2nd token: (the tab, the hold)."""
    page = context.new_page()
    page.set_default_timeout(180_000)
    page.goto(url + "/" + QUERY)
    wait_loaded(page)
    held = hold(engine)
    page.fill("#max-new-tokens input[type=number]", "200")
    page.press("#max-new-tokens input[type=number]", "Enter")
    page.click("#generate")
    held.step(2)  # the run has made 2 tokens and is held before the 3rd
    return page, held


def test_a_tab_closed_mid_run_says_so_in_the_next_tab(live_app, browser, hold):
    """Issue 62: a tab closed while its run streamed came back (a new tab of the page) with no word
    about that run; a reload said it. The closed tab's run is said once in the next tab opened."""
    url, engine, _ = live_app
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    first, held = held_run(context, url, engine, hold)
    first.close(run_before_unload=True)
    held.open()
    wait_until(lambda: engine.active_runs == 0, "the closed tab's run to end")
    again = context.new_page()
    again.set_default_timeout(180_000)
    again.goto(url + "/")
    wait_loaded(again)
    again.wait_for_selector("#lost-run")
    assert again.inner_text("#lost-run") == LOST_RUN
    shot(again, "lost-run-closed-tab-1400", selector="#saved-work")
    again.reload()  # said once
    wait_loaded(again)
    assert again.locator("#lost-run").count() == 0
    context.close()


def test_a_stream_cut_by_a_reload_or_a_closed_tab_is_no_console_error(live_app, browser, hold):
    """Issue 62: a reload or a tab close mid-run logged "AbortError" and "Connection errored out":
    a cut stream is expected, not an error. Each way, the console of the tab whose stream was cut."""
    url, engine, _ = live_app
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    errors = []  # every tab's of the context
    context.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    context.on("weberror", lambda e: errors.append(f"page error: {e.error}"))
    for leave in ("reload", "close"):
        errors.clear()
        page, held = held_run(context, url, engine, hold)
        page.wait_for_function("(document.querySelector('#status')?.innerText || '').includes('Generating')")
        if leave == "reload":
            page.reload()
            wait_loaded(page)
            page.wait_for_timeout(1000)  # what the cut stream logs, late
            page.close()
        else:
            page.close(run_before_unload=True)
        held.open()
        wait_until(lambda: engine.active_runs == 0, "the cut run to end")
        assert errors == [], (leave, errors)
    # A lost connection with no abort before it (the server gone), and any other error, still are.
    page = context.new_page()
    errors.clear()
    page.goto(url + "/")
    wait_loaded(page)
    page.evaluate("console.error('Unexpected error', 'Connection errored out. '); console.error('something else')")
    page.wait_for_timeout(200)
    assert errors == ["Unexpected error Connection errored out. ", "something else"], errors
    context.close()
