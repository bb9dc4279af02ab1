"""The course's models by name, for ``dpkit predict`` and calibration: the demo's MLP, CNN and
transformer (:func:`dpkit.demo.build_model`) on 1x28x28 images. :class:`TinyTransformer` is a
model calibration never sees (``benchmarks/heldout_models.py``).

The course's models are tiny, so on GPUs their steps are all host overhead. ``"wide-mlp"``
(24.2 M parameters, about ResNet-50's 25.6 M, with far fewer FLOPs) is for predictions: it
moves as many gradient bytes as a real vision model, so that links and bandwidth show.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import skip_init

from dpkit import demo

COURSE_MODELS = ("mlp", "cnn", "transformer")  # calibrated and benchmarked on CPU lanes
MODEL_NAMES = (*COURSE_MODELS, "wide-mlp")  # what predictions can take


class TinyTransformer(nn.Module):
    """One transformer encoder block over the 28 rows of a 1x28x28 image."""

    def __init__(self, width: int = 64, heads: int = 4, hidden: int = 128) -> None:
        super().__init__()
        self.embed = nn.Linear(28, width)
        self.block = nn.TransformerEncoderLayer(width, heads, hidden, dropout=0.0, batch_first=True)
        self.head = nn.Linear(width, demo.CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(images.flatten(1, 2))  # (batch, 28 rows, 28 pixels) -> width
        return self.head(self.block(tokens).mean(dim=1))


def wide_mlp() -> nn.Module:
    """784 -> 4096 -> 4096 -> 1024 -> 10 with ReLUs. Its weights are zeros (a random
    initialisation takes a second): a prediction needs its shapes, never its values."""
    widths = (28 * 28, 4096, 4096, 1024, demo.CLASSES)
    layers: list[nn.Module] = [nn.Flatten()]
    for width_in, width_out in zip(widths, widths[1:]):
        layer = skip_init(nn.Linear, width_in, width_out)
        for tensor in (layer.weight, layer.bias):
            nn.init.zeros_(tensor)
        layers += [layer, nn.ReLU()]
    return nn.Sequential(*layers[:-1])  # no ReLU after the last layer


def course_model(name: str, seed: int = 0) -> nn.Module:
    """``"mlp"``, ``"cnn"``, ``"transformer"`` or ``"wide-mlp"``, with weights from ``seed``."""
    if name not in MODEL_NAMES:
        raise ValueError(
            f"model={name!r} is not one of the course's models; use one of {', '.join(MODEL_NAMES)}"
        )
    torch.manual_seed(seed)
    return wide_mlp() if name == "wide-mlp" else demo.build_model(name)


def sample_input(rows: int = 1) -> torch.Tensor:
    """``rows`` random MNIST-shaped images, the input every course model takes."""
    return torch.randn(rows, *demo.IMAGE_SHAPE)
