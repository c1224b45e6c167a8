"""The trajectory tree of one execution, and `Jmax` path selection (DESIGN section 5).

Every call's input + output is inserted into a radix trie over token ids; only tokens not already on the path
create nodes, so a prefix shared by many calls (the system prompt, the history a compaction or a sub-agent starts
from) is stored once. A token is *trainable* only if the policy sampled it (it is in some call's ``output_ids``,
with that call's behaviour logprob and weight version); everything else is context. A call that extends an earlier
one token-exactly continues from the node where that call ended, so building costs the new tokens, never the history
again.

Nodes never lose their end: splitting a node puts the head in a new node above it, so "the node where call c ended"
stays valid as the tree grows. Leaves are nodes without children; each is the end of at least one call, whose role
(the highest-priority one) classes the leaf for selection.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

from gyre.journal.records import ROLE_PRIORITY, CallRecord, Role


class Node:
    """A run of tokens with one parent; per-token sampling facts in parallel lists."""

    __slots__ = ("calls", "children", "depth", "ends", "leaves", "logprobs", "parent", "sampled", "tokens",
                 "versions")  # fmt: skip

    def __init__(self, parent: Node | None, depth: int) -> None:
        self.parent = parent
        self.depth = depth  # tokens above this node (its first token's position on any path through it)
        self.tokens: list[int] = []
        self.sampled: list[bool] = []  # sampled by the policy: trainable
        self.logprobs: list[float] = []  # behaviour logprob where sampled (0.0 elsewhere)
        self.versions: list[int] = []  # weight version where sampled (-1 elsewhere)
        self.calls: list[int] = []  # index of the call that first brought each token in
        self.children: dict[int, Node] = {}  # first token -> child
        self.ends: list[int] = []  # calls whose input + output ends exactly here
        self.leaves: list[Node] = []  # the leaves at or below this node (filled by `TrajectoryTree.finish`)

    @property
    def trainable(self) -> int:
        """Sampled tokens in this node."""
        return sum(self.sampled)

    def path(self) -> list[Node]:
        """The nodes from the root's first child down to this one."""
        nodes: list[Node] = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]


class TrajectoryTree:
    """The prefix tree of one execution's calls (see the module)."""

    def __init__(self, records: Iterable[CallRecord] = ()) -> None:
        self.root = Node(None, 0)
        self.roles: list[Role] = []  # per call index
        self.call_ids: list[str] = []
        self._end_of: dict[str, Node] = {}
        self._finished = False
        for record in records:
            self.add(record)
        self.finish()

    def add(self, record: CallRecord) -> None:
        """Insert one call (records in call order: a parent before the calls that extend it)."""
        if self._finished:
            raise RuntimeError("the tree is finished; build a new one to add calls")
        index = len(self.call_ids)
        self.call_ids.append(record.call_id)
        self.roles.append(record.role)
        start = self.root
        if record.parent_call_id is not None:
            start = self._end_of.get(record.parent_call_id)  # type: ignore[assignment]
            if start is None:
                raise ValueError(
                    f"record {record.call_id} extends {record.parent_call_id}, not in this tree yet"
                )
            if start.depth + len(start.tokens) != record.prefix_len:
                raise ValueError(
                    f"record {record.call_id}: its parent ends at token {start.depth + len(start.tokens)}, "
                    f"it says {record.prefix_len}"
                )
        seq = [*record.new_input_ids, *record.output_ids]
        n_input = len(record.new_input_ids)
        end = self._insert(start, seq, n_input, record, record.token_versions(), index)
        end.ends.append(index)
        self._end_of[record.call_id] = end

    def _insert(
        self, node: Node, seq: list[int], n_input: int, record: CallRecord, versions: list[int], index: int
    ) -> Node:
        pos = 0
        while pos < len(seq):
            child = node.children.get(seq[pos])
            if child is None:
                return self._new_leaf(node, seq, pos, n_input, record, versions, index)
            k = 1
            limit = min(len(child.tokens), len(seq) - pos)
            while k < limit and child.tokens[k] == seq[pos + k]:
                k += 1
            for i in range(max(n_input - pos, 0), k):  # output tokens that run along existing ones
                if not child.sampled[i]:
                    j = pos + i - n_input
                    child.sampled[i] = True
                    child.logprobs[i] = record.output_logprobs[j]
                    child.versions[i] = versions[j]
            if k < len(child.tokens):
                child = _split(child, k)
            node, pos = child, pos + k
        return node

    def _new_leaf(
        self,
        parent: Node,
        seq: list[int],
        pos: int,
        n_input: int,
        record: CallRecord,
        versions: list[int],
        index: int,
    ) -> Node:
        leaf = Node(parent, parent.depth + len(parent.tokens))
        leaf.tokens = seq[pos:]
        n_context = max(n_input - pos, 0)
        n_out = len(seq) - pos - n_context
        first_out = len(record.output_ids) - n_out
        leaf.sampled = [False] * n_context + [True] * n_out
        leaf.logprobs = [0.0] * n_context + list(record.output_logprobs[first_out:])
        leaf.versions = [-1] * n_context + versions[first_out:]
        leaf.calls = [index] * len(leaf.tokens)
        parent.children[seq[pos]] = leaf
        return leaf

    def finish(self) -> None:
        """Index leaves under every node (selection needs it); adding calls afterwards is refused."""
        self._finished = True
        for each in self.nodes():
            each.leaves = []
        for leaf in self.leaves():
            node: Node | None = leaf
            while node is not None:
                node.leaves.append(leaf)
                node = node.parent

    # ---- reading ----------------------------------------------------------------------------------------------
    def nodes(self) -> list[Node]:
        """Every node but the root, parents before children."""
        out: list[Node] = []
        stack = list(self.root.children.values())[::-1]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(list(node.children.values())[::-1])
        return out

    def leaves(self) -> list[Node]:
        """Nodes without children, in depth-first order."""
        return [n for n in self.nodes() if not n.children]

    def leaf_role(self, leaf: Node) -> Role:
        """The highest-priority role among the calls that end at ``leaf``."""
        roles = {self.roles[i] for i in leaf.ends}
        return next(r for r in ROLE_PRIORITY if r in roles)

    @property
    def size(self) -> int:
        """Tokens stored (each shared prefix once)."""
        return sum(len(n.tokens) for n in self.nodes())

    @property
    def trainable(self) -> int:
        """Sampled tokens in the tree."""
        return sum(n.trainable for n in self.nodes())


