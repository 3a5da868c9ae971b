"""A loom that grows itself: the tree of continuations from one point of a run, expanded by the
model's own distribution (temperature 1, nothing filtered) at each node.

From the root (the prompt and any given ids) every candidate above a probability (`min_prob`)
and/or among the k most likely (`top_k`) becomes a child, to a depth and a budget of nodes. The
tree grows a level a step: one scheduler run, whose live rows are the nodes of the last level
still to expand, each a decode row in the step every other run takes too (serving/beam_rows.py,
as a beam search's beams: a child's block table forks its parent's, so the prompt and every common
prefix are held once). When a level's candidates would pass the budget, the most probable paths
are kept (by the path's probability, ties by row and token id); the others are left out, and each
node says how much probability its children left out hold (`unexpanded_mass`), so the picture
never overstates what was explored. The greedy path (each token the argmax, the first of equal
maxima as greedy decoding takes it) is marked.

A node's probability is its token's in the softmax of its parent's row of logits, in float64
from the float32 logits; a path's is the product along it (the sum of the logs). This module only
chooses; the scheduler owns the forward passes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from inference.decoding.beams import Beam, Hypothesis
from inference.errors import InputError, shown
from inference.events import TreeDoneEvent, TreeStepEvent

MAX_DEPTH = 16  # the engine's own bounds; a shared page sets lower ones per visitor (TreeLimits)
MAX_NODES = 256


@dataclass(frozen=True)
class TreeLimits:
    """The most a tree may grow: its depth and its nodes (the root not counted), and who set the
    bound (said when a request passes it)."""
    depth: int = MAX_DEPTH
    nodes: int = MAX_NODES
    source: str = "the engine"


@dataclass
class TreeNode:
    id: int
    parent: int | None  # None: the root, the point of the run the tree grows from
    token_id: int | None  # None at the root
    depth: int
    logprob: float  # of its token given its parent's path, in the model's own distribution (0 at the root)
    path_logprob: float  # of the path from the root to it
    greedy: bool  # on the greedy path: every token of its path the argmax of its parent's row
    eos: bool = False  # an end-of-sequence token: nothing follows it
    expanded: bool = False  # its row was computed and its children chosen
    unexpanded_mass: float | None = None  # expanded: the probability of its tokens left out of the tree
    piece: str = ""

    @property
    def prob(self) -> float:
        return math.exp(self.logprob)

    @property
    def path_prob(self) -> float:
        return math.exp(self.path_logprob)

    def to_json(self) -> dict:
        return {**asdict(self), "prob": self.prob, "path_prob": self.path_prob}


def check_tree(depth, max_nodes, top_k, min_prob, limits: TreeLimits = TreeLimits()) -> None:
    """A tree's shape: a depth and a node budget within `limits`, and children chosen by top_k
    (1 or more), min_prob (in (0, 1]) or both; InputError naming the bound."""
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= limits.depth:
        raise InputError(f"the tree's depth must be from 1 to {limits.depth} ({limits.source}'s bound), "
                         f"got {shown(depth)}", field="depth")
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or not 1 <= max_nodes <= limits.nodes:
        raise InputError(f"the tree's nodes must be from 1 to {limits.nodes} ({limits.source}'s bound), "
                         f"got {shown(max_nodes)}", field="max_nodes")
    if top_k is None and min_prob is None:
        raise InputError("choose the children by a probability threshold, the top k, or both", field="min_prob")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise InputError(f"top k must be a whole number of 1 or more, got {shown(top_k)}", field="top_k")
    if min_prob is not None and (isinstance(min_prob, bool) or not isinstance(min_prob, (int, float))
                                 or not 0 < min_prob <= 1):
        raise InputError(f"the probability threshold must be above 0 and at most 1, got {shown(min_prob)}",
                         field="min_prob")


@dataclass
class TreeSearch:
    """The scheduler's search for one tree (its `beams`, as a BeamSearch): `live` the nodes its
    next step reads, `step` choosing children from their rows."""
    depth: int
    max_nodes: int
    top_k: int | None
    min_prob: float | None
    eos_ids: frozenset
    nodes: list[TreeNode] = field(default_factory=lambda: [TreeNode(0, None, None, 0, 0.0, 0.0, True)])
    live: list[Beam] = field(default_factory=list)
    live_ids: list[int] = field(default_factory=lambda: [0])  # the node each row reads (the root first)
    steps: int = 0
    done: bool = False
    # "budget" (candidates left out, or no room to go deeper), "depth", or "complete" (no child to
    # expand: none above the threshold, or each ended)
    ended: str = ""
    added: list[TreeNode] = field(default_factory=list)  # the nodes the last step added

    @property
    def per_node(self) -> int:
        """The most children a node can have: top_k, and at most 1 / min_prob above a threshold."""
        bound = self.top_k if self.top_k is not None else math.inf
        return int(min(bound, math.floor(1 / self.min_prob + 1e-9) if self.min_prob else math.inf))

    @property
    def width(self) -> int:
        """The most rows a step can read: the widest level it expands (depth - 1) within the budget."""
        return max(1, min(self.max_nodes, self.per_node ** max(self.depth - 1, 0)))

    def step(self, logits: torch.Tensor) -> list[tuple[Hypothesis, int]]:
        """One level from the live nodes' rows of logits (n, vocab): their children, each as a
        Hypothesis (parent: the row; "kept": read at the next step as live node `beam`; "leaf":
        in the tree, not expanded)."""
        logp = logits.double().log_softmax(-1)  # (n, vocab)
        k = min(self.per_node, logp.shape[-1])
        vals, ids = logp.topk(k, dim=-1)  # (n, k), most likely first
        greedy = logits.argmax(dim=-1).tolist()  # (n,): the first of equal maxima
        offers = []  # (path logprob, row, token, logprob)
        for r, nid in enumerate(self.live_ids):
            node = self.nodes[nid]
            for v, t in sorted(zip(vals[r].tolist(), ids[r].tolist()), key=lambda x: (-x[0], x[1])):
                if self.min_prob is None or math.exp(v) >= self.min_prob:
                    offers.append((node.path_logprob + v, r, t, v))
        room = self.max_nodes - (len(self.nodes) - 1)
        offers.sort(key=lambda o: (-o[0], o[1], o[2]))
        taken = offers[:room]
        level = self.steps + 1
        going_on = level < self.depth and len(taken) < room  # room left after this level, and depth
        hyps, live, live_ids, chosen = [], [], [], {r: [] for r in range(len(self.live_ids))}
        self.added = []
        for path, r, t, v in taken:
            parent = self.nodes[self.live_ids[r]]
            eos = t in self.eos_ids
            node = TreeNode(len(self.nodes), parent.id, t, level, v, path, parent.greedy and t == greedy[r], eos)
            self.nodes.append(node)
            self.added.append(node)
            chosen[r].append(t)
            keep = going_on and not eos
            hyps.append(Hypothesis(r, t, v, path, "kept" if keep else "leaf", len(live) if keep else None))
            if keep:
                live.append(Beam([*self._path(parent), t], path))
                live_ids.append(node.id)
        for r, nid in enumerate(self.live_ids):
            node = self.nodes[nid]
            node.expanded = True
            rest = logp[r].exp().index_fill(0, torch.tensor(chosen[r], dtype=torch.long), 0.0)  # (vocab,)
            node.unexpanded_mass = float(rest.sum())
        self.live, self.live_ids, self.steps = live, live_ids, level
        if not live:  # "budget" where it left candidates out, else the depth, else nothing left to expand
            self.done = True
            self.ended = "budget" if len(offers) > room or (len(taken) == room and level < self.depth) else \
                "depth" if level >= self.depth else "complete"
        return [(h, h.parent) for h in hyps]

    def _path(self, node: TreeNode) -> list[int]:
        """The tokens from the root to node."""
        out = []
        while node.parent is not None:
            out.append(node.token_id)
            node = self.nodes[node.parent]
        return out[::-1]

    # ---------------------------------------------------------------- the run's events
    def step_event(self, hyps, pieces: list[str], ms: float, kv_blocks: int, unshared: int, copied: int, pool):
        for node, piece in zip(self.added, pieces):
            node.piece = piece
        return TreeStepEvent(self.steps - 1, list(self.added), ms, kv_blocks, unshared, copied, pool)

    def done_event(self, reason: str, prompt_tokens: int, tokenizer) -> TreeDoneEvent:
        for node in self.nodes:
            if node.token_id is not None and not node.piece:
                node.piece = tokenizer.piece(node.token_id)
        return TreeDoneEvent(reason, list(self.nodes), prompt_tokens, self.steps, self.depth, self.max_nodes,
                             self.top_k, self.min_prob)
