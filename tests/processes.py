"""Whether a process still runs, for tests that check nothing a run started outlives it."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """``pid`` runs and is not a zombie (an exited child not yet waited for counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
