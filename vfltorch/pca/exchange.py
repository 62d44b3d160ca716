"""Who sends local eigenvectors to whom: the server-client topology and the decentralised graphs.

What travels is a party's *payload*: its k local eigenvectors in sample space
(n x k) and their k eigenvalues, packed as one float64 vector of n k + k
numbers. Nothing else about a party's columns leaves it.

* ``server`` (Algorithm 2): every client sends its payload to the server (the
  coordinator rank, which holds no data); the server merges and sends the
  merged n x k block back over a star centred on itself.
* ``complete``, ``ring``, ``star`` (Algorithm 5, fully decentralised): each
  client sends its payload to its neighbours in the graph and merges what it
  has. The ring and the star are the comm package's structures
  (``vfltorch.comm.ring`` / ``star``: neighbours are the ring's previous and
  next party, the star's centre is its first party); the complete graph is
  every pair, scheduled as Q - 1 shifts so that no pair waits on another.

With ``coefficients=True`` (VFedAKPCA) each client also gets its own k x k block C_i of the merge
(U = sum_i a_i C_i, ``merge.merge_with_coefficients``): in the server topology the server sends it
to that client alone, after the merged block; a decentralised client computes it in its own merge.
"""

from __future__ import annotations

import torch

from ..comm import Federation, broadcast, ring, star
from .merge import merge_with_coefficients

TOPOLOGIES = ("server", "complete", "ring", "star")
GRAPHS = ("complete", "ring", "star")


def check_topology(topology: str) -> str:
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}: choose one of {', '.join(TOPOLOGIES)}")
    return topology


def neighbours(graph: str, parties, rank: int) -> list[int]:
    """The neighbours of ``rank`` (itself excluded) in a decentralised graph over ``parties``."""
    parties = [int(p) for p in parties]
    if rank not in parties or len(parties) == 1:
        return []
    if graph == "complete":
        return [p for p in parties if p != rank]
    if graph == "ring":
        r = ring(parties)
        return sorted({r.prev(rank), r.next(rank)})
    if graph == "star":
        s = star(parties)
        return [p for p in parties if p != s.center] if rank == s.center else [s.center]
    raise ValueError(f"unknown decentralised graph {graph!r}: choose one of {', '.join(GRAPHS)}")


