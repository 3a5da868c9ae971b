"""A loom's tree as the page keeps it: one JSON object (the section's state, the browser's storage,
the download) and, shorter, a link's `loom` parameter; and how either is read back. What is read
back is checked (each node after its parent, token ids of the model's vocabulary, probabilities
that are probabilities) and refused in one line, never shown half. Pure functions, no Gradio.

The object: the model, the ids the tree grew after (the prompt's and the given ones), the controls
and seed of the run it grew from (a leaf continues as that run would), the choice of children
(depth, node budget, top k, threshold), how it ended, and every node as decoding/tree.py's
TreeNode.to_json writes it, the root first."""

from __future__ import annotations

import base64
import json
import math
import zlib

from inference.decoding.tree import MAX_NODES
from inference.errors import InputError
from ui.controls import NAMES

VERSION = 1
# The longest link the loom makes: most browsers, servers and chat apps pass links of 8,000
# characters whole; a longer tree is in the download only, and the page says so.
MAX_LINK_CHARS = 8000
NODE_KEYS = ("id", "parent", "token_id", "depth", "logprob", "path_logprob", "greedy", "eos", "expanded",
             "unexpanded_mass", "piece", "prob", "path_prob")


def ids_check(ids: list[int]) -> int:
    """A short check of the ids a tree grew after (a link holds this, not the ids)."""
    return zlib.crc32(",".join(map(str, ids)).encode())


def tree_json(done, *, model: str, prompt_ids: list[int], given: list[int], controls: dict, seed,
              history: list, where: str) -> dict:
    """The tree a TreeDoneEvent ended, with what it grew from."""
    return {"v": VERSION, "model": model, "prompt_ids": list(prompt_ids), "given": list(given),
            "controls": dict(controls), "seed": seed, "history": list(history or []), "from": where,
            "depth": done.depth, "max_nodes": done.max_nodes, "top_k": done.top_k, "min_prob": done.min_prob,
            "reason": done.reason, "steps": done.steps, "nodes": [n.to_json() for n in done.nodes]}


def download_text(tree: dict) -> str:
    return json.dumps(tree, ensure_ascii=False, indent=1) + "\n"


# ------------------------------------------------------------------ the link's parameter

def link_param(tree: dict) -> str:
    """The tree, compressed, for a link's `loom` parameter: the choice of children, how it ended,
    and per node its parent, token, log p, flags and left-out mass (the rest follows from them
    and from the link's prompt, which the link's controls give)."""
    nodes = [[n["parent"], n["token_id"], n["logprob"], int(n["greedy"]) | int(n["eos"]) << 1 | int(n["expanded"]) << 2,
              n["unexpanded_mass"]] for n in tree["nodes"][1:]]
    root = tree["nodes"][0]
    data = {"v": VERSION, "m": tree["model"], "n": len(tree["prompt_ids"]) + len(tree["given"]),
            "c": ids_check(tree["prompt_ids"] + tree["given"]), "d": tree["depth"], "b": tree["max_nodes"],
            "k": tree["top_k"], "p": tree["min_prob"], "r": tree["reason"], "s": tree["steps"],
            "u": root["unexpanded_mass"], "t": nodes}
    packed = zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 9)
    return base64.urlsafe_b64encode(packed).decode().rstrip("=")


def from_link_param(value: str, *, model: str, prompt_ids: list[int], given: list[int], controls: dict, seed,
                    history: list, piece, vocab: int) -> dict:
    """A link's `loom` parameter read back as the tree JSON, its prompt and given ids the link's
    controls' (prepared as a run would be), which must be the ids it grew after."""
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        data = json.loads(zlib.decompressobj().decompress(raw, 1 << 20))
        rows = data["t"]
        if not isinstance(rows, list) or len(rows) > MAX_NODES:
            raise ValueError
    except (ValueError, TypeError, KeyError, zlib.error):
        raise InputError("the link's tree could not be read (the link was cut short or changed)") from None
    if data.get("v") != VERSION:
        raise InputError("the link's tree was made by another version of the page")
    ids = list(prompt_ids) + list(given)
    if data.get("m") != model:
        raise InputError(f"the link's tree was grown on {data.get('m')!r}, which this page does not offer")
    if data.get("n") != len(ids) or data.get("c") != ids_check(ids):
        raise InputError("the link's prompt gives other tokens here (another model or tokenizer) than the tree grew after")
    nodes = [{"id": 0, "parent": None, "token_id": None, "depth": 0, "logprob": 0.0, "path_logprob": 0.0,
              "greedy": True, "eos": False, "expanded": True, "unexpanded_mass": data.get("u"), "piece": ""}]
    try:
        for i, (parent, token, logprob, flags, mass) in enumerate(rows, start=1):
            up = nodes[parent] if isinstance(parent, int) and 0 <= parent < i else None
            if up is None or not isinstance(token, int) or not isinstance(flags, int) or not 0 <= token < vocab:
                raise ValueError
            nodes.append({"id": i, "parent": parent, "token_id": token, "depth": up["depth"] + 1,
                          "logprob": logprob, "path_logprob": up["path_logprob"] + logprob,
                          "greedy": bool(flags & 1), "eos": bool(flags & 2), "expanded": bool(flags & 4),
                          "unexpanded_mass": mass, "piece": piece(token)})
    except (ValueError, TypeError):
        raise InputError("the link's tree could not be read (a node without its parent, or a token this model "
                         "does not have)") from None
    tree = {"v": VERSION, "model": model, "prompt_ids": list(prompt_ids), "given": list(given),
            "controls": dict(controls), "seed": seed, "history": list(history or []), "from": "a link",
            "depth": data.get("d"), "max_nodes": data.get("b"), "top_k": data.get("k"), "min_prob": data.get("p"),
            "reason": data.get("r"), "steps": data.get("s"), "nodes": nodes}
    return checked(tree, vocab)


