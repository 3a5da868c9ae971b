"""Edit and continue, and the work a page keeps, in chromium at 1400 and 420 px: the edit panel's
seam table lists the tokens the tokenizer changed, follows the box however its text changes (a
paste, Backspace) and, after a continue, says it is the edit of the run before; undo goes back; a reload brings back the
settings, the conversation, the branches and the run; "Clear saved work" returns the defaults; a
link wins over saved work. Screenshots go to test-results/shots/test_edit_work_browser/."""

import functools
import threading

import pytest

from browser import open_page, output_text, overflows, run_to_end, shot, wait_loaded, wait_text

QUERY = "?prompt=The%20quick&temperature=0&seed=1&max_new_tokens=5"


def type_in(page, selector: str, text: str) -> None:
    """Text into a box as a person types it (its last key is a keystroke: gradio's input event)."""
    page.fill(selector, text[:-1])
    page.locator(selector).type(text[-1])


def link(page) -> str:
    """The share link of the page as it is (the controls, the branch's ids among them)."""
    page.click("#copy-link")
    page.wait_for_function("(document.querySelector('#share-link textarea')?.value || '').includes('prompt=')")
    return page.input_value("#share-link textarea")


def edit_box(page) -> str:
    return page.input_value("#edit-text textarea")


def columns_overlap(page) -> bool:
    """Whether the prompt-and-settings column and the output column cover each other (a long
    word in one of them widened it over the other)."""
    return page.evaluate("""() => { const [a, b] = ['#input-col', '#right-col'].map(
        (s) => document.querySelector(s).getBoundingClientRect());
        return a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1; }""")


def columns(page) -> list[tuple[list[int], list[int]]]:
    """The seam table's rows: (the ids in its run column, the ids in its text column)."""
    rows = page.evaluate("""() => [...document.querySelectorAll('#edit-seam tbody tr')].map((tr) =>
        [1, 2].map((k) => [...tr.children[k].querySelectorAll('sub')].map((s) => Number(s.innerText))))""")
    return [tuple(row) for row in rows]


def dots_run_to_edit(live_app, browser, width: int, height: int):
    """A page whose run made dots (a logit bias: the tokenizer's own tokens), its edit panel open
    with the run's text: (page, tokenizer, the dot's id, the run's text)."""
    url, engine, _ = live_app
    tok = engine.tokenizer
    dot = tok.encode_continuation(".")[0]
    page = open_page(browser, viewport={"width": width, "height": height})
    page.goto(url + "/" + QUERY + f"&logit_bias={dot}%3A100")
    wait_loaded(page)
    run_to_end(page, lambda: page.click("#generate"))
    page.get_by_text("Edit the output and continue").click()
    page.wait_for_function("(document.querySelector('#edit-text textarea')?.value ?? 'no box') === "
                           "(document.querySelector('#output .tl-out')?.dataset.text ?? 'no output')")
    return page, tok, dot, output_text(page)


@pytest.mark.parametrize("width,height", [(1400, 1000), (420, 900)])
def test_edit_and_continue(live_app, browser, width, height):
    page, tok, dot, first = dots_run_to_edit(live_app, browser, width, height)
    page.fill("#edit-text textarea", "Thee")
    run_to_end(page, lambda: page.click("#edit-continue"))
    assert output_text(page).startswith("Thee") and page.inner_text("#output .tl-given") == "Thee"
    second = output_text(page)
    # The edit box and Undo follow the run on view (an event chained after the run's end).
    page.wait_for_function("(document.querySelector('#edit-text textarea')?.value ?? 'no box') === "
                           "(document.querySelector('#output .tl-out')?.dataset.text ?? 'no output')")
    page.wait_for_function("!document.querySelector('#edit-undo').disabled")
    assert edit_box(page) == second
    # An x after the 'e' (text the edit does not touch): the tokenizer makes 'e' + 'x' one token.
    type_in(page, "#edit-text textarea", "Theex" + second[4:])
    wait_text(page, "#edit-seam", "different now")
    row = page.locator("#edit-seam tr.tl-seam-moved")
    assert row.count() == 1
    e, ex = tok.encode_continuation("e")[0], tok.encode_continuation("ex")[0]
    cells = row.locator("td")
    assert cells.nth(1).inner_text().replace("\n", "") == f"e{e}" and cells.nth(2).inner_text().replace("\n", "") == f"ex{ex}"
    page.locator("#edit-seam").scroll_into_view_if_needed()
    assert not overflows(page)
    shot(page, f"edit-seam-{width}")
    run_to_end(page, lambda: page.click("#edit-continue"))
    assert output_text(page).startswith("Theex") and "tl-seam-moved" in page.inner_html("#edit-seam")
    page.click("#edit-undo")
    page.wait_for_function(f"document.querySelector('#output .tl-out')?.dataset.text === {second!r}")
    assert edit_box(page) == second
    page.click("#edit-undo")
    page.wait_for_function(f"document.querySelector('#output .tl-out')?.dataset.text === {first!r}")
    page.wait_for_function("document.querySelector('#edit-undo').disabled")
    assert page.input_value("#prefix-ids textarea, #prefix-ids input") == ""
    page.close()


