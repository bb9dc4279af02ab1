"""DDP's bucket rule, as notebook 07 states it, against torch's own assignment function.

torch's reducer adds a gradient to the open bucket, then closes the bucket once it has
reached the cap (so a bucket can end larger than the cap by up to one gradient); it does
not close a bucket before a gradient that would overflow it. ``dpkit.ddp.assign_buckets``
states the rule; torch's ``_compute_bucket_assignment_by_size`` (what DDP calls) decides.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist

from dpkit import ddp


def torch_buckets(sizes: list[int], cap_bytes: int) -> list[int]:
    tensors = [torch.empty(size // 4) for size in sizes]  # float32: 4 bytes each
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [cap_bytes], [False] * len(sizes))
    return [sum(sizes[i] for i in bucket) for bucket in buckets]


def test_the_demo_mlps_buckets_at_a_cap_of_0_1_mib():
    # the demo MLP's gradients in the order they become ready (measured from a run: the
    # last layer's first), at bucket_cap_mb=0.1, as notebook 07 shows them
    sizes = [40, 5120, 512, 131072, 1024, 802816]
    cap = int(0.1 * 2**20)
    assert torch_buckets(sizes, cap) == ddp.assign_buckets(sizes, cap) == [136744, 803840]
    assert ddp.assign_buckets(sizes, cap, "before overflow") == [5672, 131072, 1024, 802816]


@pytest.mark.parametrize("seed", range(20))
def test_the_stated_rule_is_torchs_on_random_sizes(seed):
    generator = random.Random(seed)
    sizes = [4 * generator.randint(1, 50_000) for _ in range(generator.randint(1, 30))]
    cap = 4 * generator.randint(1, 100_000)
    assert ddp.assign_buckets(sizes, cap) == torch_buckets(sizes, cap)


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="rule must be"):
        ddp.assign_buckets([4], 4, "after")


def test_a_bucket_that_reaches_the_cap_exactly_closes():
    assert torch_buckets([4, 4, 4], 8) == ddp.assign_buckets([4, 4, 4], 8) == [8, 4]
