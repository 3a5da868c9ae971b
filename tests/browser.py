"""The browser the page tests drive: Playwright and Debian's chromium (the `browser` fixture of
conftest.py, one per test module), and the helpers every browser test shares: waits, what the
page shows, and screenshots, under test-results/shots/<the test's module>/ (gitignored).
Importing this module skips the importing test module where Playwright is not installed; the
tests of a module that imports it are marked `browser` (conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

sync_api = pytest.importorskip("playwright.sync_api")

# Debian's headless build of chromium where it is installed (the same Blink, without the browser
# shell: ~10% less CPU for a page's load, run and reload, which the suite spends most of its time
# on), else chromium itself.
SHELL = "/usr/lib/chromium/chromium-headless-shell"
CHROMIUM = SHELL if os.path.exists(SHELL) else shutil.which("chromium") or "/usr/bin/chromium"
WAIT_MS = 180_000  # an upper bound only (a busy CI machine): every wait ends as soon as its condition holds
SHOTS = Path(__file__).resolve().parents[1] / "test-results" / "shots"
# The models a page served elsewhere offers (scripts/page_session.sh; conftest's `served` has its
# address): the tests that take them open it with ?model=NAME, once each; None: the tiny model's page.
SESSION_MODELS = [m for m in os.environ.get("TOKENLAB_SESSION_MODELS", "").split(",") if m] or [None]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def chromium():
    """A headless chromium; the test is skipped where it is not installed (and fails in CI)."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (scripts/test.sh installs it with apt)")
        pytest.skip("chromium is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


def wait_loaded(page) -> None:
    """Until the page has applied its link's settings and the work saved in this browser: text
    typed before then is overwritten by them (on a busy machine that can take seconds)."""
    page.wait_for_selector("body[data-tl-ready='1']")
    page.wait_for_selector("body[data-tl-restored='1']")


def type_until(page, elem: str, value, key: str, holds: str) -> None:
    """Type `value` into the number box of `elem`, confirm it with `key` as a person does, and wait
    until the page's `holds` is true. Gradio can put a field's first value back over what was typed
    while it is still mounting it (an accordion just opened, on a busy machine): the typing is
    repeated until it holds, for WAIT_MS at most."""
    box = page.locator(f"{elem} input[type=number]")
    for _ in range(WAIT_MS // 2_000):
        box.fill(str(value))
        box.press(key)
        try:
            page.wait_for_function(holds, timeout=2_000)
            return
        except sync_api.TimeoutError:
            continue
    raise AssertionError(f"{elem} never took {value}: it shows {box.input_value()}")


def number_is(elem: str, value, kind: str = "number") -> str:
    return f"parseFloat(document.querySelector({elem + f' input[type={kind}]'!r})?.value) === {float(value)!r}"


def set_slider(page, elem: str, value, key: str = "Enter") -> None:
    """`value` typed into the slider `elem`'s number box ("#n-samples"), until the slider holds it."""
    type_until(page, elem, value, key, number_is(elem, value, "range") + " && " + number_is(elem, value))


def set_number(page, elem: str, value, key: str = "Tab") -> None:
    """`value` typed into the number box `elem` ("#loom-k"), until it holds it."""
    type_until(page, elem, value, key, number_is(elem, value))


def open_page(browser, **kwargs):
    """A new page whose waits give up only after WAIT_MS."""
    page = browser.new_page(**kwargs)
    page.set_default_timeout(WAIT_MS)
    return page


def open_at(browser, url: str, width: int, height: int, query: str):
    """The page at this window size with a link's settings (query), ready for input."""
    page = open_page(browser, viewport={"width": width, "height": height})
    page.goto(url + "/?" + query)
    wait_loaded(page)
    return page


# The elements' boxes, [x, y, width, height] each, when two looks a poll apart agree: boxes taken
# one by one while the page still moves (a panel shown above them) would mix two layouts.
STILL_BOXES_JS = """(selectors) => {
    const now = JSON.stringify(selectors.map((s) => {
        const r = document.querySelector(s)?.getBoundingClientRect();
        return r && r.width > 0 ? [r.x, r.y, r.width, r.height] : null;
    }));
    const still = window.tlBoxes === now && !now.includes('null');
    window.tlBoxes = now;
    return still && now;
}"""


def still_boxes(page, *selectors: str) -> list[dict]:
    """The elements' bounding boxes, taken at once when the layout is still, as Playwright's."""
    page.evaluate("window.tlBoxes = null")
    boxes = json.loads(page.wait_for_function(STILL_BOXES_JS, arg=list(selectors), polling=100).json_value())
    return [dict(zip(("x", "y", "width", "height"), box)) for box in boxes]


SETTLED_JS = "+(document.body.dataset.tlSettled || 0)"


def settled_after(page, click) -> None:
    """click(), then wait until the run it starts has ended and every panel after it (its charts,
    the panels that follow a run) has its values: the page counts such runs on <body>."""
    before = page.evaluate(SETTLED_JS)
    click()
    page.wait_for_function(f"{SETTLED_JS} > {before}")


def generate_to_end(page) -> None:
    """Generate, and wait for the run's end and every panel after it."""
    settled_after(page, lambda: page.click("#generate"))


# The status line's texts from now on (an earlier run's "Run ended" is never taken for this one's).
WATCH_STATUS_JS = """() => {
    const el = document.querySelector('#status');
    window.tlSeen = [];
    if (window.tlWatch) window.tlWatch.disconnect();
    window.tlWatch = new MutationObserver(() => window.tlSeen.push(el.innerText));
    window.tlWatch.observe(el, {subtree: true, childList: true, characterData: true});
}"""


def run_to_end(page, click) -> None:
    """click(), then wait for that run's end (the status line watched from before the click)."""
    page.evaluate(WATCH_STATUS_JS)
    settled_after(page, click)
    page.wait_for_function("window.tlSeen.some((t) => t.includes('Waiting for the engine')) && "
                           "document.querySelector('#status').innerText.includes('Run ended')")
    page.wait_for_function("!document.querySelector('#generate').disabled")


def shot(page, name: str, full: bool = False, selector: str | None = None) -> Path:
    """A screenshot of the window (the whole page with `full`), scrolled to the selector's element
    first, saved as test-results/shots/<the running test's module>/<name>.png."""
    if selector:
        page.locator(selector).first.scroll_into_view_if_needed()
    module = Path(os.environ.get("PYTEST_CURRENT_TEST", "unknown").split("::")[0]).stem
    path = SHOTS / module / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=full)
    return path


def wait_text(page, selector: str, needle: str) -> None:
    """Until the element's text holds `needle`; failing, says what it holds instead."""
    try:
        page.wait_for_function(f"(document.querySelector({selector!r})?.innerText || '').includes({needle!r})")
    except sync_api.TimeoutError:
        held = page.evaluate(f"document.querySelector({selector!r})?.innerText ?? null")
        toasts = page.evaluate("[...document.querySelectorAll('.toast-body')].map((t) => t.innerText)")
        raise AssertionError(f"{selector} never held {needle!r}: it holds {held!r}; messages {toasts!r}") from None


def output_text(page) -> str | None:
    """The generated text the output box holds (its data-text), None before any run."""
    return page.evaluate("document.querySelector('#output .tl-out')?.dataset.text ?? null")


def overflows(page) -> bool:
    """Whether the page is wider than the window (it would need sideways scrolling)."""
    return page.evaluate("document.documentElement.scrollWidth > document.documentElement.clientWidth + 1")


# The two widths every page check is made at: a wide screen and a phone.
SIZES = [(1400, 1000), (420, 900)]


def box(page, selector: str) -> dict:
    """The first element's bounding box ({x, y, width, height})."""
    return page.locator(selector).first.bounding_box()


def watch(page) -> dict:
    """What the session leaves in the console and the network, as it happens."""
    seen = {"errors": [], "warnings": [], "http": []}
    page.on("console", lambda m: seen["errors" if m.type == "error" else "warnings" if m.type == "warning"
                                     else "other"].append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: seen["errors"].append(f"page error: {e}"))
    page.on("response", lambda r: seen["http"].append(f"{r.status} {r.url}") if r.status >= 400 else None)
    return seen
