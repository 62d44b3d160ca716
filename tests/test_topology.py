"""Topology structures (no processes): the pairwise tree, T1/T2, the leakage check."""

import pytest

from vfltorch.comm import (are_totally_different, masked_sum_leakage, pairwise_tree,
                           totally_different_trees)


def test_pairwise_tree_pairs_leaves_then_climbs():
    t = pairwise_tree([0, 1, 2, 3, 4])
    assert t.root == 0
    assert t.rounds == (((1, 0), (3, 2)), ((2, 0),), ((4, 0),))
    assert set(t.subtrees) == {frozenset({0, 1}), frozenset({2, 3}), frozenset({0, 1, 2, 3}),
                               frozenset({0, 1, 2, 3, 4})}


@pytest.mark.parametrize("q", range(2, 17))
def test_totally_different_for_every_kept_party(q):
    parties = list(range(q))
    for keep in parties:
        t1, t2 = totally_different_trees(parties, keep)
        assert t1.members == frozenset(parties)
        assert t2 is None or t2.members == frozenset(parties) - {keep}
        assert are_totally_different(t1, t2)
        # Beyond the definition: no party can combine what it receives into others' raw values,
        # whichever party receives the result (unless it is the kept party, which knows its own mask).
        for out in parties:
            leak = masked_sum_leakage(t1, t2, keep, out)
            assert all(v == 0 for p, v in leak.items() if p != keep), (q, keep, out, leak)


def test_checker_rejects_trees_that_share_a_subtree():
    t1 = pairwise_tree([0, 1, 2])
    t2 = pairwise_tree([0, 1])          # T2 over {0, 1} repeats T1's subtree {0, 1}
    assert not are_totally_different(t1, t2)
    # ... and the leakage check sees that party 0 learns party 1's raw value.
    assert masked_sum_leakage(t1, t2, keep=2, out=2)[0] == 1


def test_tree_rejects_repeated_parties():
    with pytest.raises(ValueError, match="distinct"):
        pairwise_tree([0, 1, 1])
