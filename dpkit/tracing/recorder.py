"""The recorder: ``dpkit.trace()``, phase hooks, spans, memory records and steps.

Recording is off by default, and then each entry point costs one test of two lists
(:func:`enabled`) and returns a shared no-op. While a :class:`Trace` records or a hook
listens (:func:`register_phase_hook`), every span becomes an :class:`Event`, appended to
each open trace and passed to the hooks in the thread that did the work.

Who calls what: :mod:`dpkit.comm`, in one seam (``_copy_group``), opens a :func:`copy_span`
around each group of copies for a device (its phase follows from the copy's
:class:`~dpkit.tracing.events.Collective` and the pass, read from :mod:`dpkit.context`) and
says what the copies leave on the device (:func:`holds`); ``parallel_apply`` runs its
workers through :func:`dpkit.tracing.backward.applying`, which times each replica's run as an
``apply`` span (:func:`span_on`, on the stream it runs on) and hands their results to
``after_apply``; replicate is timed from its last copy to its return, building the replica
modules (:func:`dpkit.tracing.backward.replicating`, with a :func:`host_span`); DataParallel begins
each step (:func:`begin_step`) and ends its forward (:func:`end_forward`), where torch's
allocator is read on real CUDA devices.

A trace records the work started in the thread that opened it, and in the threads that work
hands on to (``parallel_apply``'s workers, autograd's), through :mod:`dpkit.context`'s
scopes: each entry point reads the traces of the calling thread's scope, after one test of
a global list of every open trace, so that nothing costs more while no trace is open.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import asdict
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from dpkit import context
from dpkit.context import Scope
from dpkit.device import Device
from dpkit.nested import tensor_nbytes
from dpkit.tracing import allocator, clock, export
from dpkit.tracing.events import (
    ALLOCATED,
    HELD_AFTER,
    PEAK,
    Collective,
    Event,
    MemoryRecord,
    Phase,
)
from dpkit.tracing.store import EventColumns, MemoryColumns

_recorders: list[Trace] = []  # every open trace, in any thread: "is anything recording?"
_local = context._local  # .scope: the calling thread's (read here inline: hot paths)
_hooks: OrderedDict[int, tuple[frozenset[str] | None, Callable[[Event], None]]] = OrderedDict()
_state_lock = threading.Lock()
_profiler_enabled = torch.autograd._profiler_enabled
_current_step = context.current_step
_in_backward = context.in_backward
# Keyed by plain strings: an Enum member hashes in Python, a str in C, and these are read for
# every copy while tracing.
_COPY_PHASES = {c.value: (c.phase(False).value, c.phase(True).value) for c in Collective}
_HELD_AFTER = {collective.value: category for collective, category in HELD_AFTER.items()}
_APPLY = Phase.APPLY.value


def enabled() -> bool:
    """True while a trace records this thread's work or a hook listens: only then do
    primitives emit events."""
    return bool(_hooks) or bool(_recorders and _local.scope.recorders)


def recording() -> bool:
    """True while a trace records this thread's work (hooks alone keep no memory records)."""
    return bool(_recorders and _local.scope.recorders)


def recorders_for(scope: Scope) -> list[Trace]:
    """The traces that record work of ``scope`` done in this thread: this thread's own, if
    it has any (a backward run on the CPU, in the thread that called it), else ``scope``'s
    (a backward in autograd's thread for a GPU)."""
    here = _local.scope.recorders
    return here if here else scope.recorders


# --------------------------------------------------------------------------------------
# Steps, and torch's allocator read at their edges