@pytest.mark.parametrize("width,height", [(1400, 1000), (420, 900)])
def test_the_table_follows_the_box_and_after_a_continue_names_the_run_it_edited(live_app, browser, width, height):
    page, tok, dot, first = dots_run_to_edit(live_app, browser, width, height)
    # Text set without a key press (a paste, a fill): the table comes.
    page.fill("#edit-text textarea", "Thee")
    wait_text(page, "#edit-seam", "Your text against the run on view")
    assert columns(page) == [([dot] * 5, tok.encode_continuation("Thee"))]
    # Backspace (no key press event either): the table follows.
    page.locator("#edit-text textarea").press("End")
    page.locator("#edit-text textarea").press("Backspace")
    page.wait_for_function("document.querySelector('#edit-text textarea').value === 'The'")
    page.wait_for_function("[...document.querySelectorAll('#edit-seam tbody sub')].length === "
                           f"{5 + len(tok.encode_continuation('The'))}")
    assert columns(page) == [([dot] * 5, tok.encode_continuation("The"))]
    assert not overflows(page)
    page.locator("#edit-seam").scroll_into_view_if_needed()
    shot(page, f"edit-typing-{width}")
    page.fill("#edit-text textarea", "Thee")
    wait_text(page, "#edit-seam", "Your text against the run on view")
    run_to_end(page, lambda: page.click("#edit-continue"))
    second = output_text(page)
    assert second.startswith("Thee") and second != "Thee"
    page.wait_for_function(f"document.querySelector('#edit-text textarea').value === {second!r}")
    # The box holds the new run's text; the table is the edit of the run before, and says so.
    wait_text(page, "#edit-seam", "This run continued from your edit of the run before it")
    assert "the edited run's tokens" in page.inner_text("#edit-seam")
    assert columns(page) == [([dot] * 5, tok.encode_continuation("Thee"))]
    page.locator("#edit-seam").scroll_into_view_if_needed()
    shot(page, f"edit-continued-{width}")
    # An edit of the new run's text is compared with the new run.
    page.fill("#edit-text textarea", second + "!")
    wait_text(page, "#edit-seam", "Your text against the run on view")
    assert columns(page) == [([], tok.encode_continuation("!"))]
    assert "continued from your edit" not in page.inner_text("#edit-seam")
    # Undo: the run before, which continued from nothing: no table.
    page.click("#edit-undo")
    page.wait_for_function(f"document.querySelector('#output .tl-out')?.dataset.text === {first!r}")
    page.wait_for_function(f"document.querySelector('#edit-text textarea').value === {first!r}")
    page.wait_for_function("document.querySelector('#edit-seam').innerText.trim() === ''")
    page.close()


