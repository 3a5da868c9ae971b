"""A new prompt put in the box by any means leaves a branch: after a branch, a paste (Playwright's
fill(), which sends no key press, as a paste does not) drops the branch's given ids: the context
line loses its "+ N given" and the next run continues after the prompt alone. A link's given ids,
set by the page and not by hand, stay. In chromium at 1400 px, the pasted state looked at at
420 px too; screenshots under test-results/shots/test_prompt_paste_browser/."""

from browser import open_page, overflows, run_to_end, shot, wait_loaded

QUERY = "?prompt=The%20quick&temperature=0&seed=1&max_new_tokens=4"


def test_a_pasted_prompt_leaves_the_branch(live_app, browser):
    url, _, _ = live_app
    page = open_page(browser, viewport={"width": 1400, "height": 1000})
    page.goto(url + "/" + QUERY)
    wait_loaded(page)
    run_to_end(page, lambda: page.click("#generate"))
    chosen = page.locator("#topk .tl-row.tl-pick:not(.tl-chosen)").first.get_attribute("data-pick")
    run_to_end(page, lambda: page.locator(f"#topk [data-pick='{chosen}']").click())
    assert " given" in page.inner_text("#context-count")
    # Select all and paste another prompt: no key press reaches the box.
    page.locator("#prompt textarea").fill("Once upon a time")
    page.wait_for_function("!document.querySelector('#context-count').innerText.includes('given')")
    page.evaluate("window.scrollTo(0, 0)")
    shot(page, "pasted-1400")
    page.set_viewport_size({"width": 420, "height": 900})  # the same state on a phone
    assert not overflows(page)
    page.evaluate("window.scrollTo(0, 0)")
    shot(page, "pasted-420")
    page.set_viewport_size({"width": 1400, "height": 1000})
    run_to_end(page, lambda: page.click("#generate"))
    assert "given" not in page.inner_text("#status")
    assert page.locator("#output .tl-given").count() == 0
    page.close()


def test_a_links_given_ids_stay(live_app, browser):
    url, engine, _ = live_app
    ids = ",".join(map(str, engine.tokenizer.encode_continuation(" fox")))
    page = open_page(browser, viewport={"width": 1400, "height": 1000})
    page.goto(url + "/" + QUERY + f"&prefix_ids={ids}")
    wait_loaded(page)
    page.wait_for_function("document.querySelector('#context-count').innerText.includes('given')")
    assert f"+ {len(ids.split(','))} given" in page.inner_text("#context-count")
    page.close()
