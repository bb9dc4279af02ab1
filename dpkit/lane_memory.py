"""Memory a virtual CPU lane reuses: a small caching allocator, like CUDA's.

The surprise first: on the CPU, a fresh allocation of megabytes is memory the system has
not touched yet, and the first write to each 4 KiB page of it stops to fault the page in.
A copy into fresh memory ran at 0.17-0.19x of ``copy_`` into memory written before (medians:
gather at 64 MiB, every collective at 256 MiB), so lanes' copies spent most of their time
on page faults, not on bytes. torch's CUDA caching allocator solves the same problem on a GPU
(``cudaMalloc`` is slow) by keeping freed blocks for the next allocation of the same size;
this module does that for each lane's copies in CPU memory. With it, scatter, broadcast
and gather onto 4 lanes run at 0.78-0.96x of ``copy_`` (medians) for the bytes they copy,
from 16 to 256 MiB (``benchmarks/results/copy_bandwidth.json``).

The rule that keeps it invisible: **a block is handed out again only when no tensor uses it
any more.** The pool holds each block's storage; torch counts the references to a storage,
and every tensor using it holds one: the tensor dpkit handed out, its views, the tensors
autograd saved for backward, a numpy array made from it. A block whose only reference is the
pool's is free. So a tensor handed to a user is never overwritten while it is alive, a
chunk autograd saved is not reused before backward frees it, and each block has exactly the
size asked for, so its storage reports the same bytes a fresh one would (the trace's memory
records read them).

Only tensors whose copy would be a plain ``clone`` into fresh memory take blocks: contiguous,
strided, not a tensor subclass, of at least :data:`MIN_BYTES`, and not while autograd would
record the copy or inference mode is on (those keep torch's own ``clone``). Each lane keeps at
most :data:`MAX_BYTES` in blocks, in use or free. Free blocks go back on their own once no
block has been taken for :data:`IDLE_SECONDS` (a daemon thread, started with the first block
and ended when the pool is empty: an idle process holds neither); :func:`release` gives them
back at once, as ``torch.cuda.empty_cache`` does.

How the pool sees that no tensor uses a block, with public APIs only: torch keeps a
storage's Python object alive for as long as any tensor uses the storage, by holding a
reference to it while C++ holds one (torch's "PyObject preservation"). So ``sys.getrefcount``
of a block's storage is one more while any tensor, view or saved tensor uses it. That is how
torch behaves, not a promise in its documentation, so it is checked once, on import
(:data:`_REFS_WHEN_FREE`): where a tensor on a block does not raise the count, nothing is
pooled and every copy is a fresh allocation, slower but the same values. (The other public
route, blocks of Python memory under ``torch.frombuffer``, gives storages torch cannot
resize: ``chunk.resize_(...)``, which works on torch's own ``clone``, would raise.)
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from dpkit.device import Device

MIN_BYTES = 2**20  # malloc hands smaller ones back from its heap, already touched, as fast
MAX_BYTES = 512 * 2**20  # per lane: blocks in use and free together
IDLE_SECONDS = 2.0  # no block taken for this long: the free blocks go back to the system


def _refs(storage: Any) -> int:
    """Python references to a block's storage: one more while any tensor uses it. Always
    called from a list comprehension over a lane's list (the list and the loop variable
    hold it too), so that every count is taken the same way as the probe's below."""
    return sys.getrefcount(storage)


def _refs_of_a_free_block() -> int | None:
    """What :func:`_refs` says of a block no tensor uses, or None where this torch does not
    show a tensor's use in the count (then no block is known free and nothing is pooled)."""
    blocks = [torch.empty(1, dtype=torch.uint8).untyped_storage()]  # as a lane's list holds
    free = [_refs(block) for block in blocks][0]
    user = torch.empty(0, dtype=torch.uint8).set_(blocks[0])  # a view or a saved tensor alike
    used = [_refs(block) for block in blocks][0]
    del user
    return free if used > free else None


_REFS_WHEN_FREE = _refs_of_a_free_block()

_lock = threading.Lock()
# lane -> its blocks' storages, in use or free; a block's size is its storage's, read when
# needed (a user may resize a tensor on a block, and its storage with it)
_blocks: dict[Device, list[Any]] = {}
_idle = threading.Condition(_lock)  # the releaser waits on it; release() wakes it
_last_take = 0.0  # time.monotonic() of the latest take
_releaser: threading.Thread | None = None


def _forked() -> None:
    global _releaser
    _releaser = None  # the parent's thread is not in the child: its first take starts one
    _lock.release()


# A fork copies _lock as it is: taken for the fork, so that no thread is halfway through the
# pool then (a lock copied while another thread held it would never be released).
os.register_at_fork(before=_lock.acquire, after_in_parent=_lock.release, after_in_child=_forked)


