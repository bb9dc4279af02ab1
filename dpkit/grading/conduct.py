"""Task 3's checks of how the code runs, decided by the parent: grad modes and exceptions.

The surprise first: these checks are about what happens inside threads and ``raise``
statements, not about a returned tensor, yet they can still be sent as data the parent
checks against values it chose. The parent picks the grad modes to run under, which
replica fails, with which exception type and a fresh message; the grading process runs the
student's code on them and sends back what it saw: the mode the grader's module observed
(``torch.is_grad_enabled()`` inside its forward), whether the outputs need grad, the index
of the exception type the caller received (in :data:`KINDS`) and its message as bytes, and
object identity as an index (0: the very exception the parent asked to raise; -1: another
object). The parent compares each with what its own choice calls for. A grading process
that lies about these must still have run the student's code to learn the fresh messages
and indices; that is the trust every parent-decided check has (the harness's word that the
values came from the student's functions).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import torch

from dpkit.grading.outputs import ALL_LANES

ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    ZeroDivisionError,
)  # what a replica may raise (never a RuntimeError: a stub's NotImplementedError is one)
KINDS: tuple[type[Exception], ...] = (*ERRORS, RuntimeError)  # what the caller may receive
RETURNED = -2  # the kind sent when the call returned instead of raising
TEXT_LIMIT = 16_000  # bytes of a message or traceback sent back (its end is kept)
NOT_SENT = "the values sent for this check are not the ones asked for"


def kind_of(error: BaseException | None) -> int:
    """``error``'s type as an index in :data:`KINDS` (exact type first, then a subclass);
    -1 for any other type, :data:`RETURNED` for no exception."""
    if error is None:
        return RETURNED
    for index, kind in enumerate(KINDS):
        if type(error) is kind:
            return index
    return next((i for i, kind in enumerate(KINDS) if isinstance(error, kind)), -1)


def text(value: str) -> torch.Tensor:
    """A message as bytes in a tensor (its last :data:`TEXT_LIMIT` bytes)."""
    data = str(value).encode("utf-8", "replace")[-TEXT_LIMIT:]
    return torch.tensor(list(data), dtype=torch.uint8)


def read_text(tensor: torch.Tensor | None) -> str | None:
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.ndim != 1:
        return None
    return bytes(tensor.tolist()).decode("utf-8", "replace")


def flags(values: Sequence[object]) -> torch.Tensor:
    """Booleans as 1/0, and -1 for a value that is not a bool (a module that never ran)."""
    return torch.tensor([int(v) if isinstance(v, bool) else -1 for v in values], dtype=torch.int64)


def _ints(values: Mapping[str, torch.Tensor], name: str, length: int) -> list[int] | None:
    tensor = values.get(name)
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int64:
        return None
    if tensor.ndim != 1 or len(tensor) != length:
        return None
    return tensor.tolist()


def lane_name(lane: int) -> str:
    """How the graders' lane ``lane`` prints (the lanes fixture: virtual lanes on the CPU)."""
    import dpkit

    return str(dpkit.virtual_devices(ALL_LANES, on="cpu")[lane])


def _word(rng: random.Random) -> str:
    return f"{rng.choice(('bad shape', 'boom', 'no such key', 'late'))} {rng.randrange(10**6)}"


def kind_name(kind: int) -> str:
    return KINDS[kind].__name__ if 0 <= kind < len(KINDS) else "another exception type"


# --------------------------------------------------------------------------------------
# Threads: every replica in its own thread, all running at once.


def threads_inputs(rng: random.Random) -> list[int]:
    """How many replicas (5 to 8, more than the lanes) must meet at the grader's barrier."""
    return [rng.randint(ALL_LANES + 1, 2 * ALL_LANES)]