def test_a_reload_keeps_the_work_and_clear_forgets_it(live_app, browser):
    """At 1400 px; the work restored is then looked at on a phone too (the same browser, the
    window made 420 px wide and the page reloaded: the flow itself does not depend on the width)."""
    url, _, h = live_app
    width, height = 1400, 1000
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(url + "/")
    wait_loaded(page)
    assert "kept in this browser as you work" in page.inner_text("#saved-work")
    type_in(page, "#prompt textarea", "Hello there")
    page.locator("#mode").get_by_text("chat", exact=True).click()
    type_in(page, "#seed input, #seed textarea", "4")
    run_to_end(page, lambda: page.click("#generate"))
    wait_text(page, "#conversation", "Hello there")
    page.locator("#topk [data-pick]").nth(1).click()  # a branch from another candidate of the last step
    page.wait_for_function("document.querySelectorAll('#branches .tl-branch').length === 2")
    page.wait_for_function("!document.querySelector('#generate').disabled")
    wait_text(page, "#saved-work", "a tree of 2 branches")
    # The branch's answer (the tiny model's long runs of one character, no space) wraps in the
    # conversation instead of widening its column over the output.
    assert not columns_overlap(page)
    before = {"output": output_text(page), "conversation": page.inner_text("#conversation"),
              "branches": page.inner_text("#branches"), "seed": page.input_value("#seed input, #seed textarea"),
              "link": link(page)}
    page.reload()
    wait_loaded(page)
    wait_text(page, "#saved-work", "Restored from this browser")
    page.wait_for_function("document.querySelector('#output .tl-out')?.dataset.text != null")
    page.evaluate("window.scrollTo(0, 0)")
    shot(page, f"restored-{width}")
    page.locator("#branches").scroll_into_view_if_needed()
    shot(page, f"restored-{width}-branches")
    page.wait_for_function("""(e) => document.querySelector('#conversation').innerText === e.conversation
        && document.querySelector('#branches').innerText === e.branches""", arg=before)  # (as below)
    after = {"output": output_text(page), "conversation": page.inner_text("#conversation"),
             "branches": page.inner_text("#branches"), "seed": page.input_value("#seed input, #seed textarea"),
             "link": link(page)}
    assert after == before and "prefix_ids=" in before["link"]
    assert page.locator("#mode input[value='chat']").is_checked()
    assert page.locator("#topk [data-pick]").count() > 0  # the bars, ready to branch again
    assert not overflows(page)
    # On a phone: the same work, restored within the window.
    page.set_viewport_size({"width": 420, "height": 900})
    page.reload()
    wait_loaded(page)
    wait_text(page, "#saved-work", "Restored from this browser")
    page.wait_for_function("document.querySelector('#output .tl-out')?.dataset.text != null")
    # (Until the restore's events end: meanwhile Gradio shows their time in the panels' text.)
    page.wait_for_function("""(e) => document.querySelector('#output .tl-out')?.dataset.text === e.output
        && document.querySelector('#conversation').innerText === e.conversation
        && document.querySelector('#branches').innerText === e.branches""",
                           arg={k: before[k] for k in ("output", "conversation", "branches")})
    assert not overflows(page) and not columns_overlap(page)
    page.evaluate("window.scrollTo(0, 0)")
    shot(page, "restored-420")
    page.locator("#branches").scroll_into_view_if_needed()
    shot(page, "restored-420-branches")
    page.set_viewport_size({"width": width, "height": height})
    # A link wins over saved work.
    page.goto(url + "/?prompt=From%20a%20link")
    wait_loaded(page)
    assert page.input_value("#prompt textarea") == "From a link" and "Opened from a link" in page.inner_text("#saved-work")
    page.goto(url + "/")
    wait_loaded(page)
    wait_text(page, "#saved-work", "Restored from this browser")
    page.click("#clear-work")
    page.wait_for_function("document.querySelector('#saved-work')?.innerText.includes('kept in this browser as you work')")
    wait_loaded(page)
    page.reload()
    wait_loaded(page)
    assert page.input_value("#prompt textarea") == h.page.defaults.prompt and output_text(page) is None
    # The defaults' completion mode hides the conversation (an empty one, were it shown).
    conversation = page.locator("#conversation")
    assert conversation.count() == 0 or not conversation.is_visible() or conversation.inner_text().strip() == ""
    assert "kept in this browser as you work" in page.inner_text("#saved-work")
    context.close()


@pytest.fixture
def held_restore(tiny_engine):
    """The page on its own server, whose restore of the saved work waits while `held` is clear:
    (url, held)."""
    from ui.handlers import Handlers
    from app import serve
    from ui.layout import build_ui

    h, held = Handlers(tiny_engine), threading.Event()
    held.set()
    restore = h.work.restore_work

    @functools.wraps(restore)
    def held_restore_work(*args, **kwargs):
        held.wait(60)
        return restore(*args, **kwargs)

    h.work.restore_work = held_restore_work
    demo = build_ui(tiny_engine, h)
    _, url, _ = serve(demo, tiny_engine, port=None, block=False)
    yield url.rstrip("/"), held
    held.set()
    demo.close()


@pytest.mark.parametrize("width,height", [(1400, 1000), (420, 900)])
def test_the_controls_wait_until_the_saved_work_is_in(held_restore, browser, width, height):
    """Keys pressed while the page still applies the work saved in the browser are not taken
    (the restore would replace them); the controls say they are busy, then take input."""
    url, held = held_restore
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(url + "/")
    wait_loaded(page)
    kept = page.evaluate("localStorage.getItem('tokenlab-settings')")
    type_in(page, "#prompt textarea", "A kept prompt")
    page.wait_for_function("(kept) => localStorage.getItem('tokenlab-settings') !== kept", arg=kept)
    held.clear()
    page.reload()
    # The page's load event (the link's settings, then the saved work) waits: the controls fade.
    page.wait_for_function("document.querySelector('#input-col') "
                           "&& getComputedStyle(document.querySelector('#input-col')).opacity === '0.5'")
    assert page.get_attribute("body", "data-tl-ready") is None
    shot(page, f"restoring-{width}")
    before = page.input_value("#prompt textarea")
    page.focus("#prompt textarea")
    page.keyboard.type("typed early")
    page.focus("#seed input, #seed textarea")
    page.keyboard.type("7")
    assert page.input_value("#prompt textarea") == before
    assert page.input_value("#seed input, #seed textarea") == ""
    assert page.evaluate("getComputedStyle(document.querySelector('#input-col')).pointerEvents") == "none"
    assert page.get_attribute("#input-col", "aria-busy") == "true"
    assert page.get_attribute("#settings-col", "aria-busy") == "true"
    held.set()
    page.wait_for_selector("body[data-tl-restored='1']")
    assert page.input_value("#prompt textarea") == "A kept prompt"
    assert page.get_attribute("#input-col", "aria-busy") is None
    page.locator("#prompt textarea").press("End")
    page.locator("#prompt textarea").type("!")
    assert page.input_value("#prompt textarea") == "A kept prompt!"
    page.wait_for_function("getComputedStyle(document.querySelector('#input-col')).opacity === '1'")
    context.close()
