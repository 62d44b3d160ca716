"""Sums over real gloo processes: tree, star and ring equal torch.sum; masked sums equal plain sums."""

import math

import pytest
import torch

from vfltorch.comm import (Federation, FixedPoint, MaskStream, PhaseGroup, RingGroup, Transcript, allreduce, broadcast,
                           launch, masked_sum, pairwise_tree, reduce, secure_allreduce, secure_sum, star)

SHAPES = [(1,), (7,), (3, 5), (2, 3, 4), (1000,)]
DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32]


def part(rank, shape, dtype):
    g = torch.Generator().manual_seed(1000 + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=g).to(dtype)


def sums_job(fed, qs):
    """For each q in ``qs``: sums over the first q ranks (the others sit out), all shapes and dtypes."""
    out = {}
    for q in qs:
        parties = list(range(q))
        if fed.rank not in parties:
            continue
        for shape in SHAPES:
            for dtype in DTYPES:
                x = part(fed.rank, shape, dtype)
                for topo in ("tree", "star", "ring"):
                    out[(q, shape, dtype, topo)] = allreduce(fed, x, topo, parties=parties)
                # reduce alone: only the root holds the total
                out[(q, shape, dtype, "reduce-root")] = reduce(fed, x, pairwise_tree(parties[::-1]))
                s = star(parties, center=parties[-1])
                out[(q, shape, dtype, "bcast")] = broadcast(fed, x if fed.rank == s.center else None, s,
                                                            shape=x.shape, dtype=x.dtype)
    return out


def check_sums(results, q):
    for shape in SHAPES:
        for dtype in DTYPES:
            expected = torch.stack([part(r, shape, dtype) for r in range(q)]).sum(0)
            tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
            for r in range(q):
                for topo in ("tree", "star", "ring"):
                    got = results[r][(q, shape, dtype, topo)]
                    assert got.dtype == dtype and got.shape == torch.Size(shape)
                    if dtype.is_floating_point:
                        torch.testing.assert_close(got, expected, **tol)
                    else:
                        assert torch.equal(got, expected), (q, shape, dtype, topo)
                assert torch.equal(results[r][(q, shape, dtype, "bcast")], part(q - 1, shape, dtype))
            root_total = results[q - 1][(q, shape, dtype, "reduce-root")]
            if dtype.is_floating_point:
                torch.testing.assert_close(root_total, expected, **tol)
            else:
                assert torch.equal(root_total, expected)
            for r in range(q - 1):
                assert results[r][(q, shape, dtype, "reduce-root")] is None


def test_topology_sums_equal_torch_sum_q1_to_8():
    # One federation of 8 processes; each q = 1..8 sums over its first q ranks (the same code path
    # as a federation of q parties, without paying 36 process start-ups).
    results = launch(sums_job, 8, args=(range(1, 9),))
    for q in range(1, 9):
        check_sums(results, q)


@pytest.mark.parametrize("q", [1, 3])
def test_topology_sums_in_a_federation_of_exactly_q(q):
    check_sums(launch(sums_job, q, args=([q],)), q)


def masked_job(fed, keep, out):
    x = part(fed.rank, (50,), torch.float64)
    phase = masked_sum(fed, PhaseGroup.reduce(x), keep=keep, out=out, stream=MaskStream(7, fed.rank))
    exact = secure_sum(fed, x * 1e6, out=out, stream=MaskStream(8, fed.rank))
    # The kept party's own mask, regenerated from its stream, to check the phase result.
    my_mask = MaskStream(7, fed.rank).draw(PhaseGroup(), (50,))
    return phase, exact, my_mask, fed.transcript.messages if fed.transcript else []


@pytest.mark.parametrize("q,keep,out", [(1, 0, 0), (2, 1, 0), (3, 0, 2), (4, 2, 0), (5, 4, 4)])
def test_masked_sums_equal_plain_sums(q, keep, out):
    results = launch(masked_job, q, args=(keep, out), record_transcript=True)
    total = torch.stack([part(r, (50,), torch.float64) for r in range(q)]).sum(0)
    phase, exact, _, _ = results[out]
    # Phase masks: the result is sum + b_keep (mod 2 pi).
    expected_phase = torch.remainder(total + results[keep][2], 2 * math.pi)
    diff = torch.remainder(phase - expected_phase + math.pi, 2 * math.pi) - math.pi
    assert diff.abs().max() < 1e-9
    # Ring masks with reveal: the exact sum.
    torch.testing.assert_close(exact, total * 1e6, rtol=1e-12, atol=1e-6)
    for r in range(q):
        if r != out:
            assert results[r][0] is None and results[r][1] is None
    # No party sent its raw part or its part's phase without a mask.
    for r in range(q):
        raw = part(r, (50,), torch.float64)
        for m in results[r][3]:
            t = m.tensor.to(torch.float64).reshape(-1)
            if t.numel() == 50:
                assert not torch.allclose(t, raw) and not torch.allclose(t, PhaseGroup.reduce(raw))


def allreduce_job(fed):
    x = part(fed.rank, (40,), torch.float64) * 1e3
    total = secure_allreduce(fed, x)                  # default: private masks from the OS
    sent = [m.tensor.clone() for m in fed.transcript.messages] if fed.transcript else []
    return total, sent