# ------------------------------------------------------------------ reading a kept tree back

def checked(tree, vocab: int) -> dict:
    """A kept tree (the browser's, a link's), as it may be shown: its nodes complete, each after
    its parent, its paths' log p the sums along them, its token ids the model's, its numbers
    probabilities; with each node's p and path p. InputError in one line otherwise."""
    bad = InputError("the kept tree could not be read (it was changed, or made by another version of the page)")
    if not isinstance(tree, dict) or tree.get("v") != VERSION or not isinstance(tree.get("nodes"), list):
        raise bad
    nodes = tree["nodes"]
    if not 1 <= len(nodes) <= MAX_NODES + 1:
        raise bad
    try:
        for i, n in enumerate(nodes):
            if n["id"] != i or not isinstance(n["piece"], str):
                raise ValueError
            if i == 0:
                if n["parent"] is not None or n["token_id"] is not None or n["depth"] != 0 or \
                        n["logprob"] != 0 or n["path_logprob"] != 0:
                    raise ValueError
            else:
                up = nodes[n["parent"]] if isinstance(n["parent"], int) and 0 <= n["parent"] < i else None
                if up is None or not isinstance(n["token_id"], int) or not 0 <= n["token_id"] < vocab \
                        or n["depth"] != up["depth"] + 1 or not up["expanded"]:
                    raise ValueError
                if not (isinstance(n["logprob"], (int, float)) and -math.inf < n["logprob"] <= 0) or \
                        not abs(n["path_logprob"] - (up["path_logprob"] + n["logprob"])) <= 1e-9:
                    raise ValueError
            mass = n["unexpanded_mass"]
            if n["expanded"] and not (isinstance(mass, (int, float)) and -1e-9 <= mass <= 1 + 1e-9):
                raise ValueError
            for flag in ("greedy", "eos", "expanded"):
                if not isinstance(n[flag], bool):
                    raise ValueError
            n["prob"], n["path_prob"] = math.exp(n["logprob"]), math.exp(n["path_logprob"])
        for key in ("prompt_ids", "given"):
            if not isinstance(tree.get(key), list) or not all(isinstance(t, int) and 0 <= t < vocab for t in tree[key]):
                raise ValueError
        if not isinstance(tree.get("controls"), dict) or not isinstance(tree.get("model"), str) or \
                not isinstance(tree.get("context", ""), str) or not isinstance(tree.get("from"), str):
            raise ValueError
        def whole(v, none: bool = False) -> bool:
            return (v is None and none) or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 1 << 20)
        if not (whole(tree.get("depth")) and whole(tree.get("max_nodes")) and whole(tree.get("steps"))
                and whole(tree.get("top_k"), none=True) and isinstance(tree.get("reason"), str)):
            raise ValueError
        p = tree.get("min_prob")
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1):
            raise ValueError
        seed = tree.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError
        history = tree.get("history")
        if not isinstance(history, list) or not all(
                isinstance(m, dict) and m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)
                for m in history):
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise bad from None
    controls = {k: v for k, v in tree["controls"].items() if k in NAMES}
    history = [{k: m[k] for k in ("role", "content", "shown") if isinstance(m.get(k), str)} for m in tree["history"]]
    return {**tree, "controls": controls, "history": history,
            "nodes": [{k: n.get(k) for k in NODE_KEYS} for n in nodes]}
