"""How a trace keeps its events and memory records: in columns, a few bytes each.

The surprise first: an :class:`~dpkit.tracing.events.Event` object with its details dict and
its float and int objects takes about 400 bytes, so a traced run of 10,000 steps of a small
MLP (30 events and 17 memory records a step) held over 140 MB. Kept here instead as columns
(``array``: 8 bytes a time, 8 a count, 4 for which phase on which device) with each distinct
details dict stored once, an event takes about 40 bytes and a memory record 20; the arrays
are a few large blocks, which go back to the system when the trace is dropped, where
hundreds of thousands of small objects leave the heap fragmented.

Recording stays as cheap as it was: spans append their Event objects to a plain list (one
atomic append, from any thread), and the trace moves them into columns between steps, a
few hundred at a time (:meth:`EventColumns.extend`), with C-level ``map`` over each field.
Reading makes new Event objects (each with its own copy of the details), so readers may
change them freely.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence
from operator import attrgetter, itemgetter
from typing import Any

from dpkit.tracing.events import Event, MemoryRecord

_label_of = attrgetter("phase", "device", "kind")
_start, _end, _nbytes, _step = (attrgetter(name) for name in ("start", "end", "nbytes", "step"))
_details = attrgetter("details")


class _Labels:
    """Distinct tuples of strings ((phase, device, kind) of events, (device, category, kind)
    of memory records), each stored once, by number. One table for every trace of the
    process: a few dozen labels, known after the first step, so that a new trace (one per
    step, in some loops) finds its labels with C-level lookups only."""

    __slots__ = ("numbers", "labels", "lock")

    def __init__(self) -> None:
        self.numbers: dict[tuple[str, ...], int] = {}
        self.labels: list[tuple[str, ...]] = []
        self.lock = threading.Lock()

    def number(self, label: tuple[str, ...]) -> int:
        number = self.numbers.get(label)
        if number is None:
            with self.lock:  # traces in two threads may meet a new label at once
                number = self.numbers.get(label)
                if number is None:
                    self.labels.append(label)
                    number = self.numbers[label] = len(self.labels) - 1
        return number

    def numbers_of(self, labels: list[tuple[str, ...]]) -> list[int]:
        """The number of each label: looked up by C-level ``map``, new labels numbered in
        Python (a trace meets a few dozen, in its first step)."""
        numbers = list(map(self.numbers.get, labels))
        if None in numbers:
            numbers = list(map(self.number, labels))
        return numbers


_LABELS = _Labels()


class _Interned:
    """Distinct details dicts, each stored once: a step's scatter on lane 2 has the same
    details in every step. A dict with unhashable values (a list) is kept as it is."""

    __slots__ = ("by_items",)

    def __init__(self) -> None:
        self.by_items: dict[tuple[Any, ...], dict[str, Any]] = {}

    def intern(self, details: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.by_items.setdefault(tuple(details.items()), details)
        except TypeError:  # an unhashable value
            return details

    def intern_all(self, all_details: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """:meth:`intern` for each, by C-level ``map`` unless one has an unhashable value."""
        try:
            keys = map(tuple, map(dict.items, all_details))
            return list(map(self.by_items.setdefault, keys, all_details))
        except TypeError:
            return list(map(self.intern, all_details))


class EventColumns:
    """Events as columns: which phase on which device, start, end, bytes, step, details."""

    def __init__(self) -> None:
        self._labels = _LABELS
        self._interned = _Interned()
        self.label = array("I")
        self.start = array("d")
        self.end = array("d")
        self.nbytes = array("q")
        self.step = array("q")
        self.details: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self.step)

    def extend(self, events: Sequence[Event]) -> None:
        """Store ``events`` (their times final: CUDA times resolved)."""
        if not events:
            return
        self.label.extend(self._labels.numbers_of(list(map(_label_of, events))))
        self.start.extend(map(_start, events))
        self.end.extend(map(_end, events))
        self.nbytes.extend(map(_nbytes, events))
        self.step.extend(map(_step, events))
        self.details.extend(self._interned.intern_all(list(map(_details, events))))

    def events(self, copy_details: bool = True) -> list[Event]:
        """New Event objects, in the order they were stored. Their details are copies unless
        ``copy_details`` is False (for readers that change nothing: exports)."""
        labels = self._labels.labels
        columns = self.label, self.start, self.end, self.nbytes, self.step, self.details
        if copy_details:
            columns = (*columns[:5], map(dict, self.details))
        return [
            Event(*labels[label][:2], start, end, nbytes, step, labels[label][2], details)
            for label, start, end, nbytes, step, details in zip(*columns)
        ]

    def rows(self) -> list[tuple[int, str, float, float, int]]:
        """``(step, phase, start, end, nbytes)`` of each event: what a summary reads."""
        phase_of = [label[0] for label in self._labels.labels]
        return [
            (step, phase_of[label], start, end, nbytes)
            for step, label, start, end, nbytes in zip(
                self.step, self.label, self.start, self.end, self.nbytes
            )
        ]

    def kinds(self) -> set[str]:
        """The kinds of device the events ran on."""
        return {label[2] for label in self._labels.labels}

    def drop_steps_through(self, last: int) -> list[tuple[int, str, float, float, int]]:
        """Remove the events of steps up to ``last``; returns them as ``(step, phase,
        start, end, nbytes)`` rows (what a summary needs)."""
        columns = (self.step, self.label, self.start, self.end, self.nbytes)
        dropped = _dropped_indices(self.step, last)
        if isinstance(dropped, int):  # the usual case: the oldest events, a prefix
            gone = list(zip(*(column[:dropped] for column in columns)))
            for column in (*columns, self.details):
                del column[:dropped]  # in place: no new blocks for the kept ones
        else:
            keep = itemgetter_or_empty([i for i, step in enumerate(self.step) if step > last])
            gone = list(zip(*map(itemgetter_or_empty(dropped), columns)))
            self.step, self.label, self.start, self.end, self.nbytes = _kept(keep, columns)
            self.details = list(keep(self.details))
        phase_of = [label[0] for label in self._labels.labels]
        return [
            (step, phase_of[label], start, end, nbytes) for step, label, start, end, nbytes in gone
        ]


class MemoryColumns:
    """Memory records as columns: which device, category and kind, bytes, step."""

    def __init__(self) -> None:
        self._labels = _LABELS
        self.label = array("I")
        self.nbytes = array("q")
        self.step = array("q")

    def __len__(self) -> int:
        return len(self.step)

    def extend(self, records: Sequence[tuple[str, str, int, int, str]]) -> None:
        """Store ``records``, each MemoryRecord's fields as a tuple."""
        if not records:
            return
        self.label.extend(self._labels.numbers_of(list(map(_memory_label, records))))
        self.nbytes.extend(map(itemgetter(2), records))
        self.step.extend(map(itemgetter(3), records))

    def records(self) -> list[MemoryRecord]:
        labels = self._labels.labels
        return [
            MemoryRecord(labels[label][0], labels[label][1], nbytes, step, labels[label][2])
            for label, nbytes, step in zip(self.label, self.nbytes, self.step)
        ]

    def drop_steps_through(self, last: int) -> None:
        """Remove the records of steps up to ``last``."""
        dropped = _dropped_indices(self.step, last)
        if isinstance(dropped, int):
            for column in (self.label, self.nbytes, self.step):
                del column[:dropped]
        else:
            keep = itemgetter_or_empty([i for i, step in enumerate(self.step) if step > last])
            self.label, self.nbytes, self.step = _kept(keep, (self.label, self.nbytes, self.step))


_memory_label = itemgetter(0, 1, 4)  # device, category, kind


def _dropped_indices(steps: array, last: int) -> int | list[int]:
    """Where the entries of steps up to ``last`` are: how many lead the column when they
    are a prefix (entries are stored as they finish, so usually), else their indices."""
    first_kept = next((i for i, step in enumerate(steps) if step > last), len(steps))
    if all(step > last for step in steps[first_kept:]):
        return first_kept
    return [i for i, step in enumerate(steps) if step <= last]


def _kept(keep: Any, columns: Sequence[array]) -> list[array]:
    """New arrays of the items ``keep`` picks from each of ``columns`` (fresh, compact ones)."""
    return [array(column.typecode, keep(column)) for column in columns]


def itemgetter_or_empty(indices: list[int]) -> Any:
    """A function giving the items at ``indices`` of a sequence, as a tuple (also for none
    or one index, which ``itemgetter`` treats differently)."""
    if not indices:
        return lambda sequence: ()
    if len(indices) == 1:
        only = indices[0]
        return lambda sequence: (sequence[only],)
    return itemgetter(*indices)
