"""The loom's HTML: the tree, each node under its parent (most probable first) with its token, its
probability and its path's, the greedy path marked, under each expanded node the probability its
children left out ("other tokens (not grown)"), so that the picture never shows more than was explored; a leaf
clicked continues as a run. And the summary line (how the tree ended, the pool per level) and the
link and download line."""

from __future__ import annotations

import html

from ui.format import count, fmt_p, mib, token_label
from ui.glossary import gloss
from ui.loom import store

HINT = ("Grow the tree from a step of the run on view (or from the prompt): at each node every token above "
        "the threshold p and/or among the top k, to the depth, within the node budget. Click a leaf to "
        "continue it as a run.")
ENDED = {"depth": "reached its depth", "budget": "used its node budget (the most probable paths kept)",
         "complete": "had nothing left to expand (no token above the threshold, or each path ended)",
         "cancelled": "was stopped"}


def _piece(piece: str) -> str:
    return html.escape(token_label(piece))


def _bar(p: float) -> str:
    return f"<span class='loom-bar'><span style='width:{max(0.0, min(1.0, p)) * 100:.1f}%'></span></span>"


def tree_html(nodes: list[dict], context: str = "", growing: bool = False) -> str:
    """The tree (nodes as TreeNode.to_json writes them, the root first): a row a node, indented
    by its depth; a leaf (a node not expanded: the depth, an end of sequence, the budget) is a
    button that continues it as a run; not while it grows (its levels so far, each node as its
    level's event gave it)."""
    if not nodes:
        return f"<div class='loom-tree loom-empty'>{html.escape(HINT)}</div>"
    children: dict[int, list[dict]] = {}
    for n in nodes[1:]:
        children.setdefault(n["parent"], []).append(n)
    rows = []

    def walk(n: dict) -> None:
        kids = sorted(children.get(n["id"], []), key=lambda c: (-c["logprob"], c["token_id"]))
        if n["parent"] is None:
            rows.append(f"<div class='loom-node loom-root' style='--d:0'><span class='loom-tok'>"
                        f"{html.escape(context) or 'the point it grows from'}</span></div>")
        else:
            # A leaf continues as a run, unless it ends the text: after an end of sequence the model
            # has nothing left to write (a run would write past its own end).
            leaf = not n["expanded"] and not growing and not n["eos"]
            cls = "loom-node" + (" loom-greedy" if n["greedy"] else "") + (" loom-leaf" if leaf else "") + \
                (" loom-eos" if n["eos"] else "")
            pick = (f" data-pick='{n['id']}' tabindex='0' role='button' title='continue this path as a run'"
                    if leaf else "")
            end = " <span class='loom-mark'>end of sequence</span>" if n["eos"] else ""
            greedy = " <span class='loom-mark loom-g'>greedy</span>" if n["greedy"] else ""
            go = " <span class='loom-go'>▶ continue</span>" if leaf else ""
            rows.append(f"<div class='{cls}' style='--d:{n['depth']}'{pick}><span class='loom-tok'>"
                        f"{_piece(n['piece'])}</span> {_bar(n['prob'])}<span class='loom-p'>p {fmt_p(n['prob'])}"
                        f"</span> <span class='loom-pp'>path p {fmt_p(n['path_prob'])}</span>{greedy}{end}{go}</div>")
        for c in kids:
            walk(c)
        if n["expanded"] and n.get("unexpanded_mass") is not None:
            rows.append(f"<div class='loom-node loom-rest' style='--d:{n['depth'] + 1}'><span class='loom-tok'>"
                        f"other tokens (not grown)</span> {_bar(n['unexpanded_mass'])}<span class='loom-p'>"
                        f"p {fmt_p(n['unexpanded_mass'])}</span> <span class='loom-pp'>the other tokens here"
                        f"{', ' + count(len(kids), 'child', 'children') + ' shown' if kids else ''}</span></div>")

    walk(nodes[0])
    return f"<div class='loom-tree' id='loom-tree'>{''.join(rows)}</div>"


def pool_line(ev) -> str:
    """A level's step through the scheduler: its nodes' KV blocks (shared prefixes once), and the
    server's whole pool then."""
    p = ev.pool
    line = (f"Level {ev.step + 1}: {count(len(ev.nodes), 'node')} added in {ev.ms:.0f} ms; the nodes still to "
            f"expand hold {count(ev.kv_blocks, 'KV block')} ({ev.kv_blocks_unshared} without sharing their prefix)")
    if p is None:
        return line + "."
    others = p.active_runs - 1
    return (line + f"; the server's pool: {p.blocks_used:,} of {p.blocks_total:,} blocks in use "
            f"({mib(p.bytes_used)}) by " + ("this tree alone" if others <= 0 else
                                            f"this tree and {count(others, 'other run')}") + ".")


def summary_html(tree: dict, pools: list[str] = (), note: str = "") -> str:
    """What the tree is: where it grew from, how its children were chosen, how it ended, its
    nodes; the greedy path's probability; then each level's pool line."""
    nodes = tree["nodes"]
    chose = " and ".join(x for x in (f"top k {tree['top_k']}" if tree.get("top_k") else "",
                                     f"threshold p ≥ {tree['min_prob']:g}" if tree.get("min_prob") else "") if x)
    greedy = [n for n in nodes[1:] if n["greedy"]]
    deepest = max(greedy, key=lambda n: n["depth"]) if greedy else None
    leaves = sum(1 for n in nodes[1:] if not n["expanded"])
    text = (f"<p><b>The loom</b> on {html.escape(tree['model'] or 'the model')}, from {html.escape(tree['from'])}: "
            f"{count(len(nodes) - 1, 'node')} ({count(leaves, 'leaf', 'leaves')}) by {chose}, depth "
            f"{tree['depth']}, node budget {tree['max_nodes']}; it {ENDED.get(tree['reason'], tree['reason'])}."
            + (f" The greedy path's p over {count(deepest['depth'], 'token')}: {fmt_p(deepest['path_prob'])}."
               if deepest else "") + " Probabilities are the model's own (temperature 1, no sampling setting).</p>")
    if note:
        text += f"<p class='loom-note'>{html.escape(note)}</p>"
    if pools:
        text += "<ul class='loom-pools'>" + "".join(f"<li>{html.escape(p)}</li>" for p in pools) + "</ul>"
    return gloss(text)


def links_html(download: str | None, link: str | None, too_long: int | None = None) -> str:
    """The tree's download, and its link (or why there is none: past a link's length)."""
    parts = []
    if download:
        parts.append(f"<a class='tl-dl' id='loom-download' href='{html.escape(download, quote=True)}' download>"
                     "Download the tree (JSON)</a>")
    if link:
        parts.append(f"<span class='loom-link'>Link to this tree: <input readonly id='loom-link-text' "
                     f"value='{html.escape(link, quote=True)}' onclick='this.select()'></span>")
    elif too_long:
        parts.append(f"<span class='loom-note' id='loom-link-long'>This tree is too large for a link "
                     f"({too_long:,} characters, past the {store.MAX_LINK_CHARS:,} a link may hold): download it "
                     "instead.</span>")
    return f"<div class='loom-links'>{''.join(parts)}</div>"
