"""What the course says torch does, checked by running torch (on the CPU, where it runs):
an upgrade that changes torch's behaviour fails here, not in front of a learner."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch.nn.parallel.scatter_gather import gather as torch_gather


@dataclass
class Output:
    logits: torch.Tensor
    features: torch.Tensor


@dataclass
class IterableOutput(Output):
    def __iter__(self):
        return iter((self.logits, self.features))


def _two_replicas(kind):
    return [kind(torch.ones(2, 2), torch.ones(2, 2)) for _ in range(2)]


def test_torch_gather_of_a_plain_dataclass_says_it_is_not_iterable():
    """Notebook 04: torch's gather_map zips the outputs, so a plain dataclass fails there."""
    with pytest.raises(TypeError, match="'Output' object is not iterable"):
        torch_gather(_two_replicas(Output), "cpu")


def test_torch_gather_of_an_iterable_dataclass_misses_constructor_arguments():
    """Notebook 04 and pytorch/pytorch#41327: an iterable dataclass (a ModelOutput) is
    rebuilt from one iterable, so its constructor misses the other fields."""
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'features'"):
        torch_gather(_two_replicas(IterableOutput), "cpu")


def test_torch_chunk_gives_every_device_an_empty_chunk_for_an_empty_batch():
    """Exercise 1: chunk_sizes(0, 4) == [] on purpose, where torch gives four empty chunks."""
    assert [len(chunk) for chunk in torch.empty(0).chunk(4)] == [0, 0, 0, 0]
