"""Trace: an event for every phase of every step on every device, and hooks to watch them.

The surprise first: recording is off by default and then costs one test of a list per
phase; nothing is timed, counted or stored. Inside ``with dpkit.trace() as tr:`` every
primitive emits :class:`Event` records, and hooks registered with
:func:`register_phase_hook` see the same events as they happen.

Phases (:class:`Phase`): ``scatter``, ``replicate`` (one per device for its tensor copies,
and one more on the source device, ``details["what"] == "modules"``, for building every
replica's module objects in the caller's thread), ``apply`` (one per device), ``gather``,
and in backward ``grad_scatter`` (gather's backward), ``backward`` (one per device: a
replica's own backward, from its first autograd node starting to its last one finishing)
and ``reduce`` (replicate's backward: the reduce-add of gradients onto the source device).
Each event has ``phase``, ``device``, ``start`` and ``end`` (seconds of
``time.perf_counter``, one clock for every device), ``nbytes`` moved between devices,
``step`` and free-form ``details``. Memory (``tr.memory``): the bytes each device holds, by
category and step (see :class:`MemoryRecord`).

A trace records the work started in the thread that opened it, and in the threads that work
hands on to (each replica's worker, autograd's), never another thread's meanwhile
(:mod:`dpkit.context`). It keeps the last ``keep_steps`` steps (``dpkit.trace(keep_steps=
1000)`` by default; ``None`` keeps every one) in columns of a few bytes a record
(:mod:`~dpkit.tracing.store`), so a run of any length holds a bounded amount, and its
``summary()`` still covers every step: 10,000 traced steps of a small MLP grew the process
by 144 MB before, and stay flat now (``benchmarks/trace_long_run.py``).

The package, a file per job, around the primitives rather than inside them:

=================  ==================================================================
``events``         the phase vocabulary, :class:`Event`, :class:`MemoryRecord`
``recorder``       ``dpkit.trace()``, hooks, spans, memory records, steps, the bound
``store``          how a trace keeps events and memory records: compact columns
``clock``          the CPU clock, and CUDA events resolved later
``backward``       after each replica's forward: outputs, activations, backward timed
``replica_graph``  a replica's autograd graph: what it saved, where its backward ends
``allocator``      torch's CUDA allocator totals
``export``         rows, summaries, Chrome trace JSON (reads events only)
=================  ==================================================================

What tracing costs, and where: each phase opens a span (two clock reads and an event; the
primitive adds the bytes it copied), and after each replica's forward the replica graph is
walked once (its activations, and the two nodes whose hooks time its backward), outside the
timed ``apply``. On 4 CPU lanes that is about 3% of a training step of a small MLP in time
(``benchmarks/trace_overhead.py``) and 3.5% in CPU instructions
(``benchmarks/trace_instructions.py``: about 0.2 M of its 1.6 M a step keep traces to their
threads and to their bound).
"""

from dpkit.tracing.events import (
    ALLOCATOR_CATEGORIES,
    BACKWARD_PHASES,
    FORWARD_PHASES,
    MEMORY_CATEGORIES,
    PHASE_COLOURS,
    PREDICTED,
    RANK,
    Event,
    MemoryRecord,
    Phase,
)
from dpkit.tracing.export import KIND_LABELS
from dpkit.tracing.recorder import Trace, register_phase_hook, trace

# isort: split
# The seam the primitives, dpkit.ddp and dpkit.pipeline record through: importable from here
# (``tracing.span(...)``), not in __all__, since a user of traces never calls it.
from dpkit.context import current_step as current_step
from dpkit.tracing.backward import ReplicaBackward as ReplicaBackward
from dpkit.tracing.backward import after_apply as after_apply
from dpkit.tracing.backward import applying as applying
from dpkit.tracing.backward import forward_step as forward_step
from dpkit.tracing.backward import replicating as replicating
from dpkit.tracing.backward import trace_replica as trace_replica
from dpkit.tracing.backward import traced_call as traced_call
from dpkit.tracing.clock import resolve_pending as resolve_pending
from dpkit.tracing.events import ALLOCATED as ALLOCATED
from dpkit.tracing.events import PEAK as PEAK
from dpkit.tracing.events import Collective as Collective
from dpkit.tracing.recorder import begin_step as begin_step
from dpkit.tracing.recorder import copy_span as copy_span
from dpkit.tracing.recorder import enabled as enabled
from dpkit.tracing.recorder import holds as holds
from dpkit.tracing.recorder import host_span as host_span
from dpkit.tracing.recorder import record_memory as record_memory
from dpkit.tracing.recorder import recording as recording
from dpkit.tracing.recorder import span as span

__all__ = [
    "ALLOCATOR_CATEGORIES",
    "BACKWARD_PHASES",
    "FORWARD_PHASES",
    "KIND_LABELS",
    "MEMORY_CATEGORIES",
    "PHASE_COLOURS",
    "PREDICTED",
    "RANK",
    "Event",
    "MemoryRecord",
    "Phase",
    "Trace",
    "register_phase_hook",
    "trace",
]
