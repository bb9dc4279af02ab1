"""More checks the parent decides: nested outputs (tuples, lists, dicts, namedtuples, None).

The surprise first: a container cannot travel as tensors, so the grading process sends a
description of it, one line of text per container (its type's module and name, its keys,
where its tensors and Nones are: ``builtins.tuple(T,builtins.list(T,T))``), as bytes in a
tensor, and the tensors in the order the description names them. The parent builds the
description and the tensors the right answer has, from the sizes and seed it chose, and
compares both. Each function here is one side of a check that
:data:`dpkit.grading.decided.CHECKS` lists.
"""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from dpkit.grading.outputs import ALL_LANES, NOT_TENSORS


def describe(value: Any) -> tuple[str, list[torch.Tensor]]:
    """``value`` as a line of text and its tensors in order (see the module's docstring)."""
    if isinstance(value, torch.Tensor):
        return "T", [value]
    if value is None:
        return "None", []
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    tensors: list[torch.Tensor] = []
    if isinstance(value, Mapping):
        parts = []
        for key, item in value.items():
            text, found = describe(item)
            parts.append(f"{key}:{text}")
            tensors += found
        return f"{kind}{{{','.join(parts)}}}", tensors
    if isinstance(value, (list, tuple)):
        parts = []
        for item in value:
            text, found = describe(item)
            parts.append(text)
            tensors += found
        return f"{kind}({','.join(parts)})", tensors
    return f"object {kind}", []


def pack(values: list[Any], prefix: str = "") -> dict[str, torch.Tensor]:
    """Each of ``values`` described, a line each, with all their tensors (keys ``prefix``
    + "text", "t0", ...: two packs with different prefixes travel together)."""
    lines, tensors = [], []
    for value in values:
        text, found = describe(value)
        lines.append(text)
        tensors += found
    data = torch.tensor(list("\n".join(lines).encode()), dtype=torch.uint8)
    return {f"{prefix}text": data, **{f"{prefix}t{i}": t for i, t in enumerate(tensors)}}


def _unpack(
    values: Mapping[str, torch.Tensor], prefix: str = ""
) -> tuple[list[str], list[torch.Tensor]] | None:
    data = values.get(f"{prefix}text")
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.ndim != 1:
        return None
    tensors = []
    while f"{prefix}t{len(tensors)}" in values:
        tensors.append(values[f"{prefix}t{len(tensors)}"])
    try:
        return bytes(data.tolist()).decode().split("\n"), tensors
    except UnicodeDecodeError:
        return None


