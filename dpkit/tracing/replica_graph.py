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
Python called from inside every operator, which lengthens the ``apply`` times the trace
measures, and its unpack hook runs again for every saved tensor in backward; counted with
``benchmarks/trace_instructions.py``, a trace built that way cost 10% more instructions
than one that walks the graph. Walking afterwards costs nothing inside the forward.

Each saved tensor is read as autograd stores it (``SavedTensor.data``), never unpacked, so
nothing is recomputed or copied back. Tensors that saved-tensor hooks packed are skipped:
``torch.utils.checkpoint`` recomputes them rather than keep them, and ``save_on_cpu`` moves
them off the device. (On a torch without ``SavedTensor.data``, each node is probed with
``SavedTensor.register_hooks`` instead: slower, same counts.)

A node reached that was made elsewhere (a module using a global tensor with its own
history) is walked too: nothing in a node says who made it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter, methodcaller
from typing import Any

import torch

_slot_names_by_type: dict[type, tuple[str, ...]] = {}  # per node type, found once
_slot_readers: dict[type, Any] = {}  # per node type: reads all its slots in one C call
_sequence_number = methodcaller("_sequence_nr")
_data_and_hook = attrgetter("data", "unpack_hook")
_NOT_MADE = object()
_data_ptr = methodcaller("data_ptr")
_untyped_storage = methodcaller("untyped_storage")


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


def _slot_reader(node: Any) -> Any:
    """A getter of all the ``SavedTensor`` objects a node of this type holds, as a tuple or
    list (None for a type that saves nothing); made once per node type, C-level
    (``attrgetter``) unless the type saves lists of tensors (``cat``, ``stack``)."""
    names = _slot_names(node)
    if not names:
        reader = None
    else:
        get_slots = attrgetter(*names)
        if len(names) == 1:
            only = get_slots

            def get_slots(node: Any) -> tuple[Any]:
                return (only(node),)  # a tuple, as attrgetter gives for several names

        if any(isinstance(slot, (list, tuple)) for slot in get_slots(node)):
            one_per_slot = get_slots

            def get_slots(node: Any) -> list[Any]:
                flat: list[Any] = []
                for slot in one_per_slot(node):
                    flat.extend(slot) if isinstance(slot, (list, tuple)) else flat.append(slot)
                return flat

        reader = get_slots
    _slot_readers[type(node)] = reader
    return reader


def _count_saved_by_probing(node: Any, names: tuple[str, ...], count: Any) -> None:
    """Pass each tensor ``node`` saved, without hooks, to ``count``, on a torch without
    ``SavedTensor.data`` (before 2.6 or so), where :func:`walk` cannot read them directly.

    One operator saves all its tensors under the same saved-tensor hooks, so one saved
    tensor speaks for the node: if hooks can be registered on it (``count`` runs in their
    pack hook, and the tensor is then unpacked through ``_identity`` in backward), the node
    had none and its tensors can be unpacked (``_saved_<name>``) without running anything.
    """

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        count(tensor)
        return tensor  # kept as it is, and handed back by _identity in backward

    for name in names:
        slot = getattr(node, name)
        for one in slot if isinstance(slot, (list, tuple)) else (slot,):
            try:
                one.register_hooks(pack, _identity)  # calls pack(tensor) right away
            except RuntimeError as error:
                if "None" in str(error):  # nothing saved in this slot: try the next one
                    continue
                return  # hooks set already (checkpoint, offloading, or an earlier walk)
            for unpacked_name in (n.replace("_raw_saved_", "_saved_", 1) for n in names):
                value = getattr(node, unpacked_name)
                for tensor in value if isinstance(value, (list, tuple)) else (value,):
                    if isinstance(tensor, torch.Tensor):
                        count(tensor)  # the probed one again: its storage counts once
            return


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
    # Runs for every replica of every traced step: written to run few Python bytecodes
    # per node (C-level getters from operator), not for beauty.
    given = list(given)
    visited = {tensor.grad_fn for tensor in given}  # the walk stops there
    visited.add(None)  # and at inputs that need no gradient
    graph = ReplicaGraph()
    graph.first_nodes = [node for node in (t.grad_fn for t in outputs) if node is not None]
    nodes = [node for node in graph.first_nodes if node not in visited]
    visited.update(nodes)
    for node in nodes:  # grows while it is read: each node is appended once
        for next_node, _ in node.next_functions:
            if next_node not in visited:
                visited.add(next_node)
                nodes.append(next_node)
    if nodes:
        graph.last_node = min(nodes, key=_sequence_number)
    if count_saved:
        graph.saved_nbytes = _saved_nbytes(nodes, given)
    return graph


def _saved_nbytes(nodes: list[Any], given: list[torch.Tensor]) -> int:
    """Bytes of the storages that ``nodes`` saved for backward, each counted once, leaving
    out the storages of the ``given`` tensors and what saved-tensor hooks packed."""
    saved: list[torch.Tensor] = []
    if _READ_SAVED_DATA:
        slots: list[Any] = []
        for node in nodes:
            reader = _slot_readers.get(type(node), _NOT_MADE)
            if reader is _NOT_MADE:
                reader = _slot_reader(node)
            if reader is not None:
                slots.extend(reader(node))
        # .data is what autograd stores: the tensor, None once freed or for an empty slot,
        # or what saved-tensor hooks packed (unpack_hook is then set: left out)
        saved = [
            data
            for data, unpack_hook in map(_data_and_hook, slots)
            if data is not None and unpack_hook is None
        ]
    else:
        for node in nodes:
            _count_saved_by_probing(node, _slot_names(node), saved.append)
    if not saved:
        return 0
    try:
        storages = list(map(_untyped_storage, saved))
    except NotImplementedError:  # a sparse tensor (no single storage) among them: skip it
        storages = [t.untyped_storage() for t in saved if t.layout is torch.strided]
    try:
        given_pointers = sorted(map(_data_ptr, given))
    except RuntimeError:  # a given tensor without storage
        given_pointers = sorted(map(_data_pointer, given))
    # A storage is a given tensor's when one of them starts inside it (storages never
    # overlap): comparing data pointers needs no storage object per given tensor.
    nbytes = 0
    for key, storage in {storage.data_ptr(): storage for storage in storages}.items():
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
