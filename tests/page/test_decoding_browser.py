"""The decoding section in chromium at 1400 and 420 px: a beam search's tree, its best beam
opened as a run, and a speculative run's steps. Screenshots go to
test-results/shots/test_decoding_browser/."""

import pytest

from browser import open_at, output_text, set_slider, settled_after, shot, wait_text


@pytest.mark.parametrize("width,height", [(1400, 1000), (420, 900)])
def test_beam_tree_and_speculative_steps_are_drawn(live_app, browser, width, height):
    url, _, _ = live_app
    page = open_at(browser, url, width, height,
                   "prompt=The%20quick%20brown%20fox%20jumps%20over%20the%20quick%20brown&seed=1"
                   "&max_new_tokens=6&num_beams=3&temperature=0")
    page.get_by_text("Decoding: beam search and speculative decoding").click()
    page.click("#beam-search")
    page.wait_for_selector("#beam-tree .beam-step")
    assert page.locator("#beam-tree .beam-step").count() == 6
    assert page.locator("#beam-tree .hyp.pruned").count() > 0
    assert page.locator(".beams-ranked tr").count() == 4  # the header and three ranked beams
    page.locator("#decoding-summary").scroll_into_view_if_needed()
    shot(page, f"beam-tree-{width}")
    # The best beam opened as a run: the run view shows its text, its bars and its KV blocks.
    best = page.locator(".beams-ranked tr").nth(1).locator("td")
    text, n = best.nth(4).inner_text(), int(best.nth(3).inner_text())
    page.wait_for_selector("#open-beam:not([disabled])")
    settled_after(page, lambda: page.click("#open-beam"))
    wait_text(page, "#notice", "Beam 1 of 3 opened as a run")
    assert " ".join(output_text(page).split()) == " ".join(text.split())
    wait_text(page, "#status", f"{n} tokens")
    page.locator("#output").scroll_into_view_if_needed()
    shot(page, f"beam-opened-{width}")
    set_slider(page, "#num-beams", 1)  # speculative decoding samples one sequence
    page.click("#speculative")
    page.wait_for_selector("#spec-steps")
    assert page.locator("#spec-steps tr").count() == 7
    assert "Speculative decoding" in page.inner_text("#decoding-summary")
    page.locator("#decoding-summary").scroll_into_view_if_needed()
    shot(page, f"speculative-{width}")
    page.close()
