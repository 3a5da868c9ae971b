"""The "Constrain output" control's ready examples and its live check of the text typed."""

from __future__ import annotations

import json

from inference.errors import InputError
from inference.sampling.constrain import check
from inference.sampling.settings import CONSTRAINT_KINDS
from ui.controls import labelled, unquoted


def _schema(properties: dict, required=None) -> str:
    return json.dumps({"type": "object", "properties": properties,
                       "required": list(properties) if required is None else required,
                       "additionalProperties": False}, indent=2)


# Said in the box where the engine cannot report the masked mass (contract.Capabilities).
NO_MASKED_MASS = ("The server applies the constraint (vLLM's structured outputs); the probability it "
                  "removes at each step is not reported, so the bars cannot show it.")

# Ready examples: name -> (kind, text).
EXAMPLES = {
    "JSON: a person": ("json_schema", _schema({"name": {"type": "string", "maxLength": 30},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 130}})),
    "JSON: yes or no, with a reason": ("json_schema", _schema({"answer": {"enum": ["yes", "no"]},
                                                               "reason": {"type": "string", "maxLength": 80}})),
    "JSON: a list of up to 3 cities": ("json_schema", _schema({"cities": {
        "type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 3}})),
    "Regex: a date (YYYY-MM-DD)": ("regex", r"[12][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"),
    "Grammar: a sum of numbers": ("grammar", 'root ::= number (" + " number)*\nnumber ::= [1-9] [0-9]*'),
}


def pick_example(name: str | None) -> dict:
    """The example's kind and text, by component name (nothing for an empty pick)."""
    if name not in EXAMPLES:
        return {}
    kind, text = EXAMPLES[name]
    return {"constraint": kind, "constraint_text": text}


def check_text(kind: str, text: str) -> str:
    """One line under the box: whether the constraint parses, and xgrammar's message if not (the
    box called by its label, as the status line calls it)."""
    if not kind:
        return ""
    try:
        check(kind, text or "")
    except InputError as e:
        return f"⚠ {labelled('constraint_text', unquoted(e))}"
    return f"✓ a valid {CONSTRAINT_KINDS[kind][0]}: only text it allows is sampled; the run ends when it is complete."