def _split(node: Node, k: int) -> Node:
    """Cut ``node`` after ``k`` tokens: the head becomes a new node above it; returns the head."""
    head = Node(node.parent, node.depth)
    head.tokens, node.tokens = node.tokens[:k], node.tokens[k:]
    head.sampled, node.sampled = node.sampled[:k], node.sampled[k:]
    head.logprobs, node.logprobs = node.logprobs[:k], node.logprobs[k:]
    head.versions, node.versions = node.versions[:k], node.versions[k:]
    head.calls, node.calls = node.calls[:k], node.calls[k:]
    assert node.parent is not None  # the root is never split: it holds no tokens
    node.parent.children[head.tokens[0]] = head
    head.children = {node.tokens[0]: node}
    node.parent = head
    node.depth += k
    return head


def select_paths(tree: TrajectoryTree, jmax: int | None, rng: random.Random) -> list[Node]:
    """Choose at most ``jmax`` leaves (None: unbounded) whose paths cover what gets trained (DESIGN section 5).

    From the highest role class that still has a leaf with unmasked trainable tokens, pick a leaf with probability
    proportional to them; mask its whole path; repeat until nothing trainable is left or ``jmax`` are chosen.
    """
    if jmax is not None and jmax < 1:
        raise ValueError(f"jmax must be >= 1 or None, not {jmax}")
    unmasked = {id(leaf): sum(n.trainable for n in leaf.path()) for leaf in tree.leaves()}
    by_class: dict[Role, list[Node]] = {role: [] for role in ROLE_PRIORITY}
    for leaf in tree.leaves():
        by_class[tree.leaf_role(leaf)].append(leaf)
    masked: set[int] = set()
    chosen: list[Node] = []
    while jmax is None or len(chosen) < jmax:
        candidates: Sequence[Node] = ()
        for role in ROLE_PRIORITY:
            candidates = [leaf for leaf in by_class[role] if unmasked[id(leaf)] > 0]
            if candidates:
                break
        if not candidates:
            break
        leaf = rng.choices(candidates, weights=[unmasked[id(c)] for c in candidates])[0]
        chosen.append(leaf)
        for node in leaf.path():
            if id(node) in masked:
                continue
            masked.add(id(node))
            count = node.trainable
            if count:
                for below in node.leaves:
                    unmasked[id(below)] -= count
    return chosen