def _free(blocks: list[Any]) -> list[Any]:
    """The blocks of ``blocks`` no tensor uses (none where the count cannot say)."""
    return [block for block in blocks if _refs(block) == _REFS_WHEN_FREE]


def _take(
    device: Device, nbytes: int, dtype: torch.dtype, shape: Any, stride: Any
) -> torch.Tensor | None:
    """A tensor on a free block of exactly ``nbytes`` of ``device``'s (or a new block), or
    None when the lane's pool is full. The tensor is made under the lock: until it holds the
    block, another thread would find the block free too."""
    global _last_take, _releaser
    with _lock:
        _last_take = time.monotonic()
        if _releaser is None:
            _releaser = threading.Thread(
                target=_release_when_idle, name="dpkit-lane-memory", daemon=True
            )
            _releaser.start()  # it waits for the lock, so it finds this block in the pool
        blocks = _blocks.setdefault(device, [])
        block = next((block for block in _free(blocks) if block.nbytes() == nbytes), None)
        if block is None:
            if not _make_room(device, nbytes):
                return None
            block = torch.empty(nbytes, dtype=torch.uint8).untyped_storage()
            blocks.append(block)
        tensor = torch.empty(0, dtype=dtype)
        return tensor.set_(block, 0, shape, stride)  # stride () is contiguous


def _release_when_idle() -> None:
    """The releaser: frees the free blocks once no block was taken for IDLE_SECONDS, until
    the pool holds no block at all (blocks in use keep it waking, once per IDLE_SECONDS)."""
    global _releaser
    with _lock:
        while any(_blocks.values()):
            idle = time.monotonic() - _last_take
            if idle >= IDLE_SECONDS:
                for lane in _blocks:
                    _make_room(lane)
                idle = 0.0
            _idle.wait(IDLE_SECONDS - idle)
        _releaser = None


def _make_room(device: Device, wanted: float = math.inf) -> bool:
    """Drop free blocks of ``device``, oldest first, until ``wanted`` more bytes fit in
    MAX_BYTES (by default all of them), and say whether they fit (the lock is held)."""
    blocks = _blocks.get(device, [])
    held = sum(block.nbytes() for block in blocks)
    for block in _free(blocks):
        if held + wanted <= MAX_BYTES:
            break
        blocks.remove(block)
        held -= block.nbytes()
    return held + wanted <= MAX_BYTES


def _poolable(nbytes: int, device: Device) -> bool:
    return (
        _REFS_WHEN_FREE is not None
        and nbytes >= MIN_BYTES
        and device.device_type == "cpu"
        and not torch.is_inference_mode_enabled()
    )


def empty(
    shape: Sequence[int], dtype: torch.dtype, device: Device, stride: Sequence[int] = ()
) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype)`` in ``device``'s memory (contiguous, or with
    ``stride``, which must cover exactly ``numel`` elements), from the lane's blocks where
    it can be."""
    nbytes = math.prod(shape) * dtype.itemsize
    tensor = _take(device, nbytes, dtype, shape, stride) if _poolable(nbytes, device) else None
    if tensor is None:
        where = dict(dtype=dtype, device=device.torch_device)
        return (
            torch.empty_strided(shape, stride, **where) if stride else torch.empty(shape, **where)
        )
    return tensor


def copy(tensor: torch.Tensor, device: Device) -> torch.Tensor | None:
    """``tensor.clone()`` into a block of ``device``'s, or None where the copy should be
    torch's own ``clone`` (see the module docstring)."""
    if tensor.layout is not torch.strided or tensor.nbytes < MIN_BYTES:
        return None  # most copies of a step (small parameters): the cheap tests first
    if (
        type(tensor) not in (torch.Tensor, torch.nn.Parameter)
        or not tensor.is_contiguous()
        or tensor.is_quantized
        or tensor.is_conj()
        or tensor.is_neg()
        or (tensor.requires_grad and torch.is_grad_enabled())
        or not _poolable(tensor.nbytes, device)
    ):
        return None
    # The same strides as the original, as clone keeps them (a size-1 dim's stride may be
    # anything in a contiguous tensor).
    return empty(tensor.shape, tensor.dtype, device, tensor.stride()).copy_(tensor)


def cached_bytes(device: Device | None = None) -> int:
    """Bytes of blocks the pool holds for ``device`` (every lane: None), in use or free."""
    with _lock:
        lanes = _blocks.values() if device is None else [_blocks.get(device, [])]
        return sum(block.nbytes() for blocks in lanes for block in blocks)


def release(device: Device | None = None) -> None:
    """Give back the free blocks of ``device`` (of every lane: None), as
    ``torch.cuda.empty_cache`` does; blocks in use stay their users'."""
    with _lock:
        for lane in _blocks if device is None else [device]:
            _make_room(lane)
        _idle.notify()  # the releaser ends now if the pool is empty
