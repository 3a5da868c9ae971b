"""Constrained output and compare A/B as a person uses them, in chromium at 1400 and 420 px: the
ready example "JSON: a person" under common settings (temperature 0.8, top-k 40, top-p 0.9) writes
JSON (it made 0 tokens while the constraint ran after the cutoffs); then, the constraint set to
none on the page, compare A/B runs B without it (B follows the page's settings) and the comparison
says in what B differs. Screenshots under test-results/shots/test_constrain_compare_browser/.

On real models (scripts/page_session.sh) each model's page, opened with ?model=NAME; where the
page offers another model, B is that model."""

import json
from urllib.parse import quote

import pytest

from browser import SESSION_MODELS, SIZES, open_at, overflows, run_to_end, shot, wait_text, watch

PERSON = "Describe a fictional person as JSON:"
QUERY = ("prompt=" + quote(PERSON) + "&mode=completion&temperature=0.8&top_k=40&top_p=0.9&seed=3"
         "&max_new_tokens=60")


@pytest.mark.parametrize("model", SESSION_MODELS)
@pytest.mark.parametrize("width,height", SIZES)
def test_a_constrained_person_then_compare_without_the_constraint(served, browser, width, height, model):
    page = open_at(browser, served, width, height, QUERY + (f"&model={quote(model)}" if model else ""))
    seen = watch(page)
    if model:
        page.wait_for_selector("#generate:not([disabled])")
    name = f"{model or 'tiny'}-{width}"
    page.get_by_text("Constrain output: JSON schema").click()
    page.locator("#constraint-example input").click()
    page.get_by_role("option", name="JSON: a person").click()
    wait_text(page, "#constraint-check", "a valid JSON schema")
    run_to_end(page, lambda: page.click("#generate"))
    status = page.inner_text("#status")
    assert "no token the constraint allows" not in status and " · 0 tokens" not in status, status
    text = page.evaluate("document.querySelector('#output .tl-out')?.dataset.text ?? ''")
    if "the constraint is complete" in status or "end-of-sequence" in status:
        person = json.loads(text)  # the whole text is the schema's
        assert set(person) == {"name", "age"}, person
    else:  # at max new tokens: a start of the schema's JSON
        assert text.startswith("{"), text
    assert not overflows(page)
    shot(page, f"constrained-{name}", selector="#output-caption")
    # The constraint off on the page: B follows, and the line above "Run A and B" says what B changes.
    page.locator("#constraint label").filter(has_text="none").click()
    page.get_by_text("Sampling experiments").click()
    if page.locator("#model-b").count():  # B is the page's other model
        current = page.input_value("#model input")
        page.locator("#model-b input").click()
        page.get_by_role("option").filter(has_not_text="A's model").filter(has_not_text=current).first.click()
        wait_text(page, "#compare-diff", "Model:")
    else:
        wait_text(page, "#compare-diff", "B is A")
    assert "Constrain output" not in page.inner_text("#compare-diff")
    page.click("#compare")
    page.wait_for_function("(document.querySelector('#compare-summary')?.innerText || '').includes('perplexity')",
                           timeout=600_000)
    summary = page.inner_text("#compare-summary")
    assert "Constrain output" not in summary and "mean chosen-token p (final: sampled from)" in summary
    assert not overflows(page)
    page.locator("#compare-summary").scroll_into_view_if_needed()
    shot(page, f"compare-{name}")
    page.close()
    assert seen["errors"] == [] and seen["http"] == [], seen
