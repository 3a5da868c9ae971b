"""The page in a real browser: Playwright driving Debian's chromium."""

import ui.run.handlers as run_handlers
from browser import generate_to_end, open_page, set_slider, wait_loaded
from engine_hold import wait_until


def test_generate_shows_text_bars_and_kv_chart_then_stop(live_app, browser, monkeypatch, hold):
    url, engine, _ = live_app
    page = open_page(browser, viewport={"width": 1400, "height": 1600})
    page.goto(url + "/?mode=completion")  # (the page's default is a chat turn, which clears the box)
    wait_loaded(page)
    page.fill("#prompt textarea", "Once upon a time")
    page.fill("#seed input, #seed textarea", "3")
    generate_to_end(page)
    assert page.inner_text("#output").strip()
    assert page.locator("#topk .tl-row").count() >= 3
    page.wait_for_selector("#kv-chart canvas, #kv-chart svg")  # Vega draws it after the values arrive
    assert "tok/s" in page.inner_text("#stats")
    # Clicking a generated token shows that step's bars (the last step's are showing now).
    last_title = page.inner_text("#topk .tl-title")
    page.locator("#output .tl-t").nth(1).click()
    page.wait_for_function(f"!document.querySelector('#topk .tl-title').innerText.startsWith({last_title.split(':')[0]!r})")
    assert page.inner_text("#topk .tl-title").startswith("Step ")

    # Inside one token: open the accordion and look inside the selected step.
    page.get_by_text("Inside one token").click()
    page.click("#inspect")
    page.wait_for_function("(document.querySelector('#stages')?.innerText || '').includes('Prefill')")
    assert page.locator("#attention td").count() >= engine.cfg.n_heads
    page.get_by_role("tab", name="Logit lens").click()
    page.locator("#lens tr").first.wait_for()
    assert page.locator("#lens tr").count() == engine.cfg.n_layers
    assert "embedding" in page.inner_text("#memory")

    # A long run, stopped from the page. The tiny model is too fast to catch: hold it.
    held = hold(engine)
    live_frames = []  # the chart timer draws the running run's KV cache while it streams
    kv_frame = run_handlers.kv_frame  # (the chart timer's: RunHandlers.live_tick)
    monkeypatch.setattr(run_handlers, "kv_frame", lambda rec: live_frames.append(
        (len(rec.steps), rec.done is None)) or kv_frame(rec))
    set_slider(page, "#max-new-tokens", 200)
    page.click("#generate")
    held.step(3)  # the run has made 3 tokens and is held before the 4th
    wait_until(lambda: any(n > 0 and running for n, running in live_frames), "a chart of the running run")
    page.click("#stop")
    page.wait_for_function("document.querySelector('#stats').innerText.includes('stopped')")
    assert engine.active_runs == 0
    page.close()


def test_deep_link_restores_settings(live_app, browser):
    url, _, _ = live_app
    page = open_page(browser)
    page.goto(url + "/?prompt=%E4%BB%8A%E5%A4%A9&temperature=0.3&top_k=7&seed=99&mode=chat&max_new_tokens=33")
    page.wait_for_function("document.querySelector('#prompt textarea')?.value === '今天'")
    assert page.input_value("#seed input, #seed textarea") == "99"
    assert page.input_value("#top-k input") == "7"
    assert page.input_value("#temperature input[type=number]") == "0.3"
    assert page.locator("#mode input[value=chat]").is_checked()
    page.click("#copy-link")
    page.wait_for_function("(document.querySelector('#share-link textarea')?.value || '').includes('seed=99')")
    link = page.input_value("#share-link textarea")
    assert link.startswith(url) and "top_k=7" in link and "mode=chat" in link
    page.close()


def test_compare_shows_the_divergence_marker(live_app, browser):
    url, _, _ = live_app
    page = open_page(browser, viewport={"width": 1400, "height": 2400})
    page.goto(url + "/?prompt=The%20quick&temperature=0&seed=5&max_new_tokens=20")
    page.wait_for_function("document.querySelector('#seed input, #seed textarea')?.value === '5'")
    page.get_by_text("Sampling experiments").click()
    # B follows the page's settings (greedy here): B samples instead.
    page.wait_for_function("document.querySelector('#b-temperature input[type=number]')?.value === '0'")
    set_slider(page, "#b-temperature", 1.5, key="Tab")
    page.click("#compare")
    page.wait_for_function("(document.querySelector('#compare-summary')?.innerText || '').includes('divergence')")
    assert "First divergence at step" in page.inner_text("#compare-summary")
    marked = page.locator("#compare-a .token[style*='142, 36, 170']")  # the "diverges here" colour
    assert marked.count() == 1
    assert page.locator("#compare-bars-b .tl-chosen").count() == 1
    page.close()


def test_closing_the_tab_ends_the_run(live_app, browser, hold):
    url, engine, handlers = live_app
    held = hold(engine)
    page = open_page(browser)
    page.goto(url + "/?prompt=Once&max_new_tokens=200&temperature=1&seed=1")
    page.wait_for_function("document.querySelector('#prompt textarea')?.value === 'Once'")
    page.click("#generate")
    held.step(2)  # the run has made 2 tokens and is held before the 3rd
    assert engine.active_runs == 1
    page.close(run_before_unload=True)
    wait_until(lambda: engine.active_runs == 0, "the run's end")
    assert held.started == 3  # no token after the one being made when the tab closed


def test_a_second_generate_cannot_start_while_the_run_goes(live_app, browser, hold):
    """Generate is disabled while this tab's run goes (a second request, from a script, is
    refused with RUN_GOING: test_public), and the run it has goes on to its end."""
    url, engine, _ = live_app
    held = hold(engine)
    page = open_page(browser)
    page.goto(url + "/?prompt=Once&max_new_tokens=12&temperature=0&seed=1")
    page.wait_for_function("document.querySelector('#prompt textarea')?.value === 'Once'")
    page.click("#generate")
    held.step(2)  # the run has made 2 tokens and is held before the 3rd
    assert page.is_disabled("#generate") and not page.is_disabled("#stop")
    page.click("#generate", force=True)  # a click on the disabled button starts nothing
    held.open()
    page.wait_for_function("document.querySelector('#stats').innerText.includes('max new tokens reached')")
    page.wait_for_function("!document.querySelector('#generate').disabled")
    assert engine.active_runs == 0
    page.close()