def pack(vectors: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """(n x k eigenvectors, k eigenvalues) -> one float64 vector of n k + k numbers."""
    return torch.cat([vectors.reshape(-1), values.reshape(-1)]).to(torch.float64)


def unpack(payload: torch.Tensor, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return payload[: n * k].reshape(n, k), payload[n * k:]


def gather_at_server(fed: Federation, payload: torch.Tensor | None, parties, size: int) -> list[torch.Tensor] | None:
    """Algorithm 2, upload: each client's payload to the server; the server gets them in party order."""
    if fed.is_coordinator:
        return [fed.recv(p, (size,), torch.float64) for p in parties]
    if fed.rank in parties:
        fed.send(payload, fed.coordinator)
    return None


def broadcast_from_server(fed: Federation, merged: torch.Tensor | None, parties, shape) -> torch.Tensor | None:
    """Algorithm 2, download: the server's merged block to every client (a star centred on the server)."""
    if not (fed.is_coordinator or fed.rank in parties):
        return None
    hub = star([fed.coordinator, *parties], center=fed.coordinator)
    return broadcast(fed, merged, hub, shape=shape, dtype=torch.float64)


def coefficients_from_server(fed: Federation, C: torch.Tensor | None, parties, k: int) -> torch.Tensor | None:
    """After the download: each client's own k x k block of the merge's coefficients, to that client only."""
    if fed.is_coordinator:
        for i, p in enumerate(parties):
            fed.send(C[i].to(torch.float64).contiguous(), p)
        return None
    if fed.rank in parties:
        return fed.recv(fed.coordinator, (k, k), torch.float64)
    return None


def exchange_with_neighbours(fed: Federation, payload: torch.Tensor, graph: str, parties) -> dict[int, torch.Tensor]:
    """Algorithm 5: send ``payload`` to every neighbour, return the neighbours' payloads by rank."""
    parties = [int(p) for p in parties]
    if fed.rank not in parties or len(parties) == 1:
        return {}
    me, m = parties.index(fed.rank), len(parties)
    if graph == "complete":
        got = {}
        for shift in range(1, m):
            dst, src = parties[(me + shift) % m], parties[(me - shift) % m]
            got[src] = fed.sendrecv(payload, dst, src)
        return got
    if graph == "ring":
        r = ring(parties)
        if m == 2:
            other = r.next(fed.rank)
            return {other: fed.sendrecv(payload, other, other)}
        from_prev = fed.sendrecv(payload, r.next(fed.rank), r.prev(fed.rank))
        from_next = fed.sendrecv(payload, r.prev(fed.rank), r.next(fed.rank))
        return {r.prev(fed.rank): from_prev, r.next(fed.rank): from_next}
    if graph == "star":
        s = star(parties)
        if fed.rank == s.center:
            got = {p: fed.recv(p, payload.shape, payload.dtype) for p in parties if p != s.center}
        else:
            fed.send(payload, s.center)
            got = {}
        centre_payload = broadcast(fed, payload if fed.rank == s.center else None, s, shape=payload.shape,
                                   dtype=payload.dtype)
        if fed.rank != s.center:
            got[s.center] = centre_payload
        return got
    raise ValueError(f"unknown decentralised graph {graph!r}: choose one of {', '.join(GRAPHS)}")


def merge_round(fed: Federation, parties, topology: str, vectors: torch.Tensor | None, values: torch.Tensor | None,
                n: int, k: int, *, weight_scaling: bool = False, include_self: bool = True,
                power: float = 1.0, mode: str = "subspace", reference: torch.Tensor | None = None,
                device=None, coefficients: bool = False):
    """One communication period: move the local eigenpairs, merge, return this party's merged n x k block.

    ``server``: the server merges every client's pair (Algorithm 2, with
    Algorithm 4's weights if ``weight_scaling``) and every client receives
    the same block. Decentralised graphs: each client merges its own pair (if
    ``include_self``) and its neighbours' (Algorithm 5). A federation of one
    party, with no server, merges its own pair: the centralised algorithm.
    ``mode`` and ``reference`` go to ``merge`` (sign-free subspace merge by default,
    oriented towards ``reference``, which every member must hold identically).
    ``coefficients=True``: returns (U, C_own), C_own this client's k x k block of the merge
    (None at the server, and where the client's own pair was not merged).
    """
    how = dict(weight_scaling=weight_scaling, power=power, mode=mode, reference=reference)
    device = fed.device if device is None else device
    parties = list(parties)
    result = (lambda U, C=None: (U, C)) if coefficients else (lambda U, C=None: U)
    if topology == "server":
        if fed.world_size == 1 or fed.coordinator is None:
            if len(parties) != 1:
                raise ValueError("the server-client topology needs a coordinator rank")
            U, C = merge_with_coefficients(vectors[None], values[None], **how)
            return result(U, C[0])
        size = n * k + k
        gathered = gather_at_server(fed, pack(vectors, values) if fed.rank in parties else None, parties, size)
        merged = C = None
        if fed.is_coordinator:
            pairs = [unpack(p.to(device), n, k) for p in gathered]
            merged, C = merge_with_coefficients(torch.stack([a for a, _ in pairs]), torch.stack([v for _, v in pairs]),
                                                **how)
        out = broadcast_from_server(fed, merged, parties, (n, k))
        own = coefficients_from_server(fed, C, parties, k) if coefficients else None
        return result(None if out is None else out.to(device), None if own is None else own.to(device))
    if fed.rank not in parties:
        return result(None)
    got = exchange_with_neighbours(fed, pack(vectors, values), topology, parties)
    members = ([(fed.rank, (vectors, values))] if include_self or not got else [])
    members += [(r, unpack(p.to(device), n, k)) for r, p in sorted(got.items())]
    members.sort(key=lambda m: m[0])
    U, C = merge_with_coefficients(torch.stack([a for _, (a, _) in members]),
                                   torch.stack([v for _, (_, v) in members]), **how)
    ranks = [r for r, _ in members]
    return result(U, C[ranks.index(fed.rank)] if fed.rank in ranks else None)
