"""The autograd graph one replica's forward built: what it saves, and where its backward ends.

While tracing, :func:`walk` runs once per replica, after its forward, in the calling
thread. It follows the graph from the replica's outputs back to the tensors the replica
was given (its parameters, buffers and inputs) and finds:

- **activations**: the bytes of the tensors saved for backward on the way. Each storage
  counts once, and the given tensors' storages not at all (they have their own categories).
- **the nodes where its backward starts and ends**: the outputs' nodes, and the node with
  the lowest sequence number. Autograd numbers nodes in the order one thread creates them
  and, among the nodes ready to run on a device, runs the highest number first; a node can
  only wait for nodes made after it, so the lowest-numbered node of a replica runs last.
  (This holds while one thread made the replica's graph, which parallel_apply ensures.)

Why not ``torch.autograd.graph.saved_tensors_hooks`` around each forward: its pack hook is
Python called from inside every operator, and lengthened the ``apply`` times the trace
measures. Walking afterwards costs nothing inside the forward. Each saved tensor is reached
through the per-tensor form of the same hooks (``SavedTensor.register_hooks``: a pack hook
that counts, an unpack hook that returns the tensor as it is), never by unpacking it.
Tensors that already have hooks are skipped: ``torch.utils.checkpoint`` recomputes them
rather than keep them, and ``save_on_cpu`` moves them off the device.

A node reached that was made elsewhere (a module using a global tensor with its own
history) is walked too: nothing in a node says who made it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

_STRIDED = torch.strided
_slot_names_by_type: dict[type, tuple[tuple[str, str], ...]] = {}  # per node type, found once


@dataclass
class ReplicaGraph:
    """What :func:`walk` found behind one replica's outputs."""

    saved_nbytes: int = 0
    first_nodes: list[Any] = field(default_factory=list)  # the outputs' nodes
    last_node: Any = None  # the node its backward runs last


def storage_key(tensor: torch.Tensor) -> int:
    """Identifies a tensor's storage (the tensors compared live on one device)."""
    return tensor.untyped_storage().data_ptr()


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _slot_names(node: Any) -> tuple[tuple[str, str], ...]:
    """``(raw, unpacked)`` attribute names of a node's saved tensors, e.g. ``_raw_saved_self``
    and ``_saved_self``; found with ``dir`` once per node type."""
    names = _slot_names_by_type.get(type(node))
    if names is None:
        prefix = "_raw_saved_"
        found = [n[len(prefix) :] for n in dir(node) if n.startswith(prefix)]
        names = tuple((prefix + name, "_saved_" + name) for name in found)
        _slot_names_by_type[type(node)] = names
    return names


def _count_saved(node: Any, names: tuple[tuple[str, str], ...], count: Any) -> None:
    """Pass each tensor ``node`` saved to ``count``, unpacking none that has hooks.

    One operator saves all its tensors under the same default hooks, so one slot speaks
    for the node: if hooks can be registered on it (``count`` runs as their pack hook), the
    node had none and its other slots can be read; if it has hooks already, none can.
    """
    probed = False
    for raw_name, unpacked_name in names:
        if probed:
            value = getattr(node, unpacked_name, None)
            for tensor in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(tensor, torch.Tensor):
                    count(tensor)
            continue
        slot = getattr(node, raw_name, None)
        if slot is None or isinstance(slot, (list, tuple)):
            continue  # a list (cat, stack) is left to another slot's probe
        try:
            slot.register_hooks(count, _identity)  # calls count(tensor) right away
        except RuntimeError as error:
            if "None" in str(error):  # nothing saved in this slot: try the next one
                continue
            return  # hooks set already (checkpoint, offloading, or an earlier walk)
        probed = True


def walk(
    outputs: Iterable[torch.Tensor], given: Iterable[torch.Tensor], count_saved: bool = True
) -> ReplicaGraph:
    """Walk the graph from ``outputs`` back to the ``given`` tensors (see the module doc).

    With ``count_saved=False`` only the start and end nodes are found.
    """
    given = list(given)
    seen = {storage_key(t) for t in given if t.layout is _STRIDED} if count_saved else set()
    nbytes = 0

    def count(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal nbytes
        if tensor.layout is _STRIDED:  # sparse and other layouts have no single storage
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key not in seen:
                seen.add(key)
                nbytes += storage.nbytes()
        return tensor

    visited = {t.grad_fn for t in given if t.grad_fn is not None}  # the walk stops there
    graph = ReplicaGraph()
    graph.first_nodes = [t.grad_fn for t in outputs if t.grad_fn is not None]
    stack = [node for node in graph.first_nodes if node not in visited]
    lowest = math.inf
    while stack:  # runs for every node of every replica while tracing: kept lean
        node = stack.pop()
        if node in visited:
            continue
        visited.add(node)
        number = node._sequence_nr()
        if number < lowest:
            lowest, graph.last_node = number, node
        if count_saved:
            names = _slot_names_by_type.get(type(node)) or _slot_names(node)
            if names:
                _count_saved(node, names, count)
        for next_node, _ in node.next_functions:
            if next_node is not None:
                stack.append(next_node)
    graph.saved_nbytes = nbytes
    return graph


def saved_bytes(outputs: Iterable[torch.Tensor], given: Iterable[torch.Tensor]) -> int:
    """Bytes saved for backward in the graph from ``outputs`` back to the ``given`` tensors."""
    return walk(outputs, given).saved_nbytes
