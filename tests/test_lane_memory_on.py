"""The lanes' block pool is on with the course's torch, and never keeps a process alive.

The pool knows a block is free from Python's reference count (``dpkit.lane_memory``); where
a torch does not show a tensor's use in it, pooling switches off and the pool's own tests
skip. So a broken probe would pass them all silently: this file says it is on.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from dpkit import lane_memory


@pytest.mark.skipif(
    tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13),
    reason="checked on the course's torch (2.13); older ones may not show a tensor's use",
)
def test_the_course_torch_shows_a_tensors_use_so_lanes_reuse_blocks():
    assert lane_memory._REFS_WHEN_FREE is not None


def test_a_process_holding_lane_copies_exits_at_once():
    # The pool's releaser is a daemon: a process still holding pooled chunks when it ends
    # must not wait for a thread that waits for those chunks to be freed.
    script = (
        "import torch, dpkit\n"
        "lanes = dpkit.virtual_devices(2, on='cpu')\n"
        "kept = dpkit.scatter(torch.randn(2**20, 2), lanes)  # lane 1's 4 MiB: a block\n"
        "from dpkit import lane_memory\n"
        "assert lane_memory.cached_bytes(lanes[1]) > 0 or lane_memory._REFS_WHEN_FREE is None\n"
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
