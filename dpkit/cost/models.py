"""The models predictions take by name, for ``dpkit predict``, ``dpkit.ddp.plan`` and
calibration: the course's (:mod:`dpkit.models`, which builds them) with fixed weights.
:class:`TinyTransformer` is a model calibration never sees (``benchmarks/heldout_models.py``).

``"wide-mlp"`` (:func:`dpkit.models.resnet_sized_mlp`, 24.2 M parameters) is for predictions:
the course's models are tiny, so on GPUs their steps are all host overhead, and it moves as
many gradient bytes as a real vision model, so that links and bandwidth show.
"""

from __future__ import annotations

import torch
from torch import nn

from dpkit.models import CLASSES, COURSE_MODELS, PREDICTION_MODELS, build_model, sample_input

MODEL_NAMES = PREDICTION_MODELS
__all__ = ["COURSE_MODELS", "MODEL_NAMES", "TinyTransformer", "course_model", "sample_input"]


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


def course_model(name: str, seed: int = 0) -> nn.Module:
    """``"mlp"``, ``"cnn"``, ``"transformer"`` or ``"wide-mlp"``, with weights from ``seed``."""
    if name not in MODEL_NAMES:
        raise ValueError(
            f"model={name!r} is not one of the course's models; use one of {', '.join(MODEL_NAMES)}"
        )
    return build_model(name, seed)