def begin_step(devices: Iterable[Device] = ()) -> int:
    """Start a new step on ``devices`` (DataParallel calls this at every forward while tracing).

    While a trace records, this ends the previous step's ``peak (torch)`` reading and, on the
    real CUDA devices among ``devices``, resets torch's peak memory statistics
    (``torch.cuda.reset_peak_memory_stats``), so that a step's peak is its own; and each
    trace moves what it recorded into its columns (in batches) and drops steps past its
    bound.
    """
    scope = _local.scope
    if scope.recorders:
        record_allocator_peaks()
    step = context.begin_step()
    if scope.recorders:
        scope.allocator_devices = allocator.devices_with_allocator(devices)
        allocator.reset_peaks(scope.allocator_devices)
        for recorder in scope.recorders:
            recorder._step_began(step)
    return step


def end_forward() -> None:
    """At the end of a step's forward: ``allocated (torch)`` on each device with an allocator."""
    for device in _local.scope.allocator_devices:
        record_memory(device, ALLOCATED, allocator.allocated(device))


def record_allocator_peaks() -> None:
    """``peak (torch)`` since the step began on each of its devices with an allocator; ends
    the step's readings (a second call records nothing)."""
    scope = _local.scope
    devices, scope.allocator_devices = scope.allocator_devices, ()
    for device in devices:
        record_memory(device, PEAK, allocator.peak(device))


# --------------------------------------------------------------------------------------
# Hooks and events


def register_phase_hook(
    hook: Callable[[Event], None], phases: Iterable[str] | str | None = None
) -> RemovableHandle:
    """Call ``hook(event)`` for every event (or only for ``phases``) until the handle is removed.

    Hooks run in the thread that did the work (a worker thread for ``apply``). With hooks
    and no trace, CUDA events reach the hooks with their final times: each one waits for
    its own work on the GPU first (a lane's span waits for that lane, not for all of them;
    the copies of its caller's stream wait for the caller's), which also slows the work (a
    worker waiting for its own), so measure with ``dpkit.trace()``; but nothing is kept for
    a trace that never comes. While a trace records, hooks get the same events with NaN
    times, which the trace fills in when it resolves them.
    """
    wanted = frozenset([phases] if isinstance(phases, str) else phases) if phases else None
    with _state_lock:
        handle = RemovableHandle(_hooks)
        _hooks[handle.id] = (wanted, hook)
    original_remove = handle.remove

    def remove() -> None:
        with _state_lock:
            original_remove()

    handle.remove = remove  # type: ignore[method-assign]
    return handle


def emit(event: Event, scope: Scope | None = None) -> None:
    """Hand ``event`` to the traces recording this thread's work (or ``scope``'s, see
    :func:`recorders_for`) and to the hooks that want its phase."""
    if _recorders:
        here = _local.scope.recorders
        for recorder in here if here or scope is None else scope.recorders:
            recorder._events.append(event)  # atomic: no lock needed in worker threads
    if _hooks:
        emit_to_hooks(event)


def time_on_gpu(event: Event, device: Device, start: Any, end: Any) -> None:
    """Give ``event`` the times of two CUDA events: late while a trace records (it resolves
    them all at once), at once for hooks alone (nothing piles up for a trace to come)."""
    clock.time_on_gpu(event, device, start, end, later=bool(_recorders))


def record_memory(device: Device, category: str, nbytes: int, step: int | None = None) -> None:
    """Note that ``device`` holds ``nbytes`` in ``category`` this step (kept while tracing)."""
    recorders = _recorders and _local.scope.recorders
    if recorders:
        # a plain tuple (MemoryRecord is made when read): one per device and category
        step = _current_step() if step is None else step
        record = (device.name, category, nbytes, step, device.kind)
        for recorder in recorders:
            recorder._memory.append(record)  # atomic: no lock needed in worker threads


def holds(
    collective: Collective, devices: Sequence[Device], tensors: Sequence[torch.Tensor]
) -> None:
    """After a copy: what ``tensors`` it leaves on each of ``devices`` are (a forward
    scatter's chunk: the device's ``input``); counted once, only while a trace records."""
    if _recorders and not _in_backward():
        category = _HELD_AFTER.get(collective._value_)
        if category is not None:
            nbytes = sum(map(tensor_nbytes, tensors))
            for device in devices:
                record_memory(device, category, nbytes)