def _same(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return len(got) == len(want) and all(
        isinstance(a, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
        for a, b in zip(got, want)
    )


# --------------------------------------------------------------------------------------
# Task 1: scatter of a tuple holding a list, and of an OrderedDict.


def scatter_inputs(rng: random.Random) -> list[int]:
    """The batch's rows (5-16) and its values' seed."""
    return [rng.randint(5, 16), rng.randrange(2**62)]


def scatter_tensors(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2, generator=generator), torch.randn(rows, generator=generator)


def judge_scatter(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    x, y = scatter_tensors(*inputs)
    sent = _unpack(values)
    if sent is None:
        return NOT_TENSORS
    lines, tensors = sent
    xs, ys = x.chunk(ALL_LANES), y.chunk(ALL_LANES)
    nested = [(a, [b, a]) for a, b in zip(xs, ys)]
    mappings = [OrderedDict(a=a, b=b) for a, b in zip(xs, ys)]
    want_lines, want_tensors = (
        [describe(v)[0] for v in nested + mappings],
        [t for v in nested + mappings for t in describe(v)[1]],
    )
    if len(lines) != len(want_lines):
        return f"expected {len(xs)} entries (one per lane) for each input, got another number"
    if lines[: len(xs)] != want_lines[: len(xs)]:
        return (
            f"scatter((x, [y, x]), lanes) gave {lines[0]!r} on lane 0; a tuple input gives a "
            "tuple per device, a list a list"
        )
    if lines[len(xs) :] != want_lines[len(xs) :]:
        kinds = sorted({line.split("{")[0].rsplit(".", 1)[-1] for line in lines[len(xs) :]})
        return (
            f"scatter(OrderedDict(a=x, b=y), lanes) gave {kinds} per device; a mapping stays "
            "the same type, with its keys: build each device's dict with type(inputs)(...)"
        )
    if not _same(tensors, want_tensors):
        return "the pieces are not the rows of each tensor that torch.chunk gives each lane"
    # scatter([x.T], lanes, dim=1), sent as pack(..., prefix=DIM): x's chunks, transposed
    columns = _unpack(values, DIM)
    if columns is None:
        return NOT_TENSORS
    if columns[0] != ["builtins.list(T)"] * len(xs) or not _same(columns[1], [a.t() for a in xs]):
        return (
            "scatter([x.T], lanes, dim=1) did not split x.T along dim 1: pass dim on to "
            "scatter_tensor and to every scatter call made for an element"
        )
    for prefix, line, call in zip(DIMS, DIM_LINES, DIM_CALLS):
        got = _unpack(values, prefix)
        if got is None:
            return NOT_TENSORS
        if len(got[0]) == len(xs) and got[0] != [line] * len(xs):
            return (
                f"{call} gave {got[0][0]!r} on lane 0, expected {line!r}: a container stays "
                "its own type (a plain dict a plain dict: type(inputs)(...))"
            )
        if len(got[0]) != len(xs) or not _same(got[1], [a.t() for a in xs]):
            return (
                f"{call} did not split x.T along dim 1 ({len(got[0])} entries, expected "
                f"{len(xs)}): pass dim on to every scatter call "
                "made for an element, in every branch (tuple, list, dict, namedtuple)"
            )
    return None


DIM = "dim_"  # the prefix of the values test_scatter_containers sends for its dim=1 call
DIMS = ("tdim_", "ddim_")  # and for its dim=1 tuple and plain dict
DIM_LINES = ("builtins.tuple(T)", "builtins.dict{c:T}")
DIM_CALLS = ("scatter((x.T,), lanes, dim=1)", "scatter({'c': x.T}, lanes, dim=1)")


# --------------------------------------------------------------------------------------
# Task 4: gather of dicts holding lists (with a None) and namedtuples (with a scalar).


def gather_inputs(rng: random.Random) -> list:
    """The replicas (2-4), each one's rows (1-3) and the values' seed."""
    return [[rng.randint(1, 3) for _ in range(rng.randint(2, ALL_LANES))], rng.randrange(2**62)]


def replica_outputs(rows: list[int], seed: int, result: Any) -> list[dict]:
    """Each replica's output: ``OrderedDict(out=[(rows, 1), None], extra=result(logits,
    loss))`` (a dict of its own type, which gather keeps), ``result`` the grader's
    namedtuple (the parent uses a stand-in of the same name)."""
    generator = torch.Generator().manual_seed(seed)
    return [
        OrderedDict(
            out=[torch.randn(count, 1, generator=generator), None],
            extra=result(
                torch.randn(1, 3, generator=generator), torch.randn((), generator=generator)
            ),
            pair=(torch.randn(count, 2, generator=generator), None),  # a plain tuple
        )
        for count in rows
    ]


def columns_outputs(rows: list[int], seed: int) -> list[dict]:
    """Each replica's output for a gather along dim 1: a plain dict of a (2, rows) tensor."""
    generator = torch.Generator().manual_seed(seed + 1)
    return [{"w": torch.randn(2, count, generator=generator)} for count in rows]


def judge_gather(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    rows, seed = inputs
    sent = _unpack(values)
    if sent is None:
        return NOT_TENSORS
    lines, tensors = sent
    outputs = replica_outputs(rows, seed, lambda logits, loss: (logits, loss))
    entries = {
        "out": "out:builtins.list(T,None)",
        "extra": "extra:test_task4.Result(T,T)",
        "pair": "pair:builtins.tuple(T,None)",
    }
    kind = "collections.OrderedDict"
    orders = {  # keys in any order, as a set compares
        f"{kind}{{{','.join(entries[key] for key in keys)}}}": keys
        for keys in itertools.permutations(entries)
    }
    plain = len(lines) == 1 and lines[0].startswith("builtins.dict{")
    if plain and lines[0].replace("builtins.dict", kind, 1) in orders:
        return (
            "gathering OrderedDicts gave a plain dict: a dict gathers into a dict of the same "
            "type (type(first)(...)), with the same keys"
        )
    if len(lines) != 1 or lines[0] not in orders:  # keys in either order, as a set compares
        return (
            f"gathering dicts of a list (with a None), a Result namedtuple and a plain tuple "
            f"gave {lines[0]!r}; a dict gathers into a dict with the same keys, a list into a "
            "list, a tuple into a tuple, None into None, and a namedtuple must stay a Result"
        )
    pieces = {
        "out": [torch.cat([o["out"][0] for o in outputs])],
        "extra": [
            torch.cat([o["extra"][0] for o in outputs]),
            torch.stack([o["extra"][1] for o in outputs]),
        ],
        "pair": [torch.cat([o["pair"][0] for o in outputs])],
    }
    want = [tensor for key in orders[lines[0]] for tensor in pieces[key]]
    if not _same(tensors, want):
        return (
            f"the gathered tensors are not the replicas' pieces concatenated (shapes "
            f"{[tuple(t.shape) for t in tensors]}, expected {[tuple(t.shape) for t in want]}): "
            "scalars gather into a vector"
        )
    columns = _unpack(values, DIM)
    if columns is None:
        return NOT_TENSORS
    wide = columns_outputs(rows, seed)
    if columns[0] != ["builtins.dict{w:T}"] or not _same(
        columns[1], [torch.cat([o["w"] for o in wide], 1)]
    ):
        return (
            "gather of dicts along dim=1 did not concatenate their tensors along dim 1: pass dim "
            "on to every gather call made for an element"
        )
    return None
