"""A trace records the work started under it: its thread's, and the work that thread hands
on to (replicas' worker threads, autograd), never another thread's meanwhile.

The reproducer of issue 18: a trace opened in one thread while another thread trained
untraced recorded 265 events over steps 0-12 instead of about 150 over steps 1-5. The
expected events here come from the same steps traced with no other thread running.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import torch
from lanes import lanes
from torch import nn

import dpkit


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))


def steps(count: int, batch: int) -> None:
    parallel = dpkit.DataParallel(mlp(), device_ids=lanes(4))
    x = torch.randn(batch, 5)
    for _ in range(count):
        parallel(x).sum().backward()


def shape(trace: dpkit.Trace) -> Counter:
    """What a trace holds, without times: (step, phase, device, bytes, details) counted."""
    return Counter(
        (e.step, e.phase, e.device, e.nbytes, tuple(sorted(e.details.items())))
        for e in trace.events
    )


def alone(count: int, batch: int) -> dpkit.Trace:
    with dpkit.trace() as trace:
        steps(count, batch)
    return trace


class Busy(threading.Thread):
    """Trains in a loop until stopped (untraced, or in a trace of its own)."""

    def __init__(self, batch: int, traced: bool = False):
        super().__init__()
        self.batch, self.traced = batch, traced
        self.started_steps = threading.Event()
        self.stop = threading.Event()
        self.trace: dpkit.Trace | None = None
        self.count = 0

    def run(self) -> None:
        parallel = dpkit.DataParallel(mlp(), device_ids=lanes(4))
        x = torch.randn(self.batch, 5)
        with dpkit.trace() if self.traced else _nothing() as trace:
            self.trace = trace
            while not self.stop.is_set():
                parallel(x).sum().backward()
                self.count += 1
                self.started_steps.set()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info) -> None:
        return None


def memory_shape(trace: dpkit.Trace) -> Counter:
    """A trace's memory records counted: (device, category, bytes, step)."""
    return Counter((r.device, r.category, r.nbytes, r.step) for r in trace.memory)


def test_a_trace_does_not_record_another_threads_untraced_work():
    reference = alone(5, batch=8)
    other = Busy(batch=6)
    other.start()
    try:
        other.started_steps.wait(timeout=30)
        with dpkit.trace() as tr:
            steps(5, batch=8)
        during = other.count
    finally:
        other.stop.set()
        other.join(timeout=30)
    assert during > 0  # the other thread trained while this one traced
    assert shape(tr) == shape(reference)  # its own 5 steps' events, nothing of the other's
    assert {e.step for e in tr.events} == {1, 2, 3, 4, 5}
    assert memory_shape(tr) == memory_shape(reference)  # and its memory records alone


def test_an_untraced_thread_sees_no_trace_while_another_thread_traces():
    seen = {}

    def look() -> None:
        seen["enabled"], seen["recording"] = dpkit.tracing.enabled(), dpkit.tracing.recording()

    with dpkit.trace():
        assert dpkit.tracing.enabled() and dpkit.tracing.recording()
        thread = threading.Thread(target=look)
        thread.start()
        thread.join(timeout=30)
    # the other thread's primitives would emit events and memory records to no one
    assert seen == {"enabled": False, "recording": False}


def test_traces_in_two_threads_each_record_their_own_steps():
    expected_here, expected_there = shape(alone(4, batch=8)), shape(alone(3, batch=6))
    other = Busy(batch=6, traced=True)
    other.start()
    try:
        other.started_steps.wait(timeout=30)
        with dpkit.trace() as tr:
            steps(4, batch=8)
        # the other thread's first three steps are compared below: on a loaded machine it
        # may not have taken them all while this thread took its four
        deadline = time.monotonic() + 30
        while other.count < 3 and other.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        other.stop.set()
        other.join(timeout=30)
    assert shape(tr) == expected_here
    there = other.trace
    assert there is not None and {e.step for e in there.events} == set(range(1, other.count + 1))
    first_three = Counter({k: v for k, v in shape(there).items() if k[0] <= 3})
    assert first_three == expected_there


def test_a_trace_opened_in_a_worker_thread_records_its_replicas_and_backward():
    expected = shape(alone(2, batch=8))
    found = {}

    def traced() -> None:
        found["trace"] = alone(2, batch=8)

    thread = threading.Thread(target=traced)
    thread.start()
    thread.join(timeout=60)
    phases = Counter(e.phase for e in found["trace"].events)
    assert phases["apply"] == 8 and phases["backward"] == 8  # 4 lanes, 2 steps
    assert shape(found["trace"]) == expected


def test_a_backward_called_in_another_thread_is_recorded_with_its_forward():
    # The forward's trace records the backward it handed on, wherever backward() is called
    # (a GPU's backward runs in autograd's own threads; here, a thread of the user's).
    # The input requires grad, so the backward gathers its gradient too; and a gradient
    # penalty differentiates the backward itself (the reduce's backward broadcasts).
    def step(backward_elsewhere: bool, penalty: bool) -> dpkit.Trace:
        parallel = dpkit.DataParallel(mlp(), device_ids=lanes(4))
        x = torch.randn(8, 5, requires_grad=True)
        with dpkit.trace() as tr:
            loss = parallel(x).pow(2).sum()
            if penalty:
                grads = torch.autograd.grad(loss, list(parallel.parameters()), create_graph=True)
                loss = sum(g.pow(2).sum() for g in grads)
            if backward_elsewhere:
                thread = threading.Thread(target=loss.backward)
                thread.start()
                thread.join(timeout=30)
            else:
                loss.backward()
        return tr

    for penalty in (False, True):
        elsewhere = step(backward_elsewhere=True, penalty=penalty)
        phases = Counter(e.phase for e in elsewhere.events)
        assert {"grad_scatter", "backward", "reduce", "grad_gather"} <= set(phases)
        assert shape(elsewhere) == shape(step(backward_elsewhere=False, penalty=penalty))


def test_a_backward_traced_apart_from_its_forward_is_recorded_where_it_runs():
    # A backward on the CPU runs in the thread that called it: that thread's trace records
    # it, even when the forward was recorded by another trace (closed since).
    parallel = dpkit.DataParallel(mlp(), device_ids=lanes(4))
    with dpkit.trace() as forward_trace:
        loss = parallel(torch.randn(8, 5)).sum()
    with dpkit.trace() as backward_trace:
        loss.backward()
    forward_phases = {e.phase for e in forward_trace.events}
    backward_phases = Counter(e.phase for e in backward_trace.events)
    assert {"grad_scatter", "backward", "reduce"}.isdisjoint(forward_phases)
    assert backward_phases["backward"] == 4  # one event per replica
    assert {"grad_scatter", "reduce"} <= set(backward_phases)
