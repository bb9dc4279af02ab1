"""The trace's activations against torch's own account of what a forward saves.

dpkit finds a replica's activations by walking its autograd graph after the forward (see
``dpkit/tracing/replica_graph.py`` for why). Here the expected bytes come from the other way torch
offers, ``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves passes
through the pack hook. Each storage counts once; the module's parameters and buffers and
the input count elsewhere. The same chunk run through the plain module under those hooks
must give each lane's recorded activations, for layers that save in different ways.
"""

from __future__ import annotations

import pytest
import torch
from lanes import lanes
from torch import nn

import dpkit


class TinyTransformer(nn.Module):
    """Embedding, one encoder layer (attention, layer norms, GELU, dropout), a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, activation="gelu", batch_first=True)
        self.head = nn.Linear(16, 5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(self.embed(tokens)))


class LastStep(nn.Module):
    """An LSTM whose last time step feeds a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 12, num_layers=2, batch_first=True)
        self.head = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0][:, -1])


def _models() -> dict[str, tuple[nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    return {
        "mlp with dropout": (
            nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.2), nn.Linear(32, 4)),
            torch.randn(10, 8),
        ),
        "conv, batch norm, pooling": (
            nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1),
                nn.BatchNorm2d(8),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Linear(8 * 4 * 4, 5),
            ),  # fmt: skip
            torch.randn(10, 3, 8, 8),
        ),
        "transformer layer": (TinyTransformer(), torch.randint(0, 50, (10, 7))),
        "lstm": (LastStep(), torch.randn(10, 5, 6)),
    }


def _saved_by_hooks(module: nn.Module, chunk: torch.Tensor) -> int:
    """Bytes of the storages autograd saves when ``module`` runs on ``chunk``."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        module(chunk)
    elsewhere = {t.untyped_storage().data_ptr() for t in (*module.parameters(), chunk)}
    elsewhere |= {t.untyped_storage().data_ptr() for t in module.buffers()}
    return sum(nbytes for pointer, nbytes in storages.items() if pointer not in elsewhere)


@pytest.mark.parametrize("name", list(_models()))
def test_each_lanes_activations_are_what_autograd_saved(name):
    model, x = _models()[name]
    devices = lanes(3)
    with dpkit.trace() as tr:
        dpkit.DataParallel(model, device_ids=devices)(x)
    recorded = {r.device: r.nbytes for r in tr.memory if r.category == "activations"}
    chunks = x.chunk(len(devices))
    expected = {d.name: _saved_by_hooks(model, c.clone()) for d, c in zip(devices, chunks)}
    assert all(expected.values())  # every model here saves something
    assert recorded == expected