def judge_threads(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    (count,) = inputs
    threads = _ints(values, "threads", count)  # 0: the caller's thread, then 1, 2, ...
    arrivals = _ints(values, "arrivals", count)  # the barrier's numbers, 0 to count - 1
    if threads is None or arrivals is None:
        return NOT_SENT
    if -1 in threads:
        return "parallel_apply did not run every replica"
    if 0 in threads:
        return "a replica ran in the caller's thread: start one thread per replica"
    if sorted(threads) != list(range(1, count + 1)):
        return f"{count} replicas ran in {len(set(threads))} thread(s); use one each"
    if sorted(arrivals) != list(range(count)):
        return (
            "the replicas did not all run at the same time: start every thread before joining any"
        )
    return None


# --------------------------------------------------------------------------------------
# Grad modes: apply_replica under the mode it is given, parallel_apply under the caller's.


def grad_mode_inputs(rng: random.Random) -> list[list[bool]]:
    """The four (caller's mode, mode given) pairs, in a fresh order."""
    pairs = [[outer, given] for outer in (True, False) for given in (True, False)]
    rng.shuffle(pairs)
    return pairs


def judge_grad_mode(pairs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    seen = _ints(values, "seen", len(pairs))
    if seen is None:
        return NOT_SENT
    for (outer, given), got in zip(pairs, seen):
        if got == -1:
            return "apply_replica did not run the module"
        if got != int(given):
            return (
                f"apply_replica(..., grad_enabled={given}, ...) ran the module with grad "
                f"{'enabled' if got else 'disabled'} (the caller's mode was {outer}): call "
                "torch.set_grad_enabled(grad_enabled) in the worker before running the module"
            )
    return None


def carried_inputs(rng: random.Random) -> list:
    """2 to 4 replicas and the caller's modes: both, in a fresh order, and one more."""
    modes = [False, True, rng.random() < 0.5]
    rng.shuffle(modes)
    return [rng.randint(2, ALL_LANES), modes]


def judge_carried(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    count, modes = inputs
    seen = _ints(values, "seen", count * len(modes))
    needs = _ints(values, "requires_grad", count * len(modes))
    probe = _ints(values, "probe", 1)
    if seen is None or needs is None or probe is None:
        return NOT_SENT
    for row, mode in enumerate(modes):
        ran = seen[row * count : (row + 1) * count]
        if -1 in ran:
            return "parallel_apply did not run every replica"
        if any(got != int(mode) for got in ran):
            missing = (  # the value never reached the workers, or they did not apply it
                "pass torch.is_grad_enabled() to the workers"
                if probe[0] == 0
                else "each worker must apply the caller's mode with "
                "torch.set_grad_enabled(grad_enabled) before running its replica"
            )
            where = "under torch.no_grad()" if not mode else "with grad enabled"
            ran_as = "enabled" if not mode else "disabled"
            return f"replicas ran with grad {ran_as} {where}: grad mode is thread-local; {missing}"
        if any(got != int(mode) for got in needs[row * count : (row + 1) * count]):
            return "with grad on, outputs need grad" if mode else "under no_grad, outputs need none"
    return None


# --------------------------------------------------------------------------------------
# Exceptions: stored by apply_replica, raised again by reraise and parallel_apply.


def catches_inputs(rng: random.Random) -> list:
    """The replica's index, the exception type it raises and a fresh message."""
    return [rng.randrange(ALL_LANES), rng.randrange(len(ERRORS)), _word(rng)]


def judge_catches(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    index, kind, message = inputs
    keys = values.get("keys")
    fields = _ints(values, "failure", 3)  # (index, lane of its device, is the exception)
    traceback = read_text(values.get("traceback"))
    if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64 or fields is None:
        return NOT_SENT
    if traceback is None:
        return NOT_SENT
    if keys.tolist() != [index]:
        return f"results should have key {index} only, got {keys.tolist()}"
    if fields[:2] != [index, index]:
        return "record the index and the device"
    if fields[2] != 0:
        return "keep the original exception"
    if message not in traceback or ERRORS[kind].__name__ not in traceback:
        return "store traceback.format_exc() as the traceback text"
    return None


def names_inputs(rng: random.Random) -> list:
    """The failed replica's index and lane, its exception type and message, and a fresh
    word in the worker's traceback text."""
    return [
        rng.randrange(8),
        rng.randrange(ALL_LANES),
        rng.randrange(len(ERRORS)),
        _word(rng),
        f"worker {rng.randrange(10**6)}",
    ]


def judge_names(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    index, lane, kind, _, worker = inputs
    got = _ints(values, "kind", 1)
    message = read_text(values.get("message"))
    if got is None or message is None:
        return NOT_SENT
    if got[0] == RETURNED:
        return f"reraise returned without raising {ERRORS[kind].__name__}: raise a new exception"
    if got[0] != kind:
        return (
            f"reraise raised {kind_name(got[0])}: keep the exception type, {ERRORS[kind].__name__}"
        )
    where = f"in replica {index} on device {lane_name(lane)}"
    if where not in message:
        return f"the message should say '{where}', got {message!r}"
    if worker not in message:
        return "include the worker's traceback in the message"
    return None


def fallback_inputs(rng: random.Random) -> list:
    """The failed replica's index and lane, and the two arguments of the exception type
    that cannot be built from one message."""
    return [rng.randrange(8), rng.randrange(ALL_LANES), rng.randrange(100), _word(rng)]


def judge_fallback(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    index, lane, _, _ = inputs
    got = _ints(values, "kind", 2)  # (the kind raised, its __cause__ is the original: 0)
    message = read_text(values.get("message"))
    if got is None or message is None:
        return NOT_SENT
    if got[0] == RETURNED:
        return "reraise returned instead of raising"
    if got[0] != KINDS.index(RuntimeError):
        return (
            f"reraise raised {kind_name(got[0])} ({message}) for an exception whose type "
            "needs two arguments, losing the replica and the original error: when "
            "type(exception)(message) fails, raise RuntimeError(message) from the original"
        )
    where = f"in replica {index} on device {lane_name(lane)}"
    if where not in message:
        return f"the RuntimeError should say '{where}', got {message}"
    if got[1] != 0:
        return (
            "raise the RuntimeError from the original exception (raise ... from ...), so its "
            "traceback is kept"
        )
    return None


def carried_back_inputs(rng: random.Random) -> list:
    """Two runs: 4 replicas, one failing; 3 or 4 replicas, two failing with different
    types. Each failure: (replica, exception type, fresh message)."""
    kinds = rng.sample(range(len(ERRORS)), 3)
    count = rng.randint(3, ALL_LANES)
    low, high = sorted(rng.sample(range(count), 2))
    return [
        [ALL_LANES, [[rng.randrange(ALL_LANES), kinds[0], _word(rng)]]],
        [count, [[low, kinds[1], _word(rng)], [high, kinds[2], _word(rng)]]],
    ]


def judge_carried_back(runs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    got = _ints(values, "kinds", len(runs))
    if got is None:
        return NOT_SENT
    for number, ((count, failures), kind) in enumerate(zip(runs, got)):
        message = read_text(values.get(f"message{number}"))
        if message is None:
            return NOT_SENT
        index, want, text_ = failures[0]
        name = ERRORS[want].__name__
        if kind == RETURNED:
            return (
                f"parallel_apply on {count} replicas where replica {index} raises {name} "
                "returned without raising: after joining the threads, re-raise the first "
                "failure with reraise"
            )
        if len(failures) > 1 and kind == failures[1][1]:
            return "re-raise the failure of the lowest replica index, whichever finished first"
        if kind != want:
            return f"replica {index} raised {name}, the caller got {kind_name(kind)}"
        if f"in replica {index}" not in message or text_ not in message:
            return (
                f"the error should name replica {index} and keep the original message, "
                f"got {message!r}"
            )
    return None
