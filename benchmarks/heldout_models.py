"""Models that ``dpkit.cost.calibrate()`` never sees, for ``benchmarks/cost_accuracy.py``.

Calibration times generic probe layers and the course's MLP, CNN and transformer
(:mod:`dpkit.models`); these differ from all of them in widths, depths and op mix, so
their errors say whether the calibrated numbers are the machine's or the course models':

=====================  =====================================================================
``mlp-256-1024-256``   256 inputs -> 1024 -> 256 -> 10, ReLU (wider matmuls, other shapes)
``deep-cnn``           four 3x3 convolutions (4, 8, 8, 12 channels), two poolings: deeper,
                       narrower than the course CNN
``wide-transformer``   the course transformer at width 128, 8 heads, feed-forward 512
``gru``                a GRU of 64 over the image's 28 rows, its last state -> 10 (torch's
                       CPU GRU: a fused kernel calibration has no samples for)
``ln-gelu-mlp``        784 -> 384 -> 192 -> 10 with LayerNorm and GELU after each hidden layer
``lenet-5x5``          a 5x5 convolution (1 -> 6 channels), then 3x3 ones (6 -> 24 -> 40), two
                       poolings: kernel and widths seen nowhere else, added after the
                       convolutions' vector fill was chosen (benchmarks/conv_rates.py), to
                       check it on layers that choice never saw
=====================  =====================================================================

Each is a module returning ``(batch, 10)`` logits and a one-row sample of its input.
"""

from __future__ import annotations

import torch
from torch import nn

from dpkit.models import CLASSES, sample_input

HELDOUT_MODELS = (
    "mlp-256-1024-256",
    "deep-cnn",
    "wide-transformer",
    "gru",
    "ln-gelu-mlp",
    "lenet-5x5",
)


class TinyTransformer(nn.Module):
    """One transformer encoder block over the 28 rows of a 1x28x28 image."""

    def __init__(self, width: int = 64, heads: int = 4, hidden: int = 128) -> None:
        super().__init__()
        self.embed = nn.Linear(28, width)
        self.block = nn.TransformerEncoderLayer(width, heads, hidden, dropout=0.0, batch_first=True)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(images.flatten(1, 2))  # (batch, 28 rows, 28 pixels) -> width
        return self.head(self.block(tokens).mean(dim=1))


class RowGRU(nn.Module):
    """A GRU reading a 1x28x28 image as 28 steps of 28 pixels; its last state -> 10."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.gru = nn.GRU(28, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        outputs, _ = self.gru(images.flatten(1, 2))
        return self.head(outputs[:, -1])


def heldout_model(name: str, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """The held-out model ``name`` (weights from ``seed``) and a one-row sample input."""
    torch.manual_seed(seed)
    if name == "mlp-256-1024-256":
        module = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256), nn.ReLU(),
                               nn.Linear(256, 10))  # fmt: skip
        return module, torch.randn(1, 256)
    if name == "deep-cnn":
        widths, layers = (1, 4, 8, 8, 12), []
        for index, (cin, cout) in enumerate(zip(widths, widths[1:])):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU()]
            if index % 2:
                layers.append(nn.MaxPool2d(2))
        module = nn.Sequential(*layers, nn.Flatten(), nn.Linear(12 * 7 * 7, 10))
        return module, sample_input()
    if name == "wide-transformer":
        return TinyTransformer(width=128, heads=8, hidden=512), sample_input()
    if name == "gru":
        return RowGRU(), sample_input()
    if name == "ln-gelu-mlp":
        module = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 384), nn.LayerNorm(384), nn.GELU(),
            nn.Linear(384, 192), nn.LayerNorm(192), nn.GELU(), nn.Linear(192, 10),
        )  # fmt: skip
        return module, sample_input()
    if name == "lenet-5x5":
        module = nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 24, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(24, 40, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(40 * 7 * 7, 10),
        )  # fmt: skip
        return module, sample_input()
    raise ValueError(f"{name!r} is not a held-out model; use one of {', '.join(HELDOUT_MODELS)}")
