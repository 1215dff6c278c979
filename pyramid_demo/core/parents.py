"""The one walker of parent lists: a proposal is a tree, a chain is the tree with parent i − 1.

Node i's parent is `parents[i]` (−1: the root, the last committed token), nodes in breadth-first order.
Context c is where a distribution is read: c = 0 the root, c = i + 1 node i. Pure functions over plain
lists (no torch): the engine's `Tree`, the costs, the inspector and the drawing all walk through here.
"""
from __future__ import annotations


def chain(n: int) -> list[int]:
    """A chain of n proposed tokens as a parent list: [−1, 0, 1, …, n − 2]."""
    return list(range(-1, n - 1))


def depths(parents: list[int]) -> list[int]:
    """Each node's depth (the root's children are at depth 1): its position along a path."""
    d: list[int] = []
    for p in parents:
        d.append(1 if p < 0 else d[p] + 1)
    return d


def children(parents: list[int]) -> list[list[int]]:
    """Per context c (0 the root, i + 1 node i): its children's node indices, in ranked (record) order."""
    out: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        out[p + 1].append(i)
    return out


def path(parents: list[int], i: int) -> list[int]:
    """Node indices from the root's child down to node i (empty for i = −1, the root)."""
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


def context_of(parents: list[int], i: int) -> int:
    """The context node i was proposed at, where its distributions are read: its parent's (0 the root)."""
    return parents[i] + 1


def is_chain(parents: list[int]) -> bool:
    """Whether every node's parent is the node before it."""
    return parents == chain(len(parents))
