"""Checks of object identity, decided by the parent: which input object each output is.

The surprise first: "is this the same object" cannot travel between processes, yet it can
be sent as data the parent checks against its own choice: for every place in the output,
the index of the input object that is there (``is``, in the grading process), or -1 for
any other object. The parent chooses how many objects are shared and the rows, so it knows
which index belongs in each place; a type's identity is sent the same way (0: the very
class the grader defined, -1: another). A grading process that lies about these indices
must still have run the student's code to learn the fresh sizes; that is the trust every
parent-decided check has (the harness's word that the values came from the student's
functions).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import torch

from dpkit.grading.outputs import ALL_LANES, seeded_model

NOT_SENT = "the values sent for this check are not the ones asked for"


def index_of(value: object, given: Sequence[object]) -> int:
    """Which of ``given`` ``value`` is (by identity), or -1."""
    return next((index for index, item in enumerate(given) if item is value), -1)


def _matrix(values: Mapping[str, torch.Tensor], name: str) -> torch.Tensor | None:
    tensor = values.get(name)
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int64 or tensor.ndim != 2:
        return None
    return tensor


# --------------------------------------------------------------------------------------
# Task 1: scatter keeps namedtuples and shares the objects that are not tensors.


# Rows that torch.chunk cuts into 2 or 3 chunks over the 4 lanes: the shared objects give
# 4 copies, the batch fewer, so the entries are as many as the batch's chunks (zip's rule).
FEWER_CHUNK_ROWS = [rows for rows in range(1, 17) if 1 < len(torch.empty(rows).chunk(4)) < 4]


def shared_inputs(rng: random.Random) -> list:
    """A batch's rows (2-9, making 2 or 3 chunks over 4 lanes) and columns (1-4), the
    values' seed, a fresh label and 1 to 3 objects shared next to the batch."""
    label = f"{rng.choice(('cat', 'dog', 'owl'))} {rng.randrange(10**6)}"
    rows = rng.choice(FEWER_CHUNK_ROWS)
    return [rows, rng.randint(1, 4), rng.randrange(2**62), label, rng.randint(1, 3)]


def shared_image(rows: int, columns: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, columns, generator=torch.Generator().manual_seed(seed))


def judge_shared(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    rows, columns, seed, _, count = inputs
    chunks = shared_image(rows, columns, seed).chunk(ALL_LANES)
    places = _matrix(values, "places")  # per entry: tuple, Pair, label, each shared object
    if places is None or places.shape[1] != 3 + count:
        return NOT_SENT
    if len(places) != len(chunks):
        fewest = (
            ": keep as many entries as the element with the fewest (zip, not zip_longest)"
            if len(places) > len(chunks)
            else ""
        )
        return (
            f"{rows} rows over {ALL_LANES} lanes make {len(chunks)} chunks, so {len(chunks)} "
            f"entries; got {len(places)}{fewest}"
        )
    for entry, (row, chunk) in enumerate(zip(places.tolist(), chunks)):
        if row[0] != 0:
            return "a tuple must stay a tuple, one per lane"
        if row[1] != 0:
            return "a namedtuple must stay a Pair (type(inputs)(*shares))"
        if row[2] != 0:
            return "a string inside a namedtuple is shared, not split"
        if row[3:] != list(range(1, count + 1)):
            return "objects that are not tensors or containers are shared as-is"
        image = values.get(f"image{entry}")
        if not isinstance(image, torch.Tensor) or image.shape != chunk.shape:
            return f"entry {entry}'s image is not chunk {entry} of the batch"
        if not torch.equal(image, chunk):
            return f"entry {entry}'s image is not chunk {entry} of the batch"
    return None


# --------------------------------------------------------------------------------------
# Task 2: replicate leaves the module's own parameters where they were.


def module_inputs(rng: random.Random) -> list[int]:
    """The seed of the graders' 4-8-2 model."""
    return [rng.randrange(2**62)]


def judge_module_alone(inputs: list, values: Mapping[str, torch.Tensor]) -> str | None:
    (seed,) = inputs
    want = list(seeded_model(seed).parameters())
    same = values.get("same")  # per parameter after replicate: which one it was before
    if not isinstance(same, torch.Tensor) or same.dtype != torch.int64 or same.ndim != 1:
        return NOT_SENT
    if same.tolist() != list(range(len(want))):
        return "the module's parameters changed: swap them in the replicas only"
    kept = values.get("parameter")  # per parameter: still an nn.Parameter (0) or not (-1)
    if not isinstance(kept, torch.Tensor) or kept.tolist() != [0] * len(want):
        return "the module's parameters must stay nn.Parameter: swap them in the replicas only"
    for index, parameter in enumerate(want):
        got = values.get(f"value{index}")
        if not isinstance(got, torch.Tensor) or got.shape != parameter.shape:
            return NOT_SENT
        if not torch.equal(got, parameter.detach()):
            return "the module's parameters changed: swap them in the replicas only"
    return None
