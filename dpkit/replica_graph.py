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
measures. Walking afterwards costs nothing inside the forward. Each saved tensor is read
as autograd stores it (``SavedTensor.data``), never unpacked, so nothing is recomputed or
copied back. Tensors that saved-tensor hooks packed are skipped: ``torch.utils.checkpoint``
recomputes them rather than keep them, and ``save_on_cpu`` moves them off the device. (On
a torch without ``SavedTensor.data``, each node is probed with ``SavedTensor.register_hooks``
instead: slower, same counts.)

A node reached that was made elsewhere (a module using a global tensor with its own
history) is walked too: nothing in a node says who made it.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

_slot_names_by_type: dict[type, tuple[tuple[str, str], ...]] = {}  # per node type, found once


@dataclass
class ReplicaGraph:
    """What :func:`walk` found behind one replica's outputs."""

    saved_nbytes: int = 0
    first_nodes: list[Any] = field(default_factory=list)  # the outputs' nodes
    last_node: Any = None  # the node its backward runs last


def _data_pointer(tensor: torch.Tensor) -> int:
    """Where ``tensor``'s first element lives; 0 for none (empty, or no single storage)."""
    try:
        return tensor.data_ptr()
    except RuntimeError:  # sparse and other layouts without one storage
        return 0


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _slot_names(node: Any) -> tuple[str, ...]:
    """Attribute names of a node's saved tensors, e.g. ``_raw_saved_self`` (each a
    ``SavedTensor``, or a list of them); found with ``dir`` once per node type."""
    names = _slot_names_by_type.get(type(node))
    if names is None:
        names = tuple(n for n in dir(node) if n.startswith("_raw_saved_"))
        _slot_names_by_type[type(node)] = names
    return names


def _count_saved_by_probing(node: Any, names: tuple[str, ...], count: Any) -> None:
    """Pass each tensor ``node`` saved, without hooks, to ``count``, on a torch without
    ``SavedTensor.data`` (before 2.6 or so), where :func:`walk` cannot read them directly.

    One operator saves all its tensors under the same default hooks, so one slot speaks
    for the node: if hooks can be registered on it (``count`` runs in their pack hook, and
    the tensor is then unpacked through ``_identity`` in backward), the node had none and
    its other slots can be unpacked (``_saved_<name>``); if it has hooks, none can be.
    """

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        count(tensor)
        return tensor  # kept as it is, and handed back by _identity in backward

    probed = False
    for raw_name in names:
        if probed:
            value = getattr(node, "_saved_" + raw_name[len("_raw_saved_") :], None)
            for tensor in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(tensor, torch.Tensor):
                    count(tensor)
            continue
        slot = getattr(node, raw_name, None)
        if slot is None or isinstance(slot, (list, tuple)):
            continue  # a list (cat, stack) is left to another slot's probe
        try:
            slot.register_hooks(pack, _identity)  # calls pack(tensor) right away
        except RuntimeError as error:
            if "None" in str(error):  # nothing saved in this slot: try the next one
                continue
            return  # hooks set already (checkpoint, offloading, or an earlier walk)
        probed = True


def _has_saved_data() -> bool:
    saved_tensor_type = getattr(torch._C._autograd, "SavedTensor", None)
    return all(hasattr(saved_tensor_type, name) for name in ("data", "unpack_hook"))


_READ_SAVED_DATA = _has_saved_data()  # else probe (tests switch it off to check the probe)


def walk(
    outputs: Iterable[torch.Tensor], given: Iterable[torch.Tensor], count_saved: bool = True
) -> ReplicaGraph:
    """Walk the graph from ``outputs`` back to the ``given`` tensors (see the module doc).

    With ``count_saved=False`` only the start and end nodes are found.
    """
    # Runs for every replica of every traced step: written for speed, not for beauty.
    given = list(given)
    visited = {tensor.grad_fn for tensor in given}  # the walk stops there
    visited.add(None)  # and at inputs that need no gradient
    graph = ReplicaGraph()
    graph.first_nodes = [node for node in (t.grad_fn for t in outputs) if node is not None]
    stack = [node for node in graph.first_nodes if node not in visited]
    nodes = []
    lowest = math.inf
    while stack:
        node = stack.pop()
        if node in visited:
            continue
        visited.add(node)
        nodes.append(node)
        number = node._sequence_nr()
        if number < lowest:
            lowest, graph.last_node = number, node
        stack.extend([next_node for next_node, _ in node.next_functions])
    if count_saved:
        graph.saved_nbytes = _saved_nbytes(nodes, given)
    return graph


def _saved_nbytes(nodes: list[Any], given: list[torch.Tensor]) -> int:
    """Bytes of the storages that ``nodes`` saved for backward, each counted once, leaving
    out the storages of the ``given`` tensors and what saved-tensor hooks packed."""
    saved: list[torch.Tensor] = []
    for node in nodes:
        names = _slot_names_by_type.get(type(node))
        if names is None:
            names = _slot_names(node)
        if not _READ_SAVED_DATA:
            _count_saved_by_probing(node, names, saved.append)
            continue
        for name in names:
            slot = getattr(node, name)
            for one in slot if isinstance(slot, (list, tuple)) else (slot,):
                # .data is what autograd stores: the tensor, None once freed or for an
                # empty slot, or what saved-tensor hooks packed (then left out)
                data = one.data
                if data is not None and one.unpack_hook is None:
                    saved.append(data)
    # A storage is a given tensor's when one of them starts inside it (storages never
    # overlap): comparing data pointers needs no storage object per given tensor.
    given_pointers = sorted(map(_data_pointer, given))
    seen: set[int] = set()
    nbytes = 0
    for tensor in saved:
        try:
            storage = tensor.untyped_storage()
        except NotImplementedError:  # sparse and other layouts have no single storage
            continue
        key = storage.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        size = storage.nbytes()
        first_at_or_after = bisect_left(given_pointers, key)
        if (
            first_at_or_after == len(given_pointers)
            or given_pointers[first_at_or_after] >= key + size
        ):
            nbytes += size
    return nbytes


def saved_bytes(outputs: Iterable[torch.Tensor], given: Iterable[torch.Tensor]) -> int:
    """Bytes saved for backward in the graph from ``outputs`` back to the ``given`` tensors."""
    return walk(outputs, given).saved_nbytes
