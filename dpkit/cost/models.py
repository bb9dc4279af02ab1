"""The course's models by name, for ``dpkit predict`` and calibration: the demo's MLP and CNN
(:func:`dpkit.demo.build_model`) and a small transformer block, all on 1x28x28 images.

The transformer reads an image as 28 tokens of 28 pixels: an embedding to 64 features, one
``nn.TransformerEncoderLayer`` (4 heads, feed-forward 128, no dropout, so that steps repeat
exactly), a mean over tokens and a linear head to 10 classes. Should ``dpkit.demo`` learn a
``"transformer"`` of its own, that one is used, so that ``dpkit demo`` and ``dpkit predict``
run the same model.
"""

from __future__ import annotations

import torch
from torch import nn

from dpkit import demo

COURSE_MODELS = ("mlp", "cnn", "transformer")


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


def course_model(name: str, seed: int = 0) -> nn.Module:
    """``"mlp"``, ``"cnn"`` or ``"transformer"``, with weights from ``seed``."""
    torch.manual_seed(seed)
    try:
        return demo.build_model(name)
    except ValueError:
        if name == "transformer":
            return TinyTransformer()
        raise ValueError(
            f"model={name!r} is not one of the course's models; use one of "
            f"{', '.join(COURSE_MODELS)}"
        ) from None


def sample_input(rows: int = 1) -> torch.Tensor:
    """``rows`` random MNIST-shaped images, the input every course model takes."""
    return torch.randn(rows, *demo.IMAGE_SHAPE)