# --------------------------------------------------------------------------------------
# Spans: one phase on one device, timed


class _Span:
    """Times one phase on one device; the primitive that opened it sets ``nbytes``, the
    bytes it copied while the span was open."""

    __slots__ = ("phase", "device", "step", "details", "nbytes", "cuda", "profiler_range")
    __slots__ += ("start", "start_event", "recorders", "stream")

    def __init__(
        self,
        phase: str,
        device: Device,
        details: dict[str, Any],
        cuda: bool,
        recorders: Any,
        stream: Any = None,
    ):
        self.recorders = recorders  # the calling thread's traces (none: for hooks alone)
        self.stream = stream  # where its CUDA events go (None: the device's current stream)
        self.phase = phase
        self.device = device
        self.step = _current_step()
        self.details = details
        self.nbytes = 0
        self.cuda = cuda
        if cuda:
            clock.cuda_origin(device.torch_device)  # fix the GPU clock's origin before the work
        # The profiler sees only the thread that started it, so worker threads' apply spans
        # open no range; parallel_apply opens dpkit.apply in the caller's thread instead.
        self.profiler_range = (
            torch.autograd.profiler.record_function(f"dpkit.{phase}")
            if phase != _APPLY and _profiler_enabled()
            else None
        )

    def __enter__(self) -> _Span:
        if self.profiler_range is not None:
            self.profiler_range.__enter__()
        if self.cuda:
            self.start_event = clock.cuda_event_now(self.device, self.stream)
        self.start = clock.now()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        end = _last_end.time = clock.now()
        if self.profiler_range is not None:
            self.profiler_range.__exit__(*exc_info)
        device = self.device
        event = Event(
            self.phase, device.name, self.start, end, self.nbytes, self.step, device.kind,
            self.details,
        )  # fmt: skip
        if self.cuda:
            end_event = clock.cuda_event_now(device, self.stream)
            time_on_gpu(event, device, self.start_event, end_event)
        for recorder in self.recorders:  # emit, inlined: spans are the most frequent call
            recorder._events.append(event)
        if _hooks:
            emit_to_hooks(event)


# When the last span this thread timed ended (the CPU clock): replicate's last copy, where
# building its module objects begins (dpkit.tracing.backward.replicating).
_last_end = threading.local()


def emit_to_hooks(event: Event) -> None:
    for wanted, hook in list(_hooks.values()):
        if wanted is None or event.phase in wanted:
            hook(event)


OFF = nullcontext()  # what every span is while nothing listens: gives None


def span(phase: Phase | str, device: Device, **details: Any) -> Any:
    """A context that records ``phase`` on ``device`` in the current step and gives the
    span, whose ``nbytes`` the caller sets; when nothing listens, :data:`OFF`."""
    return span_on(None, phase, device, **details)


def span_on(stream: Any, phase: Phase | str, device: Device, **details: Any) -> Any:
    """:func:`span`, timed on ``stream`` on CUDA (None: the device's current stream in this
    thread): a replica's ``apply``, opened before its worker enters the stream it runs on."""
    if not (_recorders or _hooks):
        return OFF
    recorders = _local.scope.recorders if _recorders else ()  # this thread's traces
    if not (recorders or _hooks):
        return OFF
    name = getattr(phase, "_value_", phase)  # a Phase, or its name (._value_: no property)
    return _Span(name, device, details, device.device_type == "cuda", recorders, stream)


def copy_span(collective: Collective, device: Device, **details: Any) -> Any:
    """:func:`span` for a copy of comm's: its phase is the collective's in this pass."""
    if not (_recorders or _hooks):
        return OFF
    recorders = _local.scope.recorders if _recorders else ()  # this thread's traces
    if not (recorders or _hooks):
        return OFF
    phase = _COPY_PHASES[collective._value_][_in_backward()]
    return _Span(phase, device, details, device.device_type == "cuda", recorders)


