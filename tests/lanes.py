"""Helpers shared by the CPU tests: virtual CPU lanes, and a log of copies between devices."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dpkit


def lanes(n: int = 4) -> list[dpkit.Device]:
    """``n`` virtual CPU lanes (a CPU model sits on lane 0 of these, also on a GPU box)."""
    return dpkit.virtual_devices(n, on="cpu")


@contextmanager
def recorded_transfers() -> Iterator[list[dpkit.Transfer]]:
    """Every copy between devices made inside the block, in order."""
    log: list[dpkit.Transfer] = []
    handle = dpkit.add_transfer_listener(log.append)
    try:
        yield log
    finally:
        handle.remove()
