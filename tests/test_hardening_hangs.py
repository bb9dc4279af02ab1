"""No hang without a way out (issue 18): ``timeout=``, Ctrl-C while replicas run, a process
that exits with a replica stuck, ``SystemExit`` and ``KeyboardInterrupt`` from a replica, and
the caller's intra-op thread count in the workers."""

from __future__ import annotations

import _thread
import ctypes
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from by_lane import Raises, StuckOn
from lanes import lanes
from torch import nn

import dpkit


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of each test: the stuck replicas return and their threads end."""
    event = threading.Event()
    yield event
    event.set()


def _timed(call):
    start = time.monotonic()
    with pytest.raises(TimeoutError) as error:
        call()
    return error, time.monotonic() - start


def test_parallel_apply_timeout_names_the_replicas_still_running_and_their_devices(release):
    devices = lanes(4)
    module = StuckOn(release, {1, 3})
    error, waited = _timed(
        lambda: dpkit.parallel_apply(
            [module] * 4, [torch.ones(2)] * 4, devices=devices, timeout=0.3
        )
    )
    assert 0.3 <= waited < 2.0
    # the whole text is docs/bad_input.md's row (tests/test_bad_input_table.py)
    message = str(error.value)
    assert message.startswith(
        "parallel_apply: replica 1 on virtual:1 (cpu), replica 3 on virtual:3 (cpu) still "
        "running after timeout=0.3 s. "
    )
    assert "replica 0" not in message and "replica 2" not in message
    assert "Python cannot stop a thread" in message and "raise timeout" in message


def test_dataparallel_and_data_parallel_take_a_timeout(release):
    devices = lanes(4)
    module = StuckOn(release, {2})
    parallel = dpkit.DataParallel(module, device_ids=devices, timeout=0.2)
    error, _ = _timed(lambda: parallel(torch.ones(8, 1)))
    assert error.match(r"replica 2 on virtual:2 \(cpu\)")
    error, _ = _timed(
        lambda: dpkit.data_parallel(module, torch.ones(8, 1), device_ids=devices, timeout=0.2)
    )
    assert error.match(r"replica 2 on virtual:2 \(cpu\)")


def test_a_timeout_holds_for_a_single_replica_and_a_single_device(release):
    devices = lanes(1)
    module = StuckOn(release, {0})
    _timed(lambda: dpkit.parallel_apply([module], [torch.ones(1)], devices=devices, timeout=0.2))
    parallel = dpkit.DataParallel(module, device_ids=devices, timeout=0.2)
    error, _ = _timed(lambda: parallel(torch.ones(4, 1)))
    assert error.match(r"replica 0 on virtual:0 \(cpu\)")
    error, _ = _timed(
        lambda: dpkit.data_parallel(module, torch.ones(4, 1), device_ids=devices, timeout=0.2)
    )
    assert error.match(r"replica 0 on virtual:0 \(cpu\)")


class Scaled(nn.Module):
    def forward(self, x, scale=1.0):
        return x * scale


def test_a_single_device_with_a_timeout_returns_the_module_output_with_its_keywords():
    # One device and a timeout: the module runs in a worker thread, so that the timeout holds;
    # its keyword arguments and its output must come through as without one.
    parallel = dpkit.DataParallel(Scaled(), device_ids=lanes(1), timeout=5)
    assert parallel(torch.ones(4, 1), scale=3.0).tolist() == [[3.0]] * 4
    functional = dpkit.data_parallel(
        Scaled(), torch.ones(4, 1), device_ids=lanes(1), module_kwargs={"scale": 2.0}, timeout=5
    )
    assert functional.tolist() == [[2.0]] * 4


def test_data_parallel_refuses_a_bad_timeout_before_any_work():
    # the empty batch would be scatter's error; the timeout is checked first, as DataParallel's
    with pytest.raises(ValueError, match=r"^timeout must be a positive number of seconds, at most"):
        dpkit.data_parallel(nn.Linear(2, 2), torch.empty(0, 2), device_ids=lanes(2), timeout=0)


def test_replicas_that_finish_in_time_return_their_outputs(release):
    release.set()
    parallel = dpkit.DataParallel(StuckOn(release, {1}), device_ids=lanes(2), timeout=5)
    assert torch.equal(parallel(torch.ones(4, 1)), torch.full((4, 1), 2.0))


@pytest.mark.parametrize("timeout", [0, -5, float("nan"), float("inf")])
def test_a_timeout_that_is_not_a_positive_number_of_seconds(timeout):
    with pytest.raises(ValueError, match=r"timeout must be a positive number of seconds.*e\.g\."):
        dpkit.DataParallel(nn.Linear(2, 2), device_ids=lanes(2), timeout=timeout)


@pytest.mark.parametrize("timeout", ["10", True])
def test_a_timeout_that_is_not_a_number(timeout):
    with pytest.raises(TypeError, match=r"timeout must be a number of seconds.*timeout=60"):
        dpkit.parallel_apply([nn.Identity()], [torch.ones(1)], devices=lanes(1), timeout=timeout)


def test_ctrl_c_reaches_the_caller_at_once_and_leaves_no_thread_that_blocks_exit(release):
    # torch joins its workers without a limit: an interrupt (Ctrl-C, or interrupt_main as
    # here) waits until the stuck replica returns, and its non-daemon thread keeps the
    # process from exiting.
    before = set(threading.enumerate())
    module = StuckOn(release, {1})
    timer = threading.Timer(0.2, _thread.interrupt_main)
    # interrupt_main acts as SIGINT's handler would: under a parent that ignores SIGINT
    # (mutmut's workers) it would do nothing and this test would wait forever.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer.start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            dpkit.parallel_apply([module] * 2, [torch.ones(1)] * 2, devices=lanes(2))
        waited = time.monotonic() - start
        timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert waited < 2.0  # 0.2 s, then one poll of 0.05 s; torch: never (replica 1 never returns)
    stuck = [t for t in set(threading.enumerate()) - before if t is not timer]
    assert stuck, "replica 1 should still be waiting"
    assert all(t.daemon for t in stuck), "a stuck worker must not keep the process alive"


def test_system_exit_in_a_replica_is_re_raised_with_its_code_replica_and_device():
    with pytest.raises(SystemExit) as error:
        dpkit.data_parallel(Raises(SystemExit(3)), torch.ones(8, 1), device_ids=lanes(4))
    assert error.value.code == 3  # sys.exit(3) in a replica still exits with status 3
    assert error.match(r"Caught SystemExit in replica 2 on device virtual:2 \(cpu\)")


def test_keyboard_interrupt_in_a_replica_is_re_raised_as_itself_with_replica_and_device():
    with pytest.raises(KeyboardInterrupt) as error:
        dpkit.data_parallel(Raises(KeyboardInterrupt()), torch.ones(8, 1), device_ids=lanes(4))
    assert error.match(r"Caught KeyboardInterrupt in replica 2 on device virtual:2 \(cpu\)")


def _libgomp() -> ctypes.CDLL | None:
    path = Path(torch.__file__).parent / "lib" / "libgomp.so.1"
    return ctypes.CDLL(str(path)) if path.exists() else None


class RecordsTeamSize(nn.Module):
    """Records the OpenMP team size its thread would use, read from OpenMP itself: asking
    torch.get_num_threads() would make torch set it first, hiding what a matmul gets."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def forward(self, x):
        self.seen.append(_libgomp().omp_get_max_threads())
        return x


@pytest.mark.skipif(_libgomp() is None, reason="torch here does not ship OpenMP (libgomp)")
def test_workers_use_the_callers_intra_op_thread_count():
    # A new thread starts with OpenMP's default team (every core) until torch initialises
    # it; MKL's matmul does not, so without dpkit carrying the count each worker's matmul
    # used every core whatever torch.set_num_threads said (4x the CPU time measured here).
    before = torch.get_num_threads()
    wanted = before + 1  # not what a new thread starts with
    module = RecordsTeamSize()
    try:
        torch.set_num_threads(wanted)
        dpkit.parallel_apply([module] * 3, [torch.ones(1)] * 3, devices=lanes(3))
        torch.set_num_threads(before)
        _libgomp().omp_set_num_threads(wanted)  # in this thread only, as threadpoolctl does
        dpkit.parallel_apply([module] * 3, [torch.ones(1)] * 3, devices=lanes(3))
    finally:
        torch.set_num_threads(before)
    assert module.seen == [wanted] * 6
