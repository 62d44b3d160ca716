"""Communication structures: the FDSKL pairwise tree, star, ring, and totally different trees.

All structures are schedules of point-to-point messages, so the papers'
shapes are what actually runs (see ``reduce.py``).

The pairwise tree (Gu et al., FDSKL, Section 3 and Figure 2): the leaves, in
the given order, pair up (0-1, 2-3, ...); the first of each pair holds the
partial sum and pairs again with the next group at the level above, until one
party, the root, holds the total. A leftover group at an odd level passes up
unchanged. Broadcasting walks the same edges in reverse order.

Two trees are *totally different* (FDSKL, Definition 2) when no subtree with
more than one leaf has the same leaf set in both. FDSKL's Algorithm 3 sums
masked values over T1 and the masks of every party but one, l', over T2; the
property means no party can subtract a T2 partial sum of masks from a T1
partial sum of masked values and see unmasked data of a group of parties.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Tree:
    """A reduction tree: ``rounds[k]`` lists the (child, parent) messages of level k, bottom up."""

    order: tuple[int, ...]
    rounds: tuple[tuple[tuple[int, int], ...], ...]
    subtrees: tuple[frozenset, ...] = field(default=())  # leaf sets of internal nodes (>= 2 leaves)

    @property
    def root(self) -> int:
        return self.order[0]

    @property
    def members(self) -> frozenset:
        return frozenset(self.order)

    def received_sets(self, party: int) -> list[frozenset]:
        """Leaf sets whose partial sum ``party`` receives while reducing over this tree."""
        groups = {p: frozenset([p]) for p in self.order}
        seen = []
        for edges in self.rounds:
            for child, parent in edges:
                if parent == party:
                    seen.append(groups[child])
                groups[parent] = groups[parent] | groups[child]
        return seen


def pairwise_tree(order) -> Tree:
    """The FDSKL tree over ``order`` (its first element is the root)."""
    order = tuple(int(p) for p in order)
    if len(set(order)) != len(order):
        raise ValueError(f"a tree's leaves must be distinct, got {order}")
    if not order:
        raise ValueError("a tree needs at least one party")
    groups = [[p] for p in order]
    rounds, subtrees = [], []
    while len(groups) > 1:
        edges, merged = [], []
        for i in range(0, len(groups), 2):
            if i + 1 < len(groups):
                left, right = groups[i], groups[i + 1]
                edges.append((right[0], left[0]))
                merged.append(left + right)
                subtrees.append(frozenset(left + right))
            else:
                merged.append(groups[i])
        rounds.append(tuple(edges))
        groups = merged
    return Tree(order, tuple(rounds), tuple(subtrees))


@dataclass(frozen=True)
class Star:
    """Every leaf talks to the centre directly: one round, Q - 1 messages into one party."""

    order: tuple[int, ...]
    center: int

    @property
    def root(self) -> int:
        return self.center


def star(order, center: int | None = None) -> Star:
    order = tuple(int(p) for p in order)
    center = order[0] if center is None else int(center)
    if center not in order:
        raise ValueError(f"the centre {center} of a star must be one of its parties {order}")
    return Star(order, center)


@dataclass(frozen=True)
class Ring:
    """Parties in a cycle; each talks only to its two neighbours (ring all-reduce)."""

    order: tuple[int, ...]

    @property
    def root(self) -> int:
        return self.order[0]

    def next(self, party: int) -> int:
        i = self.order.index(party)
        return self.order[(i + 1) % len(self.order)]

    def prev(self, party: int) -> int:
        i = self.order.index(party)
        return self.order[(i - 1) % len(self.order)]


def ring(order) -> Ring:
    order = tuple(int(p) for p in order)
    if len(set(order)) != len(order) or not order:
        raise ValueError(f"a ring needs distinct parties, got {order}")
    return Ring(order)


def build(kind: str, order, root: int | None = None):
    """A topology by name: 'tree', 'star' or 'ring' (the root goes first where it matters)."""
    order = list(order)
    if root is not None:
        order.remove(root)
        order.insert(0, root)
    if kind == "tree":
        return pairwise_tree(order)
    if kind == "star":
        return star(order)
    if kind == "ring":
        return ring(order)
    raise ValueError(f"unknown topology {kind!r}: choose 'tree', 'star' or 'ring'")


# --------------------------------------------------------------- T1 and T2
def totally_different_trees(parties, keep: int) -> tuple[Tree, Tree]:
    """Trees T1 over ``parties`` and T2 over ``parties`` minus ``keep`` that are totally different.

    Construction: T1 is the pairwise tree over ``[keep] + others`` and T2 the
    pairwise tree over ``others`` in the same order. Every internal node of a
    pairwise tree covers a run of positions that starts at a multiple of 2**k
    (k >= 1), so an even position of T1's order. Each run of T2 starts at an
    even position of ``others``, which is an *odd* position of T1's order. Two
    runs with different starts are different sets, so no subtree is shared.
    It also keeps any party from receiving the same single party's masked value
    in T1 and its mask in T2 (``masked_sum_leakage`` checks both).
    """
    parties = [int(p) for p in parties]
    if keep not in parties:
        raise ValueError(f"the kept party {keep} must be one of {parties}")
    others = [p for p in parties if p != keep]
    t1 = pairwise_tree([keep] + others)
    t2 = pairwise_tree(others) if others else None
    return t1, t2


def are_totally_different(t1: Tree, t2: Tree | None) -> bool:
    """FDSKL's Definition 2: no common subtree with more than one leaf."""
    if t2 is None:
        return True
    return not (set(t1.subtrees) & set(t2.subtrees))


def masked_sum_leakage(t1: Tree, t2: Tree | None, keep: int, out: int) -> dict[int, int]:
    """For each party, how many independent linear combinations of *other* parties' raw values it
    can compute from what it receives in a masked sum (T1 masked values, T2 masks, the output).

    A party sees sums of masked values z_S + b_S (T1) and sums of masks b_T (T2);
    combining them reveals raw values only where a combination of T1 sets equals
    a combination of T2 sets outside its own coordinates. The count is
    dim(span T1 ∩ span T2), taken over the other parties' coordinates. The
    output party ``out`` is expected to learn one combination (the result)
    when it is ``keep`` itself; everyone else should learn 0.
    """
    parties = sorted(t1.members)
    index = {p: i for i, p in enumerate(parties)}
    leak = {}
    for p in parties:
        a_sets = list(t1.received_sets(p))
        b_sets = list(t2.received_sets(p)) if t2 is not None else []
        if p == out:
            a_sets.append(t1.members)                          # the masked total
            if t2 is not None:
                b_sets.append(t2.members)                      # the sum of all masks but keep's
        keep_cols = [index[q] for q in parties if q != p]
        rows_a = _indicators(a_sets, index, len(parties))[:, keep_cols]
        rows_b = _indicators(b_sets, index, len(parties))[:, keep_cols]
        leak[p] = _intersection_dim(rows_a, rows_b)
    return leak


def _indicators(sets, index, n) -> np.ndarray:
    m = np.zeros((len(sets), n))
    for i, s in enumerate(sets):
        for q in s:
            m[i, index[q]] = 1.0
    return m


def _intersection_dim(a: np.ndarray, b: np.ndarray) -> int:
    ra = np.linalg.matrix_rank(a) if a.size else 0
    rb = np.linalg.matrix_rank(b) if b.size else 0
    both = np.vstack([a, b]) if a.size and b.size else (a if a.size else b)
    rab = np.linalg.matrix_rank(both) if both.size else 0
    return int(ra + rb - rab)
