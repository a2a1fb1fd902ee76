"""epoch_batches: every rank's share of every global batch; one process is the plain split."""

from __future__ import annotations

import pytest
import torch

from looptune.data.order import (
    EpochBatchSampler,
    EpochSampler,
    epoch_batches,
    epoch_permutation,
    rank_num_batches,
    rank_samples_per_epoch,
)
from looptune.recipe import LoaderConfig


def test_one_process_is_the_permutation_split():
    perm = epoch_permutation(100, seed=3, epoch=2)
    got = epoch_batches(100, 16, seed=3, epoch=2, drop_last=False)
    assert [b.tolist() for b in got] == [b.tolist() for b in perm.split(16)]
    assert len(epoch_batches(100, 16, seed=3, epoch=2, drop_last=True)) == 6


@pytest.mark.parametrize("n, b, world, drop_last", [(1000, 32, 2, False), (1000, 32, 2, True),
                                                   (1001, 8, 3, False), (97, 10, 4, True),
                                                   (5, 4, 4, False), (1, 2, 4, False),
                                                   (2, 1, 8, False)])
def test_ranks_together_are_the_single_process_epoch(n, b, world, drop_last):
    ranks = [epoch_batches(n, b, seed=1, epoch=4, drop_last=drop_last, rank=r, world=world)
             for r in range(world)]
    counts = {len(r) for r in ranks}
    assert counts == {rank_num_batches(n, b, drop_last, world)}  # same step count on every rank
    single = epoch_batches(n + (-n % world if not drop_last else 0), b * world, seed=1, epoch=4,
                           drop_last=drop_last)
    perm = epoch_permutation(n, seed=1, epoch=4)
    for step in range(len(ranks[0])):
        parts = [r[step] for r in ranks]
        assert len({len(p) for p in parts}) == 1  # equal shares: DDP's mean is the global mean
        union = torch.cat(parts)
        if drop_last or n % world == 0:
            assert union.tolist() == perm[step * b * world:(step + 1) * b * world].tolist()
        assert len(union) == len(single[step])
    if not drop_last:
        seen = torch.cat([torch.cat(r) for r in ranks])
        assert set(seen.tolist()) == set(range(n))  # every sample, padding repeats the first few
    per_rank = sum(len(x) for x in ranks[0])
    cfg = LoaderConfig(batch_size=b, drop_last=drop_last)
    assert per_rank == rank_samples_per_epoch(n, cfg, world)


def test_samplers_are_distributed_samplers_with_set_epoch_and_skip():
    s = EpochSampler(n=100, seed=0, batch_size=10, drop_last=False, rank=1, world=2)
    assert isinstance(s, torch.utils.data.DistributedSampler)
    assert (s.num_replicas, s.rank) == (2, 1)
    s.set_epoch(3)
    full = list(s)
    assert full == torch.cat(epoch_batches(100, 10, seed=0, epoch=3, drop_last=False, rank=1,
                                           world=2)).tolist()
    s.set_epoch(3, skip=10)
    assert list(s) == full[10:] and len(full) == 50
    bs = EpochBatchSampler(n=100, seed=0, batch_size=10, drop_last=False, rank=0, world=2)
    bs.set_epoch(3, skip=1)
    assert len(bs) == 5 and len(list(bs)) == 4
