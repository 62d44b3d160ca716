"""Sums over the federation along a topology, built on point-to-point messages.

This is the one reduction routine of vfltorch: every algorithm that needs a
sum of per-party parts calls ``reduce`` / ``broadcast`` / ``allreduce`` here.

Each party calls the same function with its own part (SPMD). Every party
knows the shape and dtype of what is being summed, so messages carry no
headers. ``add`` is the group operation: ordinary addition by default,
addition mod 2*pi for phase-masked values, wrap-around int64 addition for
fixed-point ring values (``masking.py``).
"""

from __future__ import annotations

import torch

from .federation import Federation
from .topology import Ring, Star, Tree, build


def _plus(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def reduce(fed: Federation, tensor: torch.Tensor, topology, *, add=_plus) -> torch.Tensor | None:
    """Sum ``tensor`` over the parties of ``topology``; the root gets the total, the others ``None``.

    Parties outside the topology return ``tensor`` untouched and send nothing.
    """
    if fed.rank not in topology.order:
        return tensor
    if len(topology.order) == 1:
        return tensor
    if isinstance(topology, Tree):
        return _tree_reduce(fed, tensor, topology, add)
    if isinstance(topology, Star):
        return _star_reduce(fed, tensor, topology, add)
    if isinstance(topology, Ring):
        total = _ring_allreduce(fed, tensor, topology, add)
        return total if fed.rank == topology.root else None
    raise TypeError(f"not a topology: {topology!r}")


def broadcast(fed: Federation, tensor: torch.Tensor | None, topology, *, shape=None,
              dtype=None, device=None) -> torch.Tensor:
    """The root's ``tensor`` to every party of ``topology`` (tree: the reverse order of the reduction).

    Non-root parties pass ``tensor=None`` together with ``shape`` and ``dtype``,
    or a tensor of the right shape and dtype whose values are ignored.
    ``device``: where every rank gets the result (default: a receiver its party's device, the root its own
    tensor as it is); ``"cpu"`` for host-side protocol arithmetic.
    """
    if device is not None:
        out = broadcast(fed, tensor, topology, shape=shape, dtype=dtype)
        return None if out is None else out.to(device)
    if fed.rank not in topology.order or len(topology.order) == 1:
        return tensor
    if tensor is not None:
        shape, dtype = tensor.shape, tensor.dtype
    if shape is None or dtype is None:
        raise ValueError("broadcast needs the shape and dtype on the receiving parties")
    if isinstance(topology, Tree):
        value = tensor if fed.rank == topology.root else None
        for edges in reversed(topology.rounds):
            for child, parent in edges:
                if fed.rank == parent:
                    fed.send(value, child)
                elif fed.rank == child:
                    value = fed.recv(parent, shape, dtype)
        return value
    if isinstance(topology, (Star, Ring)):
        # A ring broadcasts around the cycle; a star from its centre.
        if isinstance(topology, Ring):
            if fed.rank != topology.root:
                tensor = fed.recv(topology.prev(fed.rank), shape, dtype)
            if topology.next(fed.rank) != topology.root:
                fed.send(tensor, topology.next(fed.rank))
            return tensor
        if fed.rank == topology.center:
            for p in topology.order:
                if p != topology.center:
                    fed.send(tensor, p)
            return tensor
        return fed.recv(topology.center, shape, dtype)
    raise TypeError(f"not a topology: {topology!r}")


def allreduce(fed: Federation, tensor: torch.Tensor, topology="tree", *, add=_plus,
              parties=None) -> torch.Tensor:
    """Every party of the topology gets the total.

    ``topology`` is a structure or a name ('tree', 'star', 'ring') built over
    ``parties`` (default: the data parties). Tree and star reduce to the root
    and broadcast back; the ring runs the bandwidth-optimal reduce-scatter /
    all-gather, where each party sends 2 (Q - 1) / Q of the tensor in total.
    """
    if isinstance(topology, str):
        topology = build(topology, fed.parties if parties is None else parties)
    if fed.rank not in topology.order or len(topology.order) == 1:
        return tensor
    if isinstance(topology, Ring):
        return _ring_allreduce(fed, tensor, topology, add)
    total = reduce(fed, tensor, topology, add=add)
    return broadcast(fed, total, topology, shape=tensor.shape, dtype=tensor.dtype)


def _tree_reduce(fed, tensor, tree: Tree, add):
    value = tensor
    for edges in tree.rounds:
        for child, parent in edges:
            if fed.rank == child:
                fed.send(value, parent)
                return None  # a child's part has climbed; it takes no further part
            if fed.rank == parent:
                value = add(value, fed.recv(child, tensor.shape, tensor.dtype, device=tensor.device))
    return value


def _star_reduce(fed, tensor, s: Star, add):
    if fed.rank != s.center:
        fed.send(tensor, s.center)
        return None
    value = tensor
    for p in s.order:
        if p != s.center:
            value = add(value, fed.recv(p, tensor.shape, tensor.dtype, device=tensor.device))
    return value


def _ring_allreduce(fed, tensor, r: Ring, add):
    q = len(r.order)
    me = r.order.index(fed.rank)
    flat = tensor.reshape(-1).clone()
    chunks = list(torch.tensor_split(flat, q))
    nxt, prv = r.next(fed.rank), r.prev(fed.rank)
    # Reduce-scatter: after q - 1 steps, party i holds the total of chunk (i + 1) mod q.
    for step in range(q - 1):
        send_i, recv_i = (me - step) % q, (me - step - 1) % q
        got = fed.sendrecv(chunks[send_i], nxt, prv, shape=chunks[recv_i].shape)
        chunks[recv_i] = add(chunks[recv_i], got.to(tensor.device))
    # All-gather: pass the finished chunks around the ring.
    for step in range(q - 1):
        send_i, recv_i = (me + 1 - step) % q, (me - step) % q
        chunks[recv_i] = fed.sendrecv(chunks[send_i], nxt, prv, shape=chunks[recv_i].shape).to(tensor.device)
    return torch.cat(chunks).reshape(tensor.shape)