def test_secure_allreduce_is_exact_everywhere_and_its_masks_are_private():
    runs = [launch(allreduce_job, 3, record_transcript=True) for _ in range(2)]
    expected = torch.stack([part(r, (40,), torch.float64) * 1e3 for r in range(3)]).sum(0)
    for results in runs:
        for total, _ in results:
            torch.testing.assert_close(total, expected, rtol=1e-12, atol=1e-9)
    # Same data, same result, but fresh masks: the masked messages of party 1 differ between the two runs
    # (a stream seeded from a public seed would repeat them, and the receiver could remove them).
    first, second = runs[0][1][1], runs[1][1][1]
    masked = [(a, b) for a, b in zip(first, second) if a.dtype == torch.int64 and a.numel() == 40]
    assert masked and all(not torch.equal(a, b) for a, b in masked)


def test_ring_masks_are_uniform_words():
    words = MaskStream(0, 0).draw(RingGroup(), (200_000,))
    # Each of the 64 bits is a fair coin (a broken combination of halves would bias the high bits).
    bits = torch.stack([(words >> k) & 1 for k in range(64)]).double().mean(1)
    assert (bits - 0.5).abs().max() < 0.01
    assert (words < 0).double().mean().sub(0.5).abs() < 0.01


def test_phase_masked_values_are_uniform():
    # A fixed value plus a fresh phase mask, reduced mod 2 pi, is uniform on [0, 2 pi): KS test.
    from scipy.stats import kstest

    stream = MaskStream(3, 0)
    masked = PhaseGroup().add(torch.full((20_000,), 1.234), stream.draw(PhaseGroup(), (20_000,)))
    assert kstest(masked.numpy() / (2 * math.pi), "uniform").pvalue > 1e-3


def test_fixed_point_overflow_raises():
    fp = FixedPoint(frac_bits=40, summands=4)
    with pytest.raises(OverflowError, match="fixed-point overflow"):
        fp.encode(torch.tensor([2.0 ** 22]))
    assert torch.equal(fp.decode(fp.encode(torch.tensor([-1.5, 0.0, 3.25]))), torch.tensor([-1.5, 0.0, 3.25],
                                                                                            dtype=torch.float64))


def meter_job(fed):
    with fed.phase("a"):
        allreduce(fed, torch.zeros(10, dtype=torch.float64), "star")
    return fed.meter.as_dict()


def test_meter_counts_bytes_per_phase():
    m = launch(meter_job, 3)
    # star all-reduce of 80 bytes: each leaf sends 80 and receives 80; the centre the reverse, twice.
    assert m[1]["a"] == {"bytes_sent": 80, "bytes_received": 80, "messages_sent": 1, "messages_received": 1}
    assert m[0]["a"] == {"bytes_sent": 160, "bytes_received": 160, "messages_sent": 2, "messages_received": 2}


def frame_job(fed):
    if fed.rank == 0:
        fed.send_tensor(torch.arange(12, dtype=torch.int32).reshape(3, 4), 1)
        fed.send_json({"a": [1, 2]}, 1)
        return None
    return fed.recv_tensor(0), fed.recv_json(0)


def test_framed_messages_carry_shape_and_dtype():
    _, (t, obj) = launch(frame_job, 2)
    assert t.dtype == torch.int32 and t.shape == (3, 4) and int(t[2, 3]) == 11
    assert obj == {"a": [1, 2]}


def posted_job(fed):
    """Rank 1 posts two receives ahead, takes them in order, then one it did not post; then a mismatch."""
    if fed.rank == 0:
        fed.send(torch.arange(3, dtype=torch.int32), 1)
        fed.send(torch.full((2, 2), 2.5, dtype=torch.float64), 1)
        fed.send(torch.tensor([7], dtype=torch.int64), 1)
        fed.send(torch.arange(3, dtype=torch.int32), 1)
        return None
    fed.post_recv(0, (3,), torch.int32)
    fed.post_recv(0, (2, 2), torch.float64)
    with fed.phase("p"):
        a = fed.recv(0, (3,), torch.int32)
        b = fed.recv(0, (2, 2), torch.float64)
        c = fed.recv(0, (1,), torch.int64)
    fed.post_recv(0, (3,), torch.int32)
    try:
        fed.recv(0, (4,), torch.int32)
        error = None
    except RuntimeError as exc:
        error = str(exc)
    return a.tolist(), b.tolist(), c.tolist(), fed.meter.as_dict()["p"], error


def test_posted_receives_are_taken_in_order_and_checked():
    """``Federation.post_recv``: the same tensors and meter counts as plain receives; a receive that asks for
    another shape than the one posted is a protocol error, raised (never a silent mix-up)."""
    _, (a, b, c, meter, error) = launch(posted_job, 2)
    assert a == [0, 1, 2] and b == [[2.5, 2.5], [2.5, 2.5]] and c == [7]
    assert meter["messages_received"] == 3 and meter["bytes_received"] == 12 + 32 + 8
    assert error is not None and "posted for (3,)" in error and "protocol error" in error


def test_posting_is_a_no_op_without_gloo():
    fed = Federation.local()
    fed.post_recv(0, (3,), torch.int32)          # (a single party: nothing to post, nothing raised)
    assert fed._posted == {}
