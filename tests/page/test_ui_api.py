"""The page's API, as scripts see it: /generate's parameter names and named outputs."""

from inference.sampling.settings import SETTINGS
from ui.layout import build_ui


def test_every_endpoint_names_its_parameters_and_outputs(tiny_engine):
    endpoints = build_ui(tiny_engine).get_api_info()["named_endpoints"]
    generate = endpoints["/generate"]
    assert [p["parameter_name"] for p in generate["parameters"]] == [
        "prompt", "mode", "system", "model", *(s.name for s in SETTINGS), "seed", "stop", "prefix_ids"]
    assert [s.name for s in SETTINGS][:5] == ["temperature", "top_k", "top_p", "min_p", "repetition_penalty"]
    assert generate["returns"][0]["label"] == "Generated text"
    for name, ep in endpoints.items():
        for p in ep["parameters"]:
            assert not p["parameter_name"].startswith("value_"), (name, p)
        for r in ep["returns"]:
            assert not r["label"].startswith("value_") and len(r["label"]) <= 40, (name, r["label"])
