"""Rows that print as an aligned table: what dpkit.ddp and dpkit.pipeline return to print."""

from __future__ import annotations

from typing import Any


class Table(list):
    """Rows (dicts) that print as an aligned table; a list, for pandas or a test."""

    def __str__(self) -> str:
        if not self:
            return "(no rows)"
        columns = list(self[0])
        cells = [[_cell(row[c]) for c in columns] for row in self]
        widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
        lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
        lines.append("-" * len(lines[0]))
        lines += ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in cells]
        return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, bool):  # an int to Python: it would print 1 or 0
        return str(value)
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,d}"
    return str(value)