def host_span(phase: Phase | str, device: Device, **details: Any) -> Any:
    """Like :func:`span`, for Python work in the calling thread done on ``device``'s behalf
    (building replica modules): timed by the CPU clock on every device kind, since CUDA
    events would time the GPU's queue instead."""
    if not (_recorders or _hooks):
        return OFF
    recorders = _local.scope.recorders if _recorders else ()  # this thread's traces
    if not (recorders or _hooks):
        return OFF
    return _Span(getattr(phase, "_value_", phase), device, details, False, recorders)


# --------------------------------------------------------------------------------------
# The Trace

# How many steps a trace keeps by default: more than any figure draws, while a run of any
# length holds about 2 MB of them (30 events and 17 memory records a step of a small MLP on
# 4 lanes: benchmarks/trace_long_run.py). The summary covers every step regardless.
DEFAULT_KEEP_STEPS = 1000
_STORE_BATCH = 512  # records appended as objects (about 200 KB) before they go into columns


def _check_keep_steps(keep_steps: Any) -> int | None:
    if keep_steps is None:
        return None
    if isinstance(keep_steps, bool) or not isinstance(keep_steps, int) or keep_steps < 1:
        raise ValueError(
            f"keep_steps must be a positive int (how many of the last steps to keep) or None "
            f"(keep every step), got {keep_steps!r}; e.g. dpkit.trace(keep_steps=100)"
        )
    return keep_steps


