"""torch's intra-op threads for a block of code.

Virtual CPU lanes (and pipeline stages) share the machine's cores; with torch's default each
of them would also spread every op over all cores, and their threads would fight. dpkit's
workers take the caller's count (:mod:`dpkit.parallel_apply`), so setting it here, in the
caller, sets it for the lanes too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """Run torch with ``threads`` intra-op threads inside the block (None: leave as is)."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
