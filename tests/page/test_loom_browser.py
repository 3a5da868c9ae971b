"""The loom in chromium at 1400 and 420 px: a tree grown from the run's last step (its nodes, leaves
and greedy path drawn), kept across a reload, a leaf continued as a run (its path given), and the
tree's link opened in a fresh tab. Screenshots go to test-results/shots/test_loom_browser/."""

import pytest

from browser import open_at, open_page, overflows, run_to_end, set_number, shot, wait_loaded, wait_text

QUERY = "prompt=The%20quick%20brown&temperature=0&seed=1&max_new_tokens=5"
NODES = "#loom-tree .loom-node:not(.loom-rest):not(.loom-root)"


def shot_tree(page, name: str) -> None:
    """A screenshot from the tree's summary down (the tree under it)."""
    page.evaluate("document.querySelector('#loom-summary').scrollIntoView({block: 'start'})")
    shot(page, name)


def open_loom(page) -> None:
    page.get_by_text("Loom: grow the tree of continuations").click()
    page.wait_for_selector("#loom-grow", state="visible")


@pytest.mark.parametrize("width,height", [(1400, 1000), (420, 900)])
def test_a_tree_grows_is_kept_continues_a_leaf_and_opens_from_its_link(live_app, browser, width, height):
    url, _, _ = live_app
    page = open_at(browser, url, width, height, QUERY)
    # Opened before the run: gradio mounts an accordion's fields when it first opens and, on a busy
    # machine, can put back their first values over what was typed while it mounts them.
    open_loom(page)
    run_to_end(page, lambda: page.click("#generate"))
    set_number(page, "#loom-p", 0)
    set_number(page, "#loom-k", 2)
    page.click("#loom-grow")
    wait_text(page, "#loom-summary", "The loom on")
    summary = page.inner_text("#loom-summary")
    assert "from step 4 of the run on view" in summary and "14 nodes (8 leaves)" in summary, summary
    assert page.locator(NODES).count() == 14 and page.locator("#loom-tree .loom-leaf").count() == 8
    assert page.locator("#loom-tree .loom-greedy").count() == 3
    assert page.locator("#loom-tree .loom-rest").count() == 7  # the left-out mass under each expanded node
    assert not overflows(page)
    shot(page, f"controls-{width}", selector="#loom-panel")
    shot_tree(page, f"tree-{width}")
    # Kept across a reload.
    page.reload()
    wait_loaded(page)
    open_loom(page)
    wait_text(page, "#loom-summary", "Restored from this browser")
    assert page.locator(NODES).count() == 14
    assert page.input_value("#loom-k input") == "2" and page.input_value("#loom-p input") == "0"  # the tree's own
    if width < 1000:  # on a phone: the tree, grown and restored (the rest is the same page's events)
        shot_tree(page, f"restored-{width}")
        page.close()
        return
    # A leaf (not the greedy one) continued as a run: the run's 4 tokens before step 4 and the leaf's 3 given.
    leaf = page.locator("#loom-tree .loom-leaf:not(.loom-greedy)").last
    leaf.scroll_into_view_if_needed()
    run_to_end(page, lambda: leaf.click())
    assert "7 given" in page.inner_text("#status"), page.inner_text("#status")
    # The run streams in the output far above the tree: the page went there (nothing by the leaf says it).
    top = page.evaluate("document.querySelector('#output-caption').getBoundingClientRect().top")
    assert -2 <= top < height, top  # (scrolled to its top: a fraction of a pixel either way)
    page.locator("#output").scroll_into_view_if_needed()
    shot(page, f"leaf-continued-{width}")
    # The tree's link, opened in a fresh tab (no storage): the same tree, from the link.
    page.locator("#loom-link").scroll_into_view_if_needed()
    page.click("#loom-link")
    page.wait_for_selector("#loom-link-text")
    link = page.input_value("#loom-link-text")
    assert "loom=" in link and page.locator("#loom-download").count() == 1
    href = page.get_attribute("#loom-download", "href")
    kept = page.evaluate(f"fetch({href!r}).then((r) => r.json())")  # the download: the tree as JSON
    assert len(kept["nodes"]) == 15 and kept["depth"] == 3 and kept["top_k"] == 2 and kept["min_prob"] is None
    other = open_page(browser, viewport={"width": width, "height": height})
    other.goto(link)
    wait_loaded(other)
    other.wait_for_selector("#loom-grow", state="visible")  # a link's tree opens its section: no click
    wait_text(other, "#loom-summary", "Opened from a link")
    assert other.locator(NODES).count() == 14
    assert "4 given" in other.inner_text("#context-count")  # the link's prompt and given ids: the tree's point
    assert not overflows(other)
    shot_tree(other, f"from-link-{width}")
    other.close()
    page.close()