class Trace:
    """The events recorded inside one ``with dpkit.trace():`` block.

    It keeps the events and memory records of the last ``keep_steps`` steps (all of them
    with ``keep_steps=None``) and, for the steps it dropped, the per-phase totals that
    :meth:`summary` needs: the summary covers every step, while :attr:`events`,
    :attr:`memory`, :meth:`rows` and the Chrome trace cover the kept ones.
    """

    def __init__(self, keep_steps: int | None = DEFAULT_KEEP_STEPS) -> None:
        self.keep_steps = _check_keep_steps(keep_steps)
        # What spans append to (Events) and record_memory (MemoryRecord's fields as a tuple),
        # moved into columns between steps; code that builds a trace appends here too.
        self._events: list[Event] = []
        self._memory: list[tuple[str, str, int, int, str]] = []
        self._event_columns = EventColumns()
        self._memory_columns = MemoryColumns()
        self._dropped = export.PhaseTotals()  # the steps no longer kept
        self.dropped_through = 0  # steps up to this one were dropped (0: none)
        self._scope: Scope | None = None
        self.origin = time.perf_counter()

    @property
    def memory(self) -> list[MemoryRecord]:
        """What each device held, by category and step (in the kept steps)."""
        self._store()
        return self._memory_columns.records()

    @property
    def events(self) -> list[Event]:
        """Every event of the kept steps in the order it finished (CUDA times resolved
        first), as new objects: changing them changes nothing in the trace."""
        return self._stored_events()

    def _stored_events(self, copy_details: bool = True) -> list[Event]:
        clock.resolve_pending()
        self._store()
        return self._event_columns.events(copy_details)

    @property
    def dropped_steps(self) -> int:
        """How many steps' events and memory records this trace dropped (``keep_steps``)."""
        return self._dropped.steps

    def rows(self) -> Any:
        """One row per event: a pandas DataFrame where pandas is installed, else a list of dicts."""
        return export.as_dataframe(export.rows(self._stored_events(False), self.origin))

    def memory_rows(self) -> Any:
        """One row per memory record (device, category, bytes, step), like :meth:`rows`."""
        return export.as_dataframe([asdict(record) for record in self.memory])

    def summary(self) -> Any:
        """Time per step, bytes per step and share of the step, per phase, over every step
        (dropped ones included); prints as a table."""
        clock.resolve_pending()
        self._store()
        totals = self._dropped.copy()
        totals.add_rows(self._event_columns.rows())
        return totals.summary()

    def memory_summary(self, step: int | None = None) -> Any:
        """Bytes each device held in ``step`` (default: the last), by category, as a table."""
        if step is not None and step <= self.dropped_through:
            raise ValueError(
                f"step={step} was dropped: this trace keeps the last keep_steps="
                f"{self.keep_steps} steps (from step {self.dropped_through + 1}); pick a later "
                "step, or record with dpkit.trace(keep_steps=None) to keep every step"
            )
        return export.memory_summary(self.memory, step)

    def to_chrome_trace(self, path: str | Any) -> Any:
        """Write Chrome trace JSON (opens in Perfetto and chrome://tracing); returns the path."""
        return export.write_chrome_trace(self._stored_events(False), self.origin, path)

    @property
    def hardware(self) -> str:
        """What the events ran on, in words (for titles): e.g. "virtual devices on the CPU"."""
        return export.hardware_label(self._stored_events(False))

    def _store(self) -> None:
        """Move what was appended into the columns. Lists are cut, not swapped, so that an
        append from another thread meanwhile is kept for the next call."""
        events = self._events
        count = len(events)
        if count:
            batch = events[:count]
            if clock.has_pending():  # CUDA times not yet read: those wait in the list
                waiting = [event for event in batch if event.start != event.start]  # NaN
                batch = [event for event in batch if event.start == event.start]
                del events[:count]
                events[:0] = waiting
            else:
                del events[:count]
            self._event_columns.extend(batch)
        records = self._memory
        count = len(records)
        if count:
            self._memory_columns.extend(records[:count])
            del records[:count]

    def _step_began(self, step: int) -> None:
        """Between steps: store what was appended compactly, once there are a few hundred
        records (a batch costs fewer instructions than a call per step); past the bound by
        a quarter of it, drop steps down to the bound (each event is dropped once)."""
        if len(self._events) + len(self._memory) >= _STORE_BATCH:
            self._store()
        keep = self.keep_steps
        if keep is not None and step - keep - self.dropped_through >= max(1, keep // 4):
            self._store()
            self._drop_steps_through(step - keep)

    def _drop_steps_through(self, last: int) -> None:
        if last <= self.dropped_through:
            return
        self._dropped.add_rows(self._event_columns.drop_steps_through(last))
        self._memory_columns.drop_steps_through(last)
        self.dropped_through = last

    def __enter__(self) -> Trace:
        with _state_lock:
            if not _recorders:  # the outermost trace: fresh GPU clock origins
                clock.refresh_origins()
            scope = self._scope = context.open_scope()  # an outermost trace: steps from 1
            scope.recorders.append(self)
            _recorders.append(self)
        self.origin = time.perf_counter()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        record_allocator_peaks()  # the last step's peak, while this trace still records
        scope = self._scope
        with _state_lock:
            _recorders.remove(self)
            if scope is not None:
                scope.recorders.remove(self)
                context.close_scope(scope)
        clock.resolve_pending()
        # What is not in columns yet (fewer than _STORE_BATCH records) waits for a reader.
        if self.keep_steps is not None and scope is not None:
            last_dropped = scope.step - self.keep_steps
            if last_dropped > self.dropped_through:
                self._store()
                self._drop_steps_through(last_dropped)
        self._scope = None


def trace(keep_steps: int | None = DEFAULT_KEEP_STEPS) -> Trace:
    """Record every phase of every step inside a ``with`` block: ``with dpkit.trace() as tr:``.

    Only the work started in this thread is recorded (and in the threads it hands on to:
    replicas' workers, autograd's), not another thread's meanwhile. The trace keeps the last
    ``keep_steps`` steps' events and memory records (default 1000; None keeps every step),
    and its :meth:`~Trace.summary` covers every step.
    """
    return Trace(keep_steps)
