"""The trace's clock: CPU work timed in its own thread, CUDA work by events on its stream.

Every event's times are seconds of ``time.perf_counter``, one clock for every device. On the
CPU the thread doing the work reads it. On CUDA the host's clock says when work was
*queued*, not when it ran, so two CUDA events bracket the work on the stream where the
thread queues it (the device's current stream in that thread: a lane's own stream in its
worker and in its backward, the caller's stream for the copies the caller queues), and
their times are mapped onto ``perf_counter`` through one event per device whose completion
the host saw (:func:`cuda_origin`). Reading them means waiting for the GPU, so they are
read late (:func:`resolve_pending`), or at once where nobody will read them later.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from dpkit.device import Device
from dpkit.tracing.events import Event

now = time.perf_counter  # bound once: read twice per event
_cuda_origins: dict[torch.device, tuple[Any, float]] = {}
_pending: list[tuple[Event, torch.device, Any, Any]] = []


def cuda_origin(device: torch.device) -> tuple[Any, float]:
    """A CUDA event on ``device`` and the perf_counter time it completed: maps GPU times onto
    one clock (made once per device, before the first work it times)."""
    if device not in _cuda_origins:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(device))
        event.synchronize()
        _cuda_origins[device] = (event, time.perf_counter())
    return _cuda_origins[device]


def refresh_origins() -> None:
    """Forget the devices' clock origins, so that the next work timed gets fresh ones (where
    float32 milliseconds from them are still fine-grained): a trace entered in a kernel hours
    old places its events as precisely as in a new one. Not while CUDA times wait to be read:
    they are read from the origins they were recorded after."""
    if not _pending:
        _cuda_origins.clear()


def cuda_event_now(device: Device, stream: Any = None) -> Any:
    """A timing event recorded now on ``stream``, by default ``device``'s current stream in
    this thread, where this thread queues that device's work. (Not the current *device*'s
    stream: the caller's thread queues copies for ``cuda:1`` while ``cuda:0`` is current,
    and the event must be on the device whose clock origin times it.)"""
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(device.torch_device) if stream is None else stream)
    return event


def time_on_gpu(event: Event, device: Device, start: Any, end: Any, later: bool) -> None:
    """Give ``event`` the times of the CUDA events ``start`` and ``end``: ``later`` (NaN until
    :func:`resolve_pending`, one wait for the GPU for all of them), else at once."""
    if later:
        event.start = event.end = math.nan
        _pending.append((event, device.torch_device, start, end))
    else:
        _resolve(event, device.torch_device, start, end)


def _resolve(event: Event, device: torch.device, start: Any, end: Any) -> None:
    # The two may be on different streams (a backward ended by the engine's callback), so
    # one finishing says nothing of the other; elapsed_time needs both done.
    start.synchronize()
    end.synchronize()
    origin, origin_time = cuda_origin(device)
    event.start = origin_time + origin.elapsed_time(start) / 1000
    # The duration from the pair itself: elapsed_time is float32 milliseconds, so read from
    # an origin minutes old it is rounded to tens of microseconds (2 us after 30 s, 125 us
    # after 30 min); from its own start, to well under a microsecond.
    event.end = event.start + start.elapsed_time(end) / 1000


def resolve_pending() -> None:
    """Fill in the times of CUDA events: wait for the GPU, then read its clocks."""
    while _pending:
        _resolve(*_pending.pop())


def has_pending() -> bool:
    """Whether some CUDA event times are not read yet (their events' times are NaN)."""
    return bool(_pending)
