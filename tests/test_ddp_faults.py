"""dpkit.ddp when things go wrong: a rank that raises, a rank that hangs, a rank that dies,
and bad arguments. Every failure names the rank or the argument, and no process outlives it.

The faulty training steps live here, at module level: the rank processes import them by
name (``test_ddp_faults.raise_on_rank_1``), as they would import a learner's module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from processes import alive

from dpkit import ddp
from dpkit.ddp import checks


def raise_on_rank_1(model, inputs, targets, optimizer):
    if dist.get_rank() == 1:
        raise ValueError("rank 1 cannot go on")
    return ddp.training_step(model, inputs, targets, optimizer)


def hang_on_rank_1(model, inputs, targets, optimizer):
    if dist.get_rank() == 1:
        time.sleep(600)  # stuck before its forward: rank 0 waits for it in the all-reduce
    return ddp.training_step(model, inputs, targets, optimizer)


def die_on_rank_1(model, inputs, targets, optimizer):
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer would
    return ddp.training_step(model, inputs, targets, optimizer)


def with_step(step) -> ddp.Workload:
    return dataclasses.replace(ddp.named_workload("mlp"), step=step)


@pytest.fixture
def no_leftovers():
    """Asserts after the test that it left no child process and no multiprocessing child."""
    before = ddp.child_processes()
    yield
    assert ddp.child_processes() == before
    assert multiprocessing.active_children() == []


def test_a_rank_that_raises_stops_every_rank_and_names_itself(no_leftovers):
    started = time.monotonic()
    with pytest.raises(ddp.RankFailed) as caught:
        ddp.run_ddp(with_step(raise_on_rank_1), nproc=2, batch=8, steps=2, timeout=60)
    error = caught.value
    assert error.rank == 1 and error.error_type == "ValueError"
    message = str(error)
    assert message.startswith("rank 1 of 2 raised ValueError: rank 1 cannot go on")
    assert "in step 1" in message and "every rank was stopped" in message
    assert "raise_on_rank_1" in error.remote_traceback  # the rank's own traceback travels
    assert time.monotonic() - started < 45  # not the collective's timeout: the parent acted


def test_a_hung_rank_ends_the_run_at_the_timeout_naming_it(no_leftovers):
    started = time.monotonic()
    with pytest.raises(ddp.RanksTimedOut) as caught:
        ddp.run_ddp(with_step(hang_on_rank_1), nproc=2, batch=8, steps=2, timeout=2)
    error = caught.value
    assert error.behind == 1
    message = str(error)
    assert "no rank moved on for 2 s" in message and "Rank 1 is furthest behind" in message
    assert "rank 1: in step 1, the step's code before forward" in message
    assert "rank 0: in step 1, backward" in message  # waiting in the all-reduce
    assert time.monotonic() - started < 45


@pytest.mark.slow
def test_a_rank_killed_by_a_signal_is_named(no_leftovers):
    with pytest.raises(ddp.RankFailed) as caught:
        ddp.run_ddp(with_step(die_on_rank_1), nproc=2, batch=8, steps=2, timeout=60)
    assert caught.value.rank == 1
    assert "rank 1 of 2 was killed by SIGKILL (in step 1, the step's code before forward)" in (
        str(caught.value)
    )


def start_a_sleep_then_hang_on_rank_1(folder, model, inputs, targets, optimizer):
    """Each rank starts a ``sleep`` it never waits for (as a careless script might) and
    writes its pid; then rank 1 hangs, so the run is in the middle of step 1."""
    path = os.path.join(folder, f"sleep{dist.get_rank()}")
    if not os.path.exists(path):
        sleeper = subprocess.Popen(["sleep", "300"])
        with open(path + ".part", "w") as written:
            written.write(str(sleeper.pid))
        os.rename(path + ".part", path)
    return hang_on_rank_1(model, inputs, targets, optimizer)


@pytest.mark.slow
def test_ranks_and_what_they_started_die_with_their_parent(tmp_path):
    # A notebook kernel or `dpkit ddp` killed mid-run by SIGKILL (no cleanup runs in it)
    # must leave nothing behind: not the ranks, and not what a rank started.
    tests = os.path.dirname(__file__)
    parent = subprocess.Popen(
        [sys.executable, "-c", "import functools; from dpkit import ddp; "
         "import test_ddp_faults as t; "
         f"step = functools.partial(t.start_a_sleep_then_hang_on_rank_1, {str(tmp_path)!r}); "
         "ddp.run_ddp(t.with_step(step), nproc=2, batch=8, timeout=300)"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.path.dirname(tests)])},
    )  # fmt: skip
    try:
        ranks: list[int] = []
        sleeps = [tmp_path / f"sleep{rank}" for rank in (0, 1)]
        deadline = time.monotonic() + 60
        while not all(path.exists() for path in sleeps) and time.monotonic() < deadline:
            time.sleep(0.1)
            # The ranks, forked by the parent's fork server (or spawned where there is none).
            ranks = ddp.child_processes(parent.pid) or ranks
        assert len(ranks) == 2 and all(path.exists() for path in sleeps), "no run started"
        started = ranks + [int(path.read_text()) for path in sleeps]
        assert all(alive(pid) for pid in started)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in started if alive(pid)], f"outlived the parent: {started}"
    finally:
        parent.kill()
        for path in tmp_path.glob("sleep?"):  # a failed run's sleeps: end them here
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(path.read_text()), signal.SIGKILL)


# --------------------------------------------------------------------------------------
# Bad arguments: refused before any process starts


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"nproc": 0}, ValueError, ["nproc must be at least 1"]),
        ({"nproc": 2.0}, TypeError, ["nproc must be an int"]),
        ({"nproc": 10_000}, ValueError, ["nproc=10000", "processes per CPU core", "nproc<="]),
        ({"backend": "mpi"}, ValueError, ["backend='mpi'", "'gloo'"]),
        ({"batch": 10, "nproc": 4}, ValueError, ["batch=10", "nproc=4", "batch=12"]),
        ({"bucket_cap_mb": 0}, ValueError, ["bucket_cap_mb"]),
        # inf failed inside a rank (OverflowError), 1e13 in DDP's C++ constructor
        ({"bucket_cap_mb": float("inf")}, ValueError, ["bucket_cap_mb=inf", "64-bit"]),
        ({"bucket_cap_mb": 1e13}, ValueError, ["bucket_cap_mb=1e+13", "less than"]),
        ({"timeout": float("inf")}, ValueError, ["timeout=inf", "at most 1e+09 s"]),
        ({"steps": 0}, ValueError, ["steps"]),
        ({"timeout": 0}, ValueError, ["timeout"]),
        ({"workload": "resnet"}, ValueError, ["model='resnet'", "transformer"]),
        ({"workload": 3}, TypeError, ["workload must be"]),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, error, words, no_leftovers):
    with pytest.raises(error) as caught:
        ddp.run_ddp(**kwargs)
    for word in words:
        assert word in str(caught.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA GPUs")
def test_nccl_without_a_gpu_says_to_use_gloo(no_leftovers):
    with pytest.raises(ValueError, match="backend='nccl' needs CUDA GPUs.*use backend='gloo'"):
        ddp.run_ddp(backend="nccl")


def test_a_port_in_use_is_refused_naming_it(no_leftovers):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(ValueError, match=f"port={port} is in use.*port=None"):
            ddp.run_ddp(port=port)
    assert checks.check_port(checks.free_port()) > 0


def test_a_function_the_ranks_cannot_import_is_refused_naming_it(no_leftovers):
    def local_step(model, inputs, targets, optimizer):  # defined inside a function
        return ddp.training_step(model, inputs, targets, optimizer)

    with pytest.raises(ValueError, match="workload.step=.*local_step.*define it in a .py file"):
        ddp.run_ddp(with_step(local_step))
    with pytest.raises(ValueError, match="workload.model=.*lambda"):
        ddp.run_ddp(dataclasses.replace(ddp.named_workload("mlp"), model=lambda: None))
    main_function = type(local_step)(local_step.__code__, {"__name__": "__main__"}, "in_main")
    main_function.__module__ = "__main__"  # as a function typed into a notebook
    with pytest.raises(ValueError, match="workload.data=.*__main__ \\(a notebook"):
        ddp.run_ddp(dataclasses.replace(ddp.named_workload("mlp"), data=main_function))
