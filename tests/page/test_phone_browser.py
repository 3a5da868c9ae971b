"""The page on a phone (420 px wide). After Generate the output is brought near
the top of the window (not under the prompt, the settings and the examples); a table says
"scroll sideways" in words only where much of it is hidden; the popover of a scored text's token
does not cover "Score the text". Screenshots under test-results/shots/test_phone_browser/."""

from browser import box, open_at, run_to_end, shot

QUERY = "prompt=The%20quick&mode=completion&seed=1&max_new_tokens=12&temperature=1"

# Each table's scroll box: how much of it is hidden, and whether its words say so.
HINTS_JS = """[...document.querySelectorAll('[data-tl-more]')].filter((b) => b.getClientRects().length).map((b) => {
    const h = b.previousElementSibling;
    return {over: b.scrollWidth - b.clientWidth, width: b.clientWidth,
            said: !!(h && h.classList.contains('tl-scroll-hint') && !h.hidden)}; })"""


def test_on_a_phone_the_output_comes_into_view_and_hints_do_not_cover(live_app, browser):
    url, _, _ = live_app
    page = open_at(browser, url, 420, 900, QUERY)
    assert box(page, "#output")["y"] > 900  # below the first screen before a run
    run_to_end(page, lambda: page.click("#generate"))
    out = box(page, "#output")
    shot(page, "after-generate-420")
    assert 0 <= out["y"] < 900 / 3, out  # near the top of the window
    # Words say "scroll sideways" only where more than a sliver is hidden (the fade shows any).
    page.locator("#stats").scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    for b in page.evaluate(HINTS_JS):
        assert b["said"] == (b["over"] > max(40, 0.1 * b["width"])), b
    shot(page, "stats-420", selector="#stats")
    # A scored token's popover stays clear of "Score the text" above the scored text.
    page.get_by_text("Probability of a text: how likely").click()
    page.click("#score")
    page.wait_for_selector("#score-view .tl-t")
    page.locator("#score").scroll_into_view_if_needed()
    page.evaluate("window.scrollBy(0, -(window.innerHeight - document.querySelector('#score').getBoundingClientRect().bottom - 40))")
    # A phone has no pointer left hovering: the mouse that clicked "Score the text" is moved off the
    # text, or the token the scroll put under it shows its popover instead of the focused one's.
    page.mouse.move(1, 1)
    token = page.locator("#score-view .tl-t").first
    token.focus()
    pop = token.locator(".tl-pop")
    pop.wait_for(state="visible")
    p, button = pop.bounding_box(), box(page, "#score")
    shot(page, "score-popover-420")
    assert p["y"] >= button["y"] + button["height"] or p["y"] + p["height"] <= button["y"], (p, button)
    page.close()
